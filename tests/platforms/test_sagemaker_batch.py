"""SageMaker Batch Transform: the container side (`serve.py serve` answering real JSON Lines
on /invocations, as Batch Transform sends them with SplitType=Line and
BatchStrategy=MultiRecord) and the transform job that `deploy.py batch` defines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.platforms._helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    Running,
    child_env,
    free_port,
    load_module,
    moto_server,
    running,
)

SERVE = REPO / "platforms" / "sagemaker" / "serve.py"
NAMES = "minilm;reranker"
QUEUE = 128  # the container's queue limit: a mini-batch far larger must still pass
TEXTS = [f"line {i}: " + "batch transform splits files by line " * (i % 4) for i in range(600)]
QUERY = "Which lines are split?"


@pytest.fixture(scope="module")
def models(minilm_path: Path, tiny_reranker_path: Path) -> str:
    return f"{minilm_path};{tiny_reranker_path}"


@pytest.fixture(scope="module")
def reference(models: str) -> dict[str, Any]:
    from ember.engine import SyncEngineArray

    with SyncEngineArray(model_id=models, served_model_name=NAMES, backend="torch") as ref:
        return {
            "embed": ref.embed(TEXTS, model="minilm"),
            "rerank": ref.rerank(QUERY, TEXTS[:3], model="reranker"),
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
            "EMBER_MAX_QUEUE_SIZE": str(QUEUE),
        },
        drop_prefixes=("EMBER_",),
    )
    with running(
        [PYTHON, str(SERVE), "serve"],
        port=port,
        log_path=tmp_path_factory.mktemp("sagemaker-batch") / "serve.log",
        env=env,
        ready_path="/ping",
    ) as server:
        yield server


def _post_lines(endpoint: Running, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{endpoint.url}/invocations",
        content=body,
        headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"},
        timeout=120,
    )


def test_one_output_line_per_input_line_in_order(
    endpoint: Running, reference: dict[str, Any]
) -> None:
    """600 records (strings and objects with ids) in one mini-batch behind a queue of 128:
    each answered on its own line, in order, equal to the engine's vectors."""
    lines = [
        json.dumps({"id": f"doc-{i}", "text": t}) if i % 3 else json.dumps(t)
        for i, t in enumerate(TEXTS)
    ]
    resp = _post_lines(endpoint, ("\n".join(lines) + "\n").encode())
    assert resp.status_code == 200, resp.text[:2000]
    assert resp.headers["content-type"] == "application/jsonlines"
    assert resp.text.endswith("\n")
    out = [json.loads(line) for line in resp.text.splitlines()]
    assert len(out) == len(TEXTS)
    assert [o.get("id") for o in out] == [f"doc-{i}" if i % 3 else None for i in range(600)]
    got = np.asarray([o["embedding"] for o in out], dtype=np.float32)
    assert np.abs(got - reference["embed"]).max() < 1e-5


def test_request_body_lines_are_answered_as_invocations(
    endpoint: Running, reference: dict[str, Any]
) -> None:
    """A line may be a whole body (rerank, OpenAI embeddings): its answer is the line."""
    lines = [
        json.dumps({"query": QUERY, "documents": TEXTS[:3], "model": "reranker"}),
        json.dumps(TEXTS[0]),
        json.dumps({"input": TEXTS[1], "model": "minilm"}),
    ]
    resp = _post_lines(endpoint, "\n".join(lines).encode())  # no final newline: still 3
    assert resp.status_code == 200, resp.text
    rerank, plain, openai = (json.loads(line) for line in resp.text.splitlines())
    scores = {r["index"]: r["relevance_score"] for r in rerank["results"]}
    assert all(abs(scores[i] - reference["rerank"][i]) < 1e-5 for i in range(3))
    assert np.abs(np.asarray(plain["embedding"]) - reference["embed"][0]).max() < 1e-5
    assert openai["object"] == "list"
    assert np.abs(np.asarray(openai["data"][0]["embedding"]) - reference["embed"][1]).max() < 1e-5


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'"fine"\n{broken\n', "line 2 of the JSON Lines body is not JSON"),
        (b'"fine"\n[1, 2]\n', "record 2 is neither one input"),
        (b'{"text": 3}\n', "record 1 is neither one input"),
    ],
)
def test_a_bad_line_fails_the_mini_batch_naming_it(
    endpoint: Running, body: bytes, fragment: str
) -> None:
    resp = _post_lines(endpoint, body)
    assert resp.status_code == 400, resp.text
    assert fragment in resp.json()["error"]["message"]


