"""SageMaker adapter: the ``serve`` entrypoint on a loopback port, and deploy.py.

The entrypoint runs as SageMaker runs it (``serve.py serve``, port from
SAGEMAKER_BIND_TO_PORT) with the CPU torch backend, serving the packaged MiniLM plus the
tiny reranker and classifier the suite builds; every /invocations body shape is compared
with the core computing the same thing in-process.

deploy.py runs against a real moto server for S3 + SageMaker + SageMaker Runtime. moto
5.2.5's limits shape those tests: it rejects ml.inf2.* in CreateEndpointConfig (so the
moto flow uses ml.m5.xlarge and the ml.inf2.xlarge default is checked with botocore's
Stubber, which validates every request against the real service model), it has no
UpdateEndpoint (update is Stubber-only), endpoints are InService at once, and
InvokeEndpoint answers from a queue of canned results set through
/moto-api/static/sagemaker/endpoint-results (or the literal body "body" when the queue is
empty) without calling any container.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from tests.platforms._helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    Running,
    child_env,
    free_port,
    load_module,
    max_abs_diff,
    moto_server,
    running,
)

SERVE = REPO / "platforms" / "sagemaker" / "serve.py"
serve = load_module(SERVE, "ember_sagemaker_serve")

# ------------------------------------------------------------------ serve entrypoint

NAMES = "minilm;reranker;classifier"
TEXTS = ["Inferentia runs compiled graphs.", "A cat sat on the mat."]
QUERY = "Which chip runs compiled graphs?"


@pytest.fixture(scope="module")
def models(minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path) -> str:
    return f"{minilm_path};{tiny_reranker_path};{tiny_classifier_path}"


@pytest.fixture(scope="module")
def reference(models: str) -> dict[str, Any]:
    """What the core itself returns for the same inputs (in-process, same settings; the
    exact path, as the endpoint serves on torch)."""
    from ember.engine import SyncEngineArray

    with SyncEngineArray(
        model_id=models, served_model_name=NAMES, max_batch_tokens=1024, dtype="float32"
    ) as ref:
        return {
            "embed": ref.embed(TEXTS, model="minilm").tolist(),
            "rerank": ref.rerank(QUERY, TEXTS, model="reranker"),
            "classify": ref.classify(TEXTS, model="classifier"),
        }


@pytest.fixture(scope="module")
def endpoint(models: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    port = free_port()
    env = child_env(
        {
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "EMBER_HOST": "127.0.0.1",
            "EMBER_MODEL_ID": models,
            "EMBER_SERVED_MODEL_NAME": NAMES,
            "EMBER_BACKEND": "torch",
            "EMBER_DEVICE": "cpu",
            "EMBER_MAX_BATCH_TOKENS": "1024",
            "EMBER_API_KEY": "must-be-ignored",
        }
    )
    with running(
        [PYTHON, str(SERVE), "serve"],
        port=port,
        log_path=tmp_path_factory.mktemp("sagemaker") / "serve.log",
        env=env,
        ready_path="/ping",
    ) as server:
        yield server


def _invoke(endpoint: Running, body: Any, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(
        f"{endpoint.url}/invocations",
        content=json.dumps(body).encode(),
        headers={"Content-Type": content_type},
        timeout=60,
    )


def test_ping_is_ready_and_no_api_key_is_required(endpoint: Running) -> None:
    ping = httpx.get(f"{endpoint.url}/ping", timeout=10)
    assert ping.status_code == 200
    assert ping.json() == {"status": "ready", "models": NAMES.split(";")}
    assert "EMBER_API_KEY is ignored" in endpoint.log()


def test_openai_embeddings_body(endpoint: Running, reference: dict[str, Any]) -> None:
    resp = _invoke(endpoint, {"input": TEXTS, "model": "minilm"})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["object"] == "list" and out["model"] == "minilm"
    for item, ref in zip(out["data"], reference["embed"], strict=True):
        assert max_abs_diff(item["embedding"], ref) < 1e-5


def test_tei_embed_body(endpoint: Running, reference: dict[str, Any]) -> None:
    resp = _invoke(endpoint, {"inputs": TEXTS})  # several models, no name: the embedder
    assert resp.status_code == 200, resp.text
    vectors = resp.json()
    assert len(vectors) == 2
    for vec, ref in zip(vectors, reference["embed"], strict=True):
        assert max_abs_diff(vec, ref) < 1e-5


def test_cohere_and_tei_rerank_bodies(endpoint: Running, reference: dict[str, Any]) -> None:
    cohere = _invoke(endpoint, {"query": QUERY, "documents": TEXTS})
    assert cohere.status_code == 200, cohere.text
    results = cohere.json()["results"]
    assert sorted(r["index"] for r in results) == [0, 1]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert abs(r["relevance_score"] - reference["rerank"][r["index"]]) < 1e-5

    tei = _invoke(endpoint, {"query": QUERY, "texts": TEXTS})
    assert tei.status_code == 200, tei.text
    for r in tei.json():
        assert abs(r["score"] - reference["rerank"][r["index"]]) < 1e-5


def test_classify_body(endpoint: Running, reference: dict[str, Any]) -> None:
    resp = _invoke(endpoint, {"inputs": TEXTS, "model": "classifier"})
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert len(got) == 2
    for preds, ref in zip(got, reference["classify"], strict=True):
        assert [p["label"] for p in preds] == [r["label"] for r in ref]
        for p, r in zip(preds, ref, strict=True):
            assert abs(p["score"] - r["score"]) < 1e-5


def test_modality_reaches_the_core(endpoint: Running) -> None:
    """/invocations passes the body as sent: `modality` (issue 11) is read by the core,
    which says what this text model serves instead of embedding the URL as text."""
    body = {"input": ["https://example.com/cat.png"], "model": "minilm", "modality": "image"}
    resp = _invoke(endpoint, body)
    assert resp.status_code == 400, resp.text
    assert "image" in resp.json()["error"]["message"]


@pytest.mark.parametrize("content_type", ["text/csv", "application/x-npy", ""])
def test_non_json_content_type_is_415(endpoint: Running, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    resp = httpx.post(
        f"{endpoint.url}/invocations", content=b'{"input": "x"}', headers=headers, timeout=10
    )
    assert resp.status_code == 415
    assert "application/json" in resp.json()["error"]["message"]


def test_json_with_charset_is_accepted(endpoint: Running) -> None:
    resp = _invoke(endpoint, {"input": "x", "model": "minilm"}, "application/json; charset=utf-8")
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"prompt": "x"}', 400, "cannot tell what to do"),
        (b'{"input": [], "model": "minilm"}', 422, "input"),
        (b'{"input": "x", "model": "nope"}', 404, "nope"),
    ],
)
def test_bad_bodies_get_openai_errors(
    endpoint: Running, raw: bytes, status: int, fragment: str
) -> None:
    resp = httpx.post(
        f"{endpoint.url}/invocations",
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == status, resp.text
    assert fragment in resp.json()["error"]["message"]


def test_model_choice_order(tmp_path: Path) -> None:
    """EMBER_MODEL_ID > /opt/ml/model (flat or one folder down; an export) > HF_MODEL_ID."""
    from ember.backends import artifacts

    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.json").write_text("{}")
    nested = tmp_path / "nested"
    (nested / "my-model").mkdir(parents=True)
    (nested / "my-model" / "config.json").write_text("{}")
    neuron = tmp_path / "neuron"
    neuron.mkdir()
    artifacts.write_manifest(neuron, {"backend": "neuron"})  # as `ember export` writes it
    empty = tmp_path / "empty"
    empty.mkdir()
    dir_env = serve.MODEL_DIR_ENV

    assert serve.model_overrides({"EMBER_MODEL_ID": "x", dir_env: str(flat)}) == {}
    assert serve.model_overrides({dir_env: str(flat)}) == {"model_id": str(flat)}
    assert serve.model_overrides({dir_env: str(nested)}) == {"model_id": str(nested / "my-model")}
    assert serve.model_overrides({dir_env: str(neuron)}) == {
        "model_id": str(neuron),
        "backend": "neuron",
    }
    assert serve.model_overrides({dir_env: str(neuron), "EMBER_BACKEND": "torch"}) == {
        "model_id": str(neuron)
    }
    hf = {dir_env: str(empty), "HF_MODEL_ID": "BAAI/bge-small-en-v1.5", "HF_MODEL_REVISION": "v2"}
    assert serve.model_overrides(hf) == {"model_id": "BAAI/bge-small-en-v1.5", "revision": "v2"}
    assert serve.model_overrides({dir_env: str(tmp_path / "missing")}) == {}


async def test_ping_needs_no_key_as_the_adapter_declares_it(minilm_path: Path) -> None:
    """SageMaker's probe carries no Authorization header: /ping is one of the app's open
    paths (declared by the adapter, not the core), the model routes keep the key."""
    settings = serve.load_settings({"EMBER_MODEL_ID": str(minilm_path)})
    app = serve.build_app(settings.model_copy(update={"api_key": "secret"}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sm") as client:
        assert (await client.get("/ping")).status_code == 503  # answered: loading
        resp = await client.post("/v1/embeddings", json={"input": "x"})
        assert resp.status_code == 401


async def test_ping_is_503_until_models_are_loaded(minilm_path: Path) -> None:
    """Before the engines have started (no lifespan has run), /ping must not say 200."""
    settings = serve.load_settings({"EMBER_MODEL_ID": str(minilm_path)})
    assert settings.port == 8080  # SageMaker's port when SAGEMAKER_BIND_TO_PORT is unset
    app = serve.build_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sm") as client:
        ping = await client.get("/ping")
        assert ping.status_code == 503
        assert ping.json()["error"]["type"] == "service_unavailable"
        # /ping is readiness, as the core's /health is; /livez is alive all along
        assert (await client.get("/health")).json() == {"status": "loading"}
        assert (await client.get("/livez")).status_code == 200
        # /invocations is routed, not 404, even while loading
        resp = await client.post("/invocations", content=b"x", headers={"Content-Type": "a/b"})
        assert resp.status_code == 415


def test_ember_answers_before_sagemaker_cuts_the_invocation(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SageMaker cuts a real-time invocation at 60 s: Ember's deadline (the core's default
    is 60 s too) must fall before it, or callers get SageMaker's bare error instead of
    Ember's 504; longer limits (async, Batch Transform) come from deploy.py's variable.
    A real-time body may be 6 MB, over the core's 2 MB default."""
    monkeypatch.setenv("EMBER_MODEL_ID", str(minilm_path))
    monkeypatch.delenv("EMBER_REQUEST_TIMEOUT", raising=False)
    monkeypatch.delenv("EMBER_PAYLOAD_LIMIT", raising=False)
    realtime = serve.load_settings(dict(os.environ))
    assert realtime.request_timeout == 55.0
    assert realtime.payload_limit == 6 * 1024 * 1024
    assert all(spec.request_timeout == 55.0 for spec in realtime.model_specs())

    monkeypatch.setenv("EMBER_REQUEST_TIMEOUT", "300")  # past the cap: lowered
    assert serve.load_settings(dict(os.environ)).request_timeout == 55.0
    monkeypatch.setenv("EMBER_REQUEST_TIMEOUT", "20")  # inside it: kept
    assert serve.load_settings(dict(os.environ)).request_timeout == 20.0

    monkeypatch.delenv("EMBER_REQUEST_TIMEOUT")
    monkeypatch.setenv(serve.INVOCATION_TIMEOUT_ENV, "900")  # async endpoint
    monkeypatch.setenv("EMBER_PAYLOAD_LIMIT", str(100 * 2**20))
    asynchronous = serve.load_settings(dict(os.environ))
    assert asynchronous.request_timeout == 895.0
    assert asynchronous.payload_limit == 100 * 2**20


