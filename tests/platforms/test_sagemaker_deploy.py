"""deploy.py's endpoint settings and lifecycle, against moto and the real service model.

What a first real deploy met: a GPU variant on SageMaker's default host (driver 470-550)
cannot run the image's CUDA 13 torch, so GPU variants name the R580 inference AMI; an
``update --no-wait`` left its old model and endpoint config behind for good; there was no
volume size, no autoscaling and no asynchronous inference for bodies over 6 MB. moto
5.2.5 runs S3, SageMaker, SageMaker Runtime (async results from a queue) and
application-autoscaling; what moto does not check (the InferenceAmiVersion enum, the
request shapes) is checked with botocore's Stubber, which validates every request
against the real service model.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from tests.platforms._helpers_runpod_sagemaker import (
    REPO,
    load_module,
    moto_server,
)

deploy = load_module(REPO / "platforms" / "sagemaker" / "deploy.py", "ember_sagemaker_deploy")
variant = deploy.variant

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/EmberSageMaker"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ember-sagemaker:cuda-test"
EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.75]}],
    "model": "all-MiniLM-L6-v2",
    "usage": {"prompt_tokens": 4, "total_tokens": 4},
}
BASE = ["--image-uri", IMAGE, "--role-arn", ROLE, "--poll-seconds", "1", "--wait-timeout", "30"]


# ------------------------------------------------------------------------ pure decisions
@pytest.mark.parametrize(
    ("instance_type", "ami"),
    [
        ("ml.g5.xlarge", variant.GPU_AMI),
        ("ml.g6e.2xlarge", variant.GPU_AMI),
        ("ml.g4dn.xlarge", variant.GPU_AMI),
        ("ml.p4d.24xlarge", variant.GPU_AMI),
        ("ml.inf2.xlarge", None),
        ("ml.m5.xlarge", None),
        ("ml.c6i.large", None),
    ],
)
def test_gpu_instances_get_the_r580_ami(instance_type: str, ami: str | None) -> None:
    assert variant.default_inference_ami(instance_type) == ami


def test_the_gpu_ami_is_one_the_service_model_knows() -> None:
    """The value must be in the API's enum (botocore's model of the live service)."""
    model = boto3.session.Session(region_name=REGION).client("sagemaker").meta.service_model
    members = model.shape_for("ProductionVariant").members
    assert variant.GPU_AMI in members["InferenceAmiVersion"].enum
    assert "580" in members["InferenceAmiVersion"].documentation.split(variant.GPU_AMI)[1][:400]


@pytest.mark.parametrize(
    ("instance_type", "nvme"),
    [
        ("ml.g5.xlarge", True),
        ("ml.g4dn.xlarge", True),
        ("ml.p4d.24xlarge", True),
        ("ml.m5d.large", True),
        ("ml.c6id.xlarge", True),
        ("ml.m5.xlarge", False),
        ("ml.c5.xlarge", False),
        ("ml.inf2.xlarge", False),
        ("ml.p3.2xlarge", False),
    ],
)
def test_volume_size_only_where_there_is_no_local_nvme(instance_type: str, nvme: bool) -> None:
    assert variant.has_instance_storage(instance_type) is nvme


def test_scaling_arguments_are_checked_before_any_call() -> None:
    parse = deploy.scaling.parse
    assert parse(None, None, asynchronous=False) is None
    assert parse("1:4", 600, asynchronous=False) == deploy.scaling.Scaling(1, 4, 600.0)
    assert parse("0:3", None, asynchronous=True) == deploy.scaling.Scaling(0, 3, 5.0)
    for spec, target, asynchronous, fragment in [
        ("0:3", 10, False, "scale to zero"),
        ("4:1", 10, False, "MIN <= MAX"),
        ("1-4", 10, False, "MIN:MAX"),
        ("1:4", None, False, "--scale-target"),
        ("1:4", -1, False, "positive"),
    ]:
        with pytest.raises(deploy.DeployError, match=fragment):
            parse(spec, target, asynchronous=asynchronous)


# ------------------------------------------------------------------------------ Stubber
def _stubbed() -> tuple[Any, Stubber]:
    session = boto3.session.Session(
        aws_access_key_id="x", aws_secret_access_key="x", region_name=REGION
    )
    clients = deploy.Clients(
        sagemaker=session.client("sagemaker", endpoint_url="https://stubbed.invalid"),
        runtime=session.client("sagemaker-runtime", endpoint_url="https://stubbed.invalid"),
        s3=session.client("s3", endpoint_url="https://stubbed.invalid"),
    )
    return clients, Stubber(clients.sagemaker)


def test_gpu_deploy_sends_the_ami_and_volume_to_the_real_api(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ml.g5: the R580 AMI, and no VolumeSizeInGB (local NVMe); ml.p3: AMI and volume."""
    monkeypatch.setattr(deploy.endpoint, "stamp", lambda: "20250101000000000")
    for instance_type, volume in (("ml.g5.xlarge", None), ("ml.p3.2xlarge", 80)):
        clients, sm = _stubbed()
        name = "ember-gpu"
        full = f"{name}-20250101000000000"
        sm.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:m/" + full})
        expected_variant = {
            "VariantName": "AllTraffic",
            "ModelName": full,
            "InstanceType": instance_type,
            "InitialInstanceCount": 1,
            "InitialVariantWeight": 1.0,
            "ContainerStartupHealthCheckTimeoutInSeconds": 900,
            "ModelDataDownloadTimeoutInSeconds": 900,
            "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
        }
        if volume:
            expected_variant["VolumeSizeInGB"] = volume
        sm.add_response(
            "create_endpoint_config",
            {"EndpointConfigArn": "arn:aws:sagemaker:c/" + full},
            {"EndpointConfigName": full, "ProductionVariants": [expected_variant]},
        )
        sm.add_response(
            "create_endpoint",
            {"EndpointArn": "arn:aws:sagemaker:e/" + name},
            {"EndpointName": name, "EndpointConfigName": full},
        )
        argv = ["deploy", "--name", name, *BASE, "--instance-type", instance_type, "--no-wait"]
        if volume:
            argv += ["--volume-size", str(volume)]
        with sm:
            code = deploy.main(argv, clients)
        out, err = capsys.readouterr()
        assert code == 0, err
        sm.assert_no_pending_responses()
        assert json.loads(out)["inference_ami"] == variant.GPU_AMI