def test_other_content_types_still_415_and_name_both(endpoint: Running) -> None:
    resp = httpx.post(
        f"{endpoint.url}/invocations",
        content=b"a,b\n",
        headers={"Content-Type": "text/csv"},
        timeout=10,
    )
    assert resp.status_code == 415
    message = resp.json()["error"]["message"]
    assert "application/json" in message and "application/jsonlines" in message


# ------------------------------------------------------------------ deploy.py batch

deploy = load_module(REPO / "platforms" / "sagemaker" / "deploy.py", "ember_sagemaker_deploy")

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/EmberSageMaker"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ember-sagemaker:cuda-test"
ARN = "arn:aws:sagemaker:us-east-1:123456789012:"


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server.url


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """boto3 pointed at moto with throwaway credentials, on a fresh state."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    httpx.post(f"{moto_url}/moto-api/reset").raise_for_status()
    return moto_url


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], clients: Any = None) -> tuple:
    code = deploy.main(argv, clients)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


BATCH = [
    "batch", "--name", "ember-corpus", "--input", "s3://data/corpus/",
    "--output", "s3://data/vectors/", "--poll-seconds", "1", "--wait-timeout", "30",
]  # fmt: skip


def test_batch_with_a_new_model_against_moto(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="artifacts")
    code, result, err = _run(
        capsys,
        [*BATCH, "--image-uri", IMAGE, "--role-arn", ROLE, "--model-dir", str(model_dir),
         "--bucket", "artifacts", "--instance-count", "3", "--max-payload-mb", "20",
         "--invocation-timeout", "1800", "--env", "EMBER_MAX_BATCH_SIZE=64"],
    )  # fmt: skip
    assert code == 0, err
    assert result["status"] == "Completed" and result["model_created"]
    sm = boto3.client("sagemaker", region_name=REGION)
    job = sm.describe_transform_job(TransformJobName=result["transform_job"])
    assert job["ModelName"] == result["model"]
    assert job["BatchStrategy"] == "MultiRecord" and job["MaxPayloadInMB"] == 20
    assert job["MaxConcurrentTransforms"] == 2
    assert job["ModelClientConfig"] == {
        "InvocationsTimeoutInSeconds": 1800,
        "InvocationsMaxRetries": 1,
    }
    assert job["TransformInput"] == {
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/corpus/"}},
        "ContentType": "application/jsonlines",
        "CompressionType": "None",
        "SplitType": "Line",
    }
    assert job["TransformOutput"] == {
        "S3OutputPath": "s3://data/vectors/",
        "Accept": "application/jsonlines",
        "AssembleWith": "Line",
    }
    assert job["TransformResources"] == {"InstanceType": "ml.c5.2xlarge", "InstanceCount": 3}
    # The model was created for the job with the container's settings, then removed.
    assert result["model_deleted"]
    with pytest.raises(sm.exceptions.ClientError):
        sm.describe_model(ModelName=result["model"])


def test_batch_from_a_deployed_endpoint_against_moto(
    aws: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    code, deployed, err = _run(
        capsys,
        ["deploy", "--name", "ember-live", "--image-uri", IMAGE, "--role-arn", ROLE,
         "--instance-type", "ml.m5.xlarge", "--poll-seconds", "1", "--wait-timeout", "30",
         "--no-smoke"],
    )  # fmt: skip
    assert code == 0, err
    code, result, err = _run(capsys, [*BATCH, "--from-endpoint", "ember-live", "--join-input"])
    assert code == 0, err
    assert result["model"] == deployed["model"] and not result["model_created"]
    sm = boto3.client("sagemaker", region_name=REGION)
    job = sm.describe_transform_job(TransformJobName=result["transform_job"])
    assert job["ModelName"] == deployed["model"]
    assert job["DataProcessing"] == {"JoinSource": "Input"}
    # The endpoint's model keeps its own environment; the job's limits come with the job.
    assert job["Environment"] == {
        "EMBER_PAYLOAD_LIMIT": str(6 * 1024 * 1024 + 64 * 1024),
        "EMBER_SAGEMAKER_INVOCATION_TIMEOUT": "600",
    }
    sm.describe_model(ModelName=deployed["model"])  # still there: the endpoint serves it


def _stubbed() -> tuple[Any, Any]:
    import boto3
    from botocore.stub import Stubber

    sm = boto3.client(
        "sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    clients = deploy.Clients(sagemaker=sm, runtime=None, s3=None)
    return clients, Stubber(sm)


def test_gpu_batch_is_refused_without_a_batch_ami(capsys: pytest.CaptureFixture[str]) -> None:
    """Batch Transform's GPU hosts have drivers 470/535; the CUDA 13 image needs R580."""
    clients, stubber = _stubbed()
    with stubber:  # no call may be made: any would fail the stub
        code, _, err = _run(
            capsys,
            [*BATCH, "--image-uri", IMAGE, "--role-arn", ROLE, "--instance-type", "ml.g5.xlarge"],
            clients,
        )
    assert code == 1 and "R580" in err and "al2-ami-sagemaker-batch-gpu-535" in err
    stubber.assert_no_pending_responses()