def test_serve_requires_the_serve_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(["train"]) == 2
    assert "serve" in capsys.readouterr().err


def test_failed_model_load_exits_instead_of_pinging_503(tmp_path: Path) -> None:
    """A broken /opt/ml/model must end the container (SageMaker fails fast), not hang."""
    model_dir = tmp_path / "opt-ml-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{this is not json")
    port = free_port()
    env = child_env(
        {
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "EMBER_HOST": "127.0.0.1",
            serve.MODEL_DIR_ENV: str(model_dir),
            "EMBER_BACKEND": "torch",
        }
    )
    env.pop("EMBER_MODEL_ID", None)
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.run(
            [PYTHON, str(SERVE), "serve"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=180,
        )
    text = log_path.read_text()
    assert proc.returncode == 1, text
    assert "model loading failed" in text and str(model_dir) in text


# ------------------------------------------------------------------------ deploy.py

deploy = load_module(REPO / "platforms" / "sagemaker" / "deploy.py", "ember_sagemaker_deploy")

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/EmberSageMaker"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ember-sagemaker:neuron-test"
CANNED_EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.75]}],
    "model": "all-MiniLM-L6-v2",
    "usage": {"prompt_tokens": 4, "total_tokens": 4},
}


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server.url


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 at moto (AWS_ENDPOINT_URL) with throwaway credentials; fresh state."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    httpx.post(f"{moto_url}/moto-api/reset").raise_for_status()
    return moto_url


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "exported-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 3}))
    (model / "tokenizer.json").write_text("{}")
    return model


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, Any, str]:
    code = deploy.main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_deploy_then_delete_against_moto(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    sm = boto3.client("sagemaker", region_name=REGION)
    s3.create_bucket(Bucket="ember-artifacts")
    httpx.post(
        f"{aws}/moto-api/static/sagemaker/endpoint-results",
        json={
            "region": REGION,
            "results": [
                {
                    "Body": json.dumps(CANNED_EMBEDDING),
                    "ContentType": "application/json",
                    "InvokedProductionVariant": "AllTraffic",
                    "CustomAttributes": "",
                }
            ],
        },
    ).raise_for_status()

    code, result, err = _run(
        capsys,
        [
            "deploy",
            "--name", "ember-test",
            "--image-uri", IMAGE,
            "--role-arn", ROLE,
            "--model-dir", str(_model_dir(tmp_path)),
            "--bucket", "ember-artifacts",
            "--prefix", "models/",
            "--instance-type", "ml.m5.xlarge",
            "--health-check-timeout", "1200",
            "--download-timeout", "600",
            "--env", "EMBER_MAX_BATCH_SIZE=8",
            "--poll-seconds", "1",
            "--wait-timeout", "30",
        ],
    )  # fmt: skip
    assert code == 0, err
    assert result["status"] == "InService"
    assert result["smoke"] == {"keys": ["data", "model", "object", "usage"], "items": 1,
                               "dimensions": 3}  # fmt: skip

    # The artifact: uploaded under prefix/<model name>/, contents at the archive root.
    url = result["model_data"]
    assert url == f"s3://ember-artifacts/models/{result['model']}/model.tar.gz"
    blob = s3.get_object(Bucket="ember-artifacts", Key=url.split("/", 3)[3])["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["config.json", "tokenizer.json"]

    model = sm.describe_model(ModelName=result["model"])
    assert model["ExecutionRoleArn"] == ROLE
    assert model["PrimaryContainer"]["Image"] == IMAGE
    assert model["PrimaryContainer"]["ModelDataUrl"] == url
    assert model["PrimaryContainer"]["Environment"] == {"EMBER_MAX_BATCH_SIZE": "8"}

    config = sm.describe_endpoint_config(EndpointConfigName=result["endpoint_config"])
    (variant,) = config["ProductionVariants"]
    assert variant["ModelName"] == result["model"]
    assert variant["InstanceType"] == "ml.m5.xlarge"
    assert variant["InitialInstanceCount"] == 1
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1200
    assert variant["ModelDataDownloadTimeoutInSeconds"] == 600

    endpoint = sm.describe_endpoint(EndpointName="ember-test")
    assert endpoint["EndpointStatus"] == "InService"
    assert endpoint["EndpointConfigName"] == result["endpoint_config"]

    code, deleted, err = _run(
        capsys, ["delete", "--name", "ember-test", "--poll-seconds", "1", "--delete-artifact"]
    )
    assert code == 0, err
    assert set(deleted["deleted"]) == {"ember-test", result["model"], result["endpoint_config"]}
    assert sm.list_endpoints()["Endpoints"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_models()["Models"] == []
    assert s3.list_objects_v2(Bucket="ember-artifacts").get("KeyCount", 0) == 0


def test_deploy_fails_when_smoke_answer_is_not_json(
    aws: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no canned result queued, moto answers the literal body 'body': not our API."""
    code, _, err = _run(
        capsys,
        [
            "deploy",
            "--name", "ember-bad",
            "--image-uri", IMAGE,
            "--role-arn", ROLE,
            "--hf-model-id", "sentence-transformers/all-MiniLM-L6-v2",
            "--instance-type", "ml.c5.xlarge",
            "--poll-seconds", "1",
        ],
    )  # fmt: skip
    assert code == 1
    assert "non-JSON" in err and "ember-bad" in err
    model_name = boto3.client("sagemaker").list_models()["Models"][0]["ModelName"]
    env = boto3.client("sagemaker").describe_model(ModelName=model_name)["PrimaryContainer"]
    assert env["Environment"] == {"HF_MODEL_ID": "sentence-transformers/all-MiniLM-L6-v2"}
    assert "ModelDataUrl" not in env


def test_deploy_rejects_bad_inputs_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No AWS endpoint is configured here: these must fail locally, with the reason."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    base = ["deploy", "--image-uri", IMAGE, "--role-arn", ROLE]
    clients = _stubbed_clients()
    with clients.stubbers():
        assert deploy.main([*base, "--name", "bad_name!"], clients.clients) == 1
        assert "invalid --name" in capsys.readouterr().err
        argv = [*base, "--name", "ok", "--model-dir", str(empty), "--bucket", "b"]
        assert deploy.main(argv, clients.clients) == 1
        assert "no config.json" in capsys.readouterr().err
        assert deploy.main([*base, "--name", "ok", "--env", "NOEQUALS"], clients.clients) == 1
        assert "KEY=VALUE" in capsys.readouterr().err


# --------------------------------------------------------------------- Stubber checks


class _Stubbed:
    """Real botocore clients (real service models, no network) wrapped in Stubbers."""

    def __init__(self) -> None:
        session = boto3.session.Session(
            aws_access_key_id="x", aws_secret_access_key="x", region_name=REGION
        )
        self.clients = deploy.Clients(
            sagemaker=session.client("sagemaker", endpoint_url="https://stubbed.invalid"),
            runtime=session.client("sagemaker-runtime", endpoint_url="https://stubbed.invalid"),
            s3=session.client("s3", endpoint_url="https://stubbed.invalid"),
        )
        self.sm = Stubber(self.clients.sagemaker)
        self.rt = Stubber(self.clients.runtime)

    def stubbers(self) -> _Both:
        return _Both(self.sm, self.rt)


class _Both:
    def __init__(self, *stubs: Stubber) -> None:
        self.stubs = stubs

    def __enter__(self) -> None:
        for stub in self.stubs:
            stub.activate()

    def __exit__(self, *exc: object) -> None:
        for stub in self.stubs:
            stub.deactivate()


def _stubbed_clients() -> _Stubbed:
    return _Stubbed()


def _json_body(payload: dict[str, Any]) -> StreamingBody:
    raw = json.dumps(payload).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


def _expect_smoke(rt: Stubber, endpoint: str) -> None:
    rt.add_response(
        "invoke_endpoint",
        {"Body": _json_body(CANNED_EMBEDDING), "ContentType": "application/json"},
        {
            "EndpointName": endpoint,
            "ContentType": "application/json",
            "Accept": "application/json",
            "Body": json.dumps(deploy.DEFAULT_SMOKE_BODY).encode(),
        },
    )


def _in_service(sm: Stubber, endpoint: str, config: str) -> None:
    sm.add_response(
        "describe_endpoint",
        {
            "EndpointName": endpoint,
            "EndpointArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint/{endpoint}",
            "EndpointConfigName": config,
            "EndpointStatus": "InService",
            "CreationTime": "2025-01-01T00:00:00Z",
            "LastModifiedTime": "2025-01-01T00:00:00Z",
        },
        {"EndpointName": endpoint},
    )


def _listed_config(name: str) -> dict[str, str]:
    return {
        "EndpointConfigName": name,
        "EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint-config/{name}",
        "CreationTime": "2025-01-01T00:00:00Z",
    }


def test_default_deploy_requests_inf2_with_timeouts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults as the real service model sees them: ml.inf2.xlarge, 900 s timeouts."""
    monkeypatch.setattr(deploy.endpoint, "stamp", lambda: "20250101000000000")
    stubbed = _stubbed_clients()
    name = "ember-inf2"
    suffixed = f"{name}-20250101000000000"
    data_url = "s3://ember-artifacts/ember/minilm-neuron/model.tar.gz"
    stubbed.sm.add_response(
        "create_model",
        {"ModelArn": f"arn:aws:sagemaker:{REGION}:123456789012:model/{suffixed}"},
        {
            "ModelName": suffixed,
            "ExecutionRoleArn": ROLE,
            "PrimaryContainer": {
                "Image": IMAGE,
                "Environment": {"EMBER_MAX_BATCH_SIZE": "16"},
                "ModelDataUrl": data_url,
            },
        },
    )
    stubbed.sm.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint-config/x"},
        {
            "EndpointConfigName": suffixed,
            "ProductionVariants": [
                {
                    "VariantName": "AllTraffic",
                    "ModelName": suffixed,
                    "InstanceType": "ml.inf2.xlarge",
                    "InitialInstanceCount": 1,
                    "InitialVariantWeight": 1.0,
                    "ContainerStartupHealthCheckTimeoutInSeconds": 900,
                    "ModelDataDownloadTimeoutInSeconds": 900,
                }
            ],
        },
    )
    stubbed.sm.add_response(
        "create_endpoint",
        {"EndpointArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint/{name}"},
        {"EndpointName": name, "EndpointConfigName": suffixed},
    )
    _in_service(stubbed.sm, name, suffixed)
    _expect_smoke(stubbed.rt, name)
    argv = [
        "deploy", "--name", name, "--image-uri", IMAGE, "--role-arn", ROLE,
        "--model-data", data_url, "--env", "EMBER_MAX_BATCH_SIZE=16", "--poll-seconds", "1",
    ]  # fmt: skip
    with stubbed.stubbers():
        code = deploy.main(argv, stubbed.clients)
    out, err = capsys.readouterr()
    assert code == 0, err
    stubbed.sm.assert_no_pending_responses()
    stubbed.rt.assert_no_pending_responses()
    assert json.loads(out)["instance_type"] == "ml.inf2.xlarge"


def test_update_rolls_to_new_config_and_removes_the_old(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """update keeps live settings it is not told to change, swaps, then deletes the old pair."""
    monkeypatch.setattr(deploy.endpoint, "stamp", lambda: "20250202000000000")
    stubbed = _stubbed_clients()
    sm = stubbed.sm
    name, old = "ember-inf2", "ember-inf2-20250101000000000"
    new = f"{name}-20250202000000000"
    data_url = "s3://ember-artifacts/ember/old/model.tar.gz"
    old_variant = {
        "VariantName": "AllTraffic",
        "ModelName": old,
        "InstanceType": "ml.inf2.xlarge",
        "InitialInstanceCount": 2,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": 1200,
        "ModelDataDownloadTimeoutInSeconds": 600,
    }
    _in_service(sm, name, old)
    sm.add_response(
        "describe_endpoint_config",
        {
            "EndpointConfigName": old,
            "EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint-config/{old}",
            "ProductionVariants": [old_variant],
            "CreationTime": "2025-01-01T00:00:00Z",
        },
        {"EndpointConfigName": old},
    )
    sm.add_response(
        "describe_model",
        {
            "ModelName": old,
            "ModelArn": f"arn:aws:sagemaker:{REGION}:123456789012:model/{old}",
            "ExecutionRoleArn": ROLE,
            "CreationTime": "2025-01-01T00:00:00Z",
            "PrimaryContainer": {
                "Image": IMAGE,
                "ModelDataUrl": data_url,
                "Environment": {"EMBER_MAX_BATCH_SIZE": "16"},
            },
        },
        {"ModelName": old},
    )
    listed = {"EndpointConfigs": [_listed_config(old)]}
    listing = {"NameContains": name, "MaxResults": 100}
    sm.add_response("list_endpoint_configs", listed, listing)  # nothing older to clean
    new_image = IMAGE.replace("neuron-test", "neuron-v2")
    sm.add_response(
        "create_model",
        {"ModelArn": f"arn:aws:sagemaker:{REGION}:123456789012:model/{new}"},
        {
            "ModelName": new,
            "ExecutionRoleArn": ROLE,
            "PrimaryContainer": {
                "Image": new_image,
                "ModelDataUrl": data_url,
                "Environment": {"EMBER_MAX_BATCH_SIZE": "16", "EMBER_LOG_LEVEL": "debug"},
            },
        },
    )
    sm.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint-config/{new}"},
        {"EndpointConfigName": new, "ProductionVariants": [{**old_variant, "ModelName": new}]},
    )
    sm.add_response(
        "update_endpoint",
        {"EndpointArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint/{name}"},
        {"EndpointName": name, "EndpointConfigName": new},
    )
    _in_service(sm, name, new)
    _expect_smoke(stubbed.rt, name)
    both = {"EndpointConfigs": [_listed_config(old), _listed_config(new)]}
    sm.add_response("list_endpoint_configs", both, listing)
    sm.add_response(
        "describe_endpoint_config",
        {
            "EndpointConfigName": old,
            "EndpointConfigArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint-config/{old}",
            "ProductionVariants": [old_variant],
            "CreationTime": "2025-01-01T00:00:00Z",
        },
        {"EndpointConfigName": old},
    )
    sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": old})
    sm.add_response("delete_model", {}, {"ModelName": old})
    argv = [
        "update", "--name", name, "--image-uri", new_image,
        "--env", "EMBER_LOG_LEVEL=debug", "--poll-seconds", "1",
    ]  # fmt: skip
    with stubbed.stubbers():
        code = deploy.main(argv, stubbed.clients)
    out, err = capsys.readouterr()
    assert code == 0, err
    sm.assert_no_pending_responses()
    result = json.loads(out)
    assert result["replaced_endpoint_config"] == old
    assert result["endpoint_config"] == new
    assert result["deleted"] == [old, old]  # the old config, then the model it named