def test_volume_size_on_an_nvme_instance_is_refused_locally(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clients, sm = _stubbed()
    argv = ["deploy", "--name", "x", *BASE, "--instance-type", "ml.g5.xlarge"]
    with sm:  # no response queued: any AWS call would fail the test
        assert deploy.main([*argv, "--volume-size", "100"], clients) == 1
        assert "local NVMe" in capsys.readouterr().err
        assert deploy.main([*argv, "--autoscale", "1:2", "--scale-target", "9", "--no-wait"],
                           clients) == 1  # fmt: skip
        assert "drop --no-wait" in capsys.readouterr().err


# --------------------------------------------------------------------------------- moto
@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server.url


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    httpx.post(f"{moto_url}/moto-api/reset").raise_for_status()
    return moto_url


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    code = deploy.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _queue(aws: str, kind: str, bodies: list[dict[str, Any]]) -> None:
    if kind == "async":
        results = [{"data": json.dumps(b)} for b in bodies]
    else:
        results = [{"Body": json.dumps(b), "ContentType": "application/json",
                    "InvokedProductionVariant": "AllTraffic", "CustomAttributes": ""}
                   for b in bodies]  # fmt: skip
    path = "async-endpoint-results" if kind == "async" else "endpoint-results"
    httpx.post(
        f"{aws}/moto-api/static/sagemaker/{path}", json={"region": REGION, "results": results}
    ).raise_for_status()


def _leave_pair(sm: Any, name: str, suffix: str) -> str:
    """A model and endpoint config as deploy.py names them, not used by the endpoint."""
    full = f"{name}-{suffix}"
    sm.create_model(ModelName=full, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": IMAGE})
    sm.create_endpoint_config(
        EndpointConfigName=full,
        ProductionVariants=[variant.production_variant(full, "ml.m5.xlarge", 1, 900, 900)],
    )
    return full


def test_cleanup_removes_what_an_update_left_and_delete_removes_all(
    aws: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pair an ``update --no-wait`` leaves (older than the live config) goes at the next
    cleanup; a newer pair (someone's next update, not yet swapped in) and unrelated names
    stay; ``delete`` removes every pair of the endpoint's name."""
    sm = boto3.client("sagemaker")
    _queue(aws, "sync", [EMBEDDING])
    result = _run(capsys, ["deploy", "--name", "ember-c", *BASE, "--instance-type", "ml.m5.xlarge"])
    live = result["endpoint_config"]
    older = _leave_pair(sm, "ember-c", "20000101000000000")
    newer = _leave_pair(sm, "ember-c", "29990101000000000")
    other = _leave_pair(sm, "ember-c-other", "20000101000000000")

    cleaned = _run(capsys, ["cleanup", "--name", "ember-c", "--poll-seconds", "1"])
    assert cleaned["deleted"] == [older, older]
    configs = {c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]}
    assert configs == {live, newer, other}

    deleted = _run(capsys, ["delete", "--name", "ember-c", "--poll-seconds", "1"])
    assert set(deleted["deleted"]) == {"ember-c", live, result["model"], newer}
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == [
        other
    ]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [other]


def test_autoscaling_is_registered_after_in_service_and_removed_on_delete(
    aws: str, capsys: pytest.CaptureFixture[str]
) -> None:
    aas = boto3.client("application-autoscaling")
    _queue(aws, "sync", [EMBEDDING])
    argv = ["deploy", "--name", "ember-s", *BASE, "--instance-type", "ml.m5.xlarge",
            "--autoscale", "1:4", "--scale-target", "600"]  # fmt: skip
    result = _run(capsys, argv)
    assert result["autoscaling"]["metric"] == "SageMakerVariantInvocationsPerInstance"
    rid = "endpoint/ember-s/variant/AllTraffic"
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (rid, 1, 4)
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert config["TargetValue"] == 600.0
    assert config["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
    }

    _run(capsys, ["delete", "--name", "ember-s", "--poll-seconds", "1"])
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []


def test_async_endpoint_takes_large_bodies_through_s3(
    aws: str, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """AsyncInferenceConfig on the config, the container told its longer limits, the smoke
    test and ``invoke`` through S3 and InvokeEndpointAsync; a body over 6 MB is refused
    before the call on a real-time endpoint instead of failing at SageMaker."""
    s3, sm = boto3.client("s3"), boto3.client("sagemaker")
    aas = boto3.client("application-autoscaling")
    s3.create_bucket(Bucket="ember-async")
    _queue(aws, "async", [EMBEDDING, {"results": [{"index": 0, "relevance_score": 0.5}]}])
    argv = ["deploy", "--name", "ember-a", *BASE, "--instance-type", "ml.m5.xlarge",
            "--async-output", "s3://ember-async/out", "--async-failure", "s3://ember-async/err",
            "--async-max-concurrency", "4", "--autoscale", "0:3"]  # fmt: skip
    result = _run(capsys, argv)
    assert result["asynchronous"] and result["smoke"]["dimensions"] == 3
    assert result["autoscaling"]["metric"] == "ApproximateBacklogSizePerInstance"
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    metric = policy["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]
    assert metric["MetricName"] == "ApproximateBacklogSizePerInstance"
    assert metric["Dimensions"] == [{"Name": "EndpointName", "Value": "ember-a"}]
    config = sm.describe_endpoint_config(EndpointConfigName=result["endpoint_config"])
    assert config["AsyncInferenceConfig"] == {
        "OutputConfig": {"S3OutputPath": "s3://ember-async/out",
                         "S3FailurePath": "s3://ember-async/err"},
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
    }  # fmt: skip
    env = sm.describe_model(ModelName=result["model"])["PrimaryContainer"]["Environment"]
    assert env[variant.INVOCATION_TIMEOUT_ENV] == "900"
    assert int(env["EMBER_PAYLOAD_LIMIT"]) > variant.REALTIME_MAX_PAYLOAD_MB * 1024 * 1024
    inputs = s3.list_objects_v2(Bucket="ember-async", Prefix="out/ember-inputs/")["Contents"]
    assert json.loads(s3.get_object(Bucket="ember-async", Key=inputs[0]["Key"])["Body"].read())

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"query": "q", "documents": ["x" * 1000] * 7000}))
    answer = _run(capsys, ["invoke", "--name", "ember-a", "--body-file", str(big),
                           "--poll-seconds", "1", "--wait-timeout", "30"])  # fmt: skip
    assert answer == {"results": [{"index": 0, "relevance_score": 0.5}]}

    _queue(aws, "sync", [EMBEDDING])
    _run(capsys, ["deploy", "--name", "ember-rt", *BASE, "--instance-type", "ml.m5.xlarge"])
    code = deploy.main(["invoke", "--name", "ember-rt", "--body-file", str(big)])
    assert code == 1 and "6 MB" in capsys.readouterr().err


def test_update_of_an_autoscaled_endpoint_keeps_its_size_and_scaling(
    aws: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Changing the instance type of a scalable target makes UpdateEndpoint fail, so the
    variant is deregistered first and registered again (same range, same target) once
    the new config is InService; the new fleet starts at today's size, not the first
    deploy's. SageMaker through Stubber (moto has no UpdateEndpoint), autoscaling on moto."""
    monkeypatch.setattr(deploy.endpoint, "stamp", lambda: "20250202000000000")
    name, old = "ember-up", "ember-up-20250101000000000"
    new = f"{name}-20250202000000000"
    aas = boto3.client("application-autoscaling")
    deploy.scaling.apply(aas, name, deploy.scaling.Scaling(2, 6, 300.0), asynchronous=False)
    clients, sm = _stubbed()
    clients = deploy.Clients(clients.sagemaker, clients.runtime, clients.s3, aas)
    runtime = Stubber(clients.runtime)
    arn = f"arn:aws:sagemaker:{REGION}:123456789012"
    old_variant = {"VariantName": "AllTraffic", "ModelName": old, "InstanceType": "ml.m5.xlarge",
                   "InitialInstanceCount": 2, "InitialVariantWeight": 1.0}  # fmt: skip

    def described(config: str, count: int) -> dict[str, Any]:
        return {"EndpointName": name, "EndpointArn": f"{arn}:endpoint/{name}",
                "EndpointConfigName": config, "EndpointStatus": "InService",
                "CreationTime": "2025-01-01T00:00:00Z", "LastModifiedTime": "2025-01-01T00:00:00Z",
                "ProductionVariants": [{"VariantName": "AllTraffic",
                                        "CurrentInstanceCount": count}]}  # fmt: skip

    def config_of(config: str) -> dict[str, Any]:
        return {
            "EndpointConfigName": config,
            "EndpointConfigArn": f"{arn}:endpoint-config/x",
            "ProductionVariants": [old_variant],
            "CreationTime": "2025-01-01T00:00:00Z",
        }

    listing = {"NameContains": name, "MaxResults": 100}

    def listed(*names: str) -> dict[str, Any]:
        configs = [
            {"EndpointConfigName": n, "EndpointConfigArn": f"{arn}:x", "CreationTime": "2025-01-01"}
            for n in names
        ]
        return {"EndpointConfigs": configs}

    sm.add_response("describe_endpoint", described(old, 5), {"EndpointName": name})
    sm.add_response("describe_endpoint_config", config_of(old), {"EndpointConfigName": old})
    sm.add_response(
        "describe_model",
        {"ModelName": old, "ModelArn": f"{arn}:model/{old}", "ExecutionRoleArn": ROLE,
         "CreationTime": "2025-01-01T00:00:00Z", "PrimaryContainer": {"Image": IMAGE}},
        {"ModelName": old},
    )  # fmt: skip
    sm.add_response("list_endpoint_configs", listed(old), listing)
    sm.add_response("create_model", {"ModelArn": f"{arn}:model/{new}"})
    new_variant = {**old_variant, "ModelName": new, "InstanceType": "ml.g5.xlarge",
                   "InitialInstanceCount": 5, "InferenceAmiVersion": variant.GPU_AMI,
                   "ContainerStartupHealthCheckTimeoutInSeconds": 900,
                   "ModelDataDownloadTimeoutInSeconds": 900}  # fmt: skip
    sm.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": f"{arn}:endpoint-config/{new}"},
        {"EndpointConfigName": new, "ProductionVariants": [new_variant]},
    )
    sm.add_response(
        "update_endpoint",
        {"EndpointArn": f"{arn}:endpoint/{name}"},
        {"EndpointName": name, "EndpointConfigName": new},
    )
    sm.add_response("describe_endpoint", described(new, 5), {"EndpointName": name})
    raw = json.dumps(EMBEDDING).encode()
    runtime.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(raw), len(raw)), "ContentType": "application/json"},
    )
    sm.add_response("list_endpoint_configs", listed(old, new), listing)
    sm.add_response("describe_endpoint_config", config_of(old), {"EndpointConfigName": old})
    sm.add_response("delete_endpoint_config", {}, {"EndpointConfigName": old})
    sm.add_response("delete_model", {}, {"ModelName": old})

    seen: list[int] = []
    real_update = clients.sagemaker.update_endpoint

    def update_endpoint(**kwargs: Any) -> Any:  # what autoscaling looked like at the call
        seen.append(len(aas.describe_scalable_targets(ServiceNamespace="sagemaker")
                        ["ScalableTargets"]))  # fmt: skip
        return real_update(**kwargs)

    monkeypatch.setattr(clients.sagemaker, "update_endpoint", update_endpoint)
    argv = ["update", "--name", name, "--instance-type", "ml.g5.xlarge", "--poll-seconds", "1"]
    with sm, runtime:
        code = deploy.main(argv, clients)
    out, err = capsys.readouterr()
    assert code == 0, err
    sm.assert_no_pending_responses()
    assert seen == [0]  # deregistered while UpdateEndpoint ran
    result = json.loads(out)
    assert result["autoscaling"]["min"] == 2 and result["autoscaling"]["max"] == 6
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 6)
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 300.0