def test_gpu_batch_with_a_named_ami_is_a_valid_request(capsys: pytest.CaptureFixture[str]) -> None:
    """Stubber checks each request against the real service model: TransformAmiVersion
    and every field deploy.py sends must be what CreateTransformJob accepts."""
    from botocore.stub import ANY

    clients, stubber = _stubbed()
    stubber.add_response("create_model", {"ModelArn": ARN + "model/m"}, {
        "ModelName": ANY, "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {"Image": IMAGE, "Environment": {
            "EMBER_PAYLOAD_LIMIT": str(6 * 1024 * 1024 + 64 * 1024),
            "EMBER_SAGEMAKER_INVOCATION_TIMEOUT": "600", "HF_MODEL_ID": "BAAI/bge-small-en-v1.5",
        }},
    })  # fmt: skip
    stubber.add_response("create_transform_job", {"TransformJobArn": ARN + "transform-job/j"}, {
        "TransformJobName": ANY, "ModelName": ANY, "MaxConcurrentTransforms": 2,
        "MaxPayloadInMB": 6, "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {"InvocationsTimeoutInSeconds": 600, "InvocationsMaxRetries": 1},
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/corpus/"}},
            "ContentType": "application/jsonlines", "CompressionType": "Gzip", "SplitType": "Line",
        },
        "TransformOutput": {"S3OutputPath": "s3://data/vectors/", "Accept": "application/jsonlines",
                            "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1,
                               "TransformAmiVersion": "al2-ami-sagemaker-batch-gpu-535"},
    })  # fmt: skip
    with stubber:
        code, result, err = _run(
            capsys,
            [*BATCH, "--image-uri", IMAGE, "--role-arn", ROLE, "--hf-model-id",
             "BAAI/bge-small-en-v1.5", "--instance-type", "ml.g5.xlarge", "--transform-ami",
             "al2-ami-sagemaker-batch-gpu-535", "--gzip", "--no-wait"],
            clients,
        )  # fmt: skip
    assert code == 0, err
    stubber.assert_no_pending_responses()
    assert result["model_created"] and "status" not in result


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--max-payload-mb", "101"], "--max-payload-mb must be 1-100"),
        (["--invocation-timeout", "7200"], "--invocation-timeout must be 1-3600"),
        (["--output", "vectors/"], "expected an s3://bucket/key URL"),
        ([], "give --from-endpoint, or --image-uri and --role-arn"),
        (["--from-endpoint", "x", "--image-uri", IMAGE], "drop the model flags"),
    ],
)
def test_bad_batch_arguments_fail_before_any_call(
    capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    clients, stubber = _stubbed()
    with stubber:
        code, _, err = _run(capsys, [*BATCH, *extra], clients)
    assert code == 1 and fragment in err, err
