"""The BentoML adapter under the real ``bentoml serve``, on 127.0.0.1, on CPU.

The server is started the way a user starts it (``bentoml serve
platforms.bentoml.service:Ember``), configured only through EMBER_* variables, and its
answers are compared with the core's own engines. ``bentoml build`` is run too, into a
private BENTOML_HOME, to check what the Bento would put into the image. Building and
running the container itself needs Docker and a GPU and is not done here.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from packaging.requirements import Requirement

from tests.platforms._helpers_modal_bentoml import BENTOML, REPO, bentoml_serve, child_env

TEXTS = ["BentoML mounts the core app.", "Readiness waits for the warm-up."]
QUERY = "When is the service ready?"
DOCS = ["After every model is loaded and warmed up.", "Paris is in France.", "Never."]


@pytest.fixture(scope="module")
def models_env(minilm_path: Path, tiny_reranker_path: Path) -> dict[str, str]:
    return {
        "EMBER_MODEL_ID": f"{minilm_path};{tiny_reranker_path}",
        "EMBER_SERVED_MODEL_NAME": "minilm;reranker",
        "EMBER_DEVICE": "cpu",
        "EMBER_BENTOML_GPUS": "0",
    }


@pytest.fixture(scope="module")
def reference(models_env: dict[str, str]) -> dict[str, np.ndarray]:
    """What the core itself answers for the same models and inputs."""
    from ember.engine import SyncEngineArray

    with SyncEngineArray(
        model_id=models_env["EMBER_MODEL_ID"],
        served_model_name=models_env["EMBER_SERVED_MODEL_NAME"],
        device="cpu",
    ) as core:
        return {
            "embed": core.embed(TEXTS, model="minilm"),
            "rerank": np.array(core.rerank(QUERY, DOCS, model="reranker")),
        }


@pytest.fixture(scope="module")
def server(
    models_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[object, list[tuple[int, int]]]]:
    """A running `bentoml serve`, plus the (/readyz, /ready, /health) seen while it loaded."""
    home = tmp_path_factory.mktemp("bentoml-home")
    with bentoml_serve(child_env(models_env, home), home / "serve.log") as srv:
        seen: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 240
        while True:
            if srv.process.poll() is not None:
                pytest.fail(f"bentoml serve exited:\n{srv.log()}")
            readyz = httpx.get(srv.url + "/readyz", timeout=10).status_code
            core_ready = httpx.get(srv.url + "/ready", timeout=10).status_code
            core_health = httpx.get(srv.url + "/health", timeout=10).status_code
            seen.append((readyz, core_ready, core_health))
            if readyz == 200:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"/readyz not 200 after 240 s (seen {seen[-5:]}):\n{srv.log()}")
            time.sleep(0.2)
        yield srv, seen


@pytest.mark.slow
def test_readyz_turns_ready_only_after_load_and_warm_up(server: tuple) -> None:
    srv, seen = server
    # Readiness only ever goes from not-ready to ready, and /ready (asked right after
    # /readyz) is the core's own word on whether every model is loaded and warmed:
    # a /readyz 200 followed by a core 503 would mean BentoML routed traffic too early.
    # /health, asked after them, is the same readiness.
    for readyz, core_ready, core_health in seen:
        assert readyz in (200, 503), seen
        if readyz == 200:
            assert core_ready == 200 and core_health == 200, seen
    with srv.client() as client:
        assert client.get("/livez").status_code == 200
        assert client.get("/ready").json()["models"] == ["minilm", "reranker"]


def test_is_ready_is_false_before_the_engines_load() -> None:
    """The hook itself, in-process: nothing is loaded at import, so not ready yet."""
    from platforms.bentoml.service import Ember

    instance = Ember.inner()
    assert instance.__is_ready__() is False
    assert instance.__is_alive__() is True


@pytest.mark.slow
def test_embeddings_match_the_core(server: tuple, reference: dict) -> None:
    srv, _ = server
    with srv.client() as client:
        resp = client.post("/v1/embeddings", json={"input": TEXTS, "model": "minilm"})
        metrics = client.get("/metrics").text
        # BentoML passes the body through as sent: the core sees `modality` and says what
        # this text model serves instead of embedding the URL as text.
        media = client.post(
            "/v1/embeddings",
            json={"input": ["https://x/cat.png"], "model": "minilm", "modality": "image"},
        )
    assert media.status_code == 400 and "image" in media.json()["error"]["message"]
    assert resp.status_code == 200, resp.text
    # One scrape shows BentoML's series and the core's (appended by __metrics__).
    assert "bentoml_" in metrics and 'ember_batch_size_count{model="minilm"}' in metrics
    body = resp.json()
    got = np.array([row["embedding"] for row in body["data"]])
    np.testing.assert_allclose(got, reference["embed"], atol=1e-5)
    assert body["model"] == "minilm" and body["usage"]["prompt_tokens"] > 0


@pytest.mark.slow
def test_rerank_matches_the_core(server: tuple, reference: dict) -> None:
    srv, _ = server
    with srv.client() as client:
        resp = client.post(
            "/v1/rerank",
            json={"query": QUERY, "documents": DOCS, "model": "reranker", "return_documents": True},
        )
        bad = client.post("/v1/rerank", json={"query": QUERY, "model": "reranker"})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    scores = {r["index"]: r["relevance_score"] for r in results}
    np.testing.assert_allclose(
        [scores[i] for i in range(len(DOCS))], reference["rerank"], atol=1e-5
    )
    assert [r["index"] for r in results] == [int(i) for i in np.argsort(-reference["rerank"])]
    # The core's error shape comes through BentoML untouched.
    assert bad.status_code == 422 and bad.json()["error"]["param"] is not None


def test_bento_build_packs_the_pinned_image(tmp_path: Path) -> None:
    """`bentoml build` with the adapter's bentofile: the Dockerfile starts from the pinned
    CUDA tag, installs exactly the bentoml pins, then bakes the weights (a step naming the
    model id alone), all before Ember's source is copied; the API key is nowhere in the
    Bento; the Bento holds the core's source but not tests, benchmarks or virtualenvs."""
    from platforms.bentoml.service import CUDA_IMAGE, constraint_pins

    env = child_env(
        {"EMBER_MODEL_ID": "BAAI/bge-small-en-v1.5", "EMBER_API_KEY": "sekrit-key"}, tmp_path
    )
    done = subprocess.run(
        [str(BENTOML), "build", "-f", "platforms/bentoml/bentofile.yaml", "."],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (bento,) = [
        p for p in (tmp_path / "bentoml" / "bentos" / "ember").iterdir() if p.name != "latest"
    ]
    dockerfile = (bento / "env" / "docker" / "Dockerfile").read_text()
    assert f"FROM {CUDA_IMAGE} AS base-container" in dockerfile
    assert "ENV EMBER_MODEL_ID=$EMBER_MODEL_ID" in dockerfile  # config travels into the image
    leaked = [p for p in bento.rglob("*") if p.is_file() and b"sekrit-key" in p.read_bytes()]
    assert "EMBER_API_KEY" not in dockerfile and leaked == []

    lines = dockerfile.splitlines()

    def first(fragment: str) -> int:
        return next(i for i, line in enumerate(lines) if fragment in line)

    install = first("pip install -r $BENTO_PATH/env/python/requirements.txt")
    bake = first("python ./src/platforms/bake.py")
    copy_all = first("COPY --chown=bentoml:bentoml . ./")
    assert install < bake < copy_all
    assert "python ./src/platforms/bake.py BAAI/bge-small-en-v1.5 ''" in lines[bake]
    assert not [line for line in lines[:copy_all] if "src/core" in line and "COPY" in line]
    assert "ENV PYTHONPATH=$PYTHONPATH" in dockerfile  # the Bento's core/ is importable

    requirements = (bento / "env" / "python" / "requirements.txt").read_text().splitlines()

    # Compared as parsed requirements: BentoML writes a marker as `pin; marker`
    # (the constraints file's `pin ; marker`).
    def parsed(lines: list[str]) -> set[str]:
        return {str(Requirement(line)) for line in lines if line and not line.startswith("#")}

    assert parsed(constraint_pins("bentoml")) <= parsed(requirements)
    files = {
        p.relative_to(bento / "src").as_posix() for p in (bento / "src").rglob("*") if p.is_file()
    }
    assert {
        "core/ember/platform.py",
        "platforms/bentoml/service.py",
        "platforms/bake.py",
        "platforms/constraints.txt",
        "pyproject.toml",
    } <= files
    assert not [f for f in files if f.startswith(("tests/", "benchmarks/", ".venv/"))]
    info = yaml.safe_load((bento / "bento.yaml").read_text())
    config = info["services"][0]["config"]
    assert config["traffic"]["max_concurrency"] == 4 * config["traffic"]["concurrency"]
    assert config["resources"]["gpu"] == 1 and config["workers"] == 1
