"""SageMaker adapter: deploy.py against a real moto server and botocore's Stubber.

moto 5.2.5 plays S3 + SageMaker + SageMaker Runtime on 127.0.0.1. Its limits shape the
tests: it rejects ml.inf2.* in CreateEndpointConfig (so the moto flow uses ml.m5.xlarge
and the ml.inf2.xlarge default is checked with Stubber, which validates every request
against botocore's real service model), it has no UpdateEndpoint (update is Stubber-only),
endpoints are InService at once, and InvokeEndpoint answers from a queue of canned
results set through moto's /moto-api/static/sagemaker/endpoint-results (or the literal
body "body" when the queue is empty) without calling any container.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from _helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    ServerProcess,
    child_env,
    free_port,
    load_module,
)
from botocore.response import StreamingBody
from botocore.stub import Stubber

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


# --------------------------------------------------------------------------- moto flow


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = ServerProcess(
        [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], child_env(), log
    )
    try:
        server.wait_http(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


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


def test_default_deploy_requests_inf2_with_timeouts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults as the real service model sees them: ml.inf2.xlarge, 900 s timeouts."""
    monkeypatch.setattr(deploy, "stamp", lambda: "20250101000000000")
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
    monkeypatch.setattr(deploy, "stamp", lambda: "20250202000000000")
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
