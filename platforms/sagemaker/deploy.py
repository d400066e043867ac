"""Deploy Ember to a SageMaker real-time endpoint (Inferentia2 by default) with boto3.

    python platforms/sagemaker/deploy.py deploy --name ember-minilm \\
        --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/ember-sagemaker:neuron \\
        --role-arn arn:aws:iam::123456789012:role/SageMakerExecution \\
        --model-dir ./minilm-neuron --bucket my-artifacts
    python platforms/sagemaker/deploy.py update --name ember-minilm --image-uri ...:new-tag
    python platforms/sagemaker/deploy.py invoke --name ember-minilm --body '{"input": "hi"}'
    python platforms/sagemaker/deploy.py delete --name ember-minilm

Why a script and not the SageMaker Python SDK: the whole flow is six boto3 calls, and
spelling them out keeps every parameter that matters for Inferentia visible (the health
check and model download timeouts must cover Neuron model loading, which takes minutes).

Model and endpoint config names carry a UTC timestamp so ``update`` can create the next
pair beside the live one; SageMaker then swaps the endpoint over without downtime and
the old pair is deleted afterwards. ``delete`` finds everything through the endpoint, so
no local state file is kept. boto3 honours ``AWS_ENDPOINT_URL``, which is how the tests
point this script at a local moto server.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, WaiterError

DEFAULT_INSTANCE_TYPE = "ml.inf2.xlarge"
# Neuron runtimes load compiled graphs onto the NeuronCores at start; with a cold
# image pull and a multi-GB artifact that exceeds SageMaker's short defaults.
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 900
DEFAULT_DOWNLOAD_TIMEOUT_S = 900
DEFAULT_VARIANT = "AllTraffic"
DEFAULT_SMOKE_BODY = {"input": ["Ember smoke test"]}
# SageMaker resource names: 63 characters of [a-zA-Z0-9-]; we append "-<17-digit stamp>".
_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
_MAX_NAME = 63 - 18


class DeployError(RuntimeError):
    """A deployment step failed; the message says which and what to do next."""


@dataclass(frozen=True)
class Clients:
    """The three AWS clients the flow uses; injectable so tests can stub them."""

    sagemaker: Any
    runtime: Any
    s3: Any

    @classmethod
    def create(cls, region: str | None) -> Clients:
        session = boto3.session.Session(region_name=region)
        return cls(
            sagemaker=session.client("sagemaker"),
            runtime=session.client("sagemaker-runtime"),
            s3=session.client("s3"),
        )


def _log(message: str) -> None:
    """Progress goes to stderr so stdout stays one machine-readable JSON summary."""
    print(f"[ember-sagemaker] {message}", file=sys.stderr, flush=True)


def stamp() -> str:
    """UTC time to the millisecond: unique enough for names created by one operator."""
    now = time.time()
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"


def check_name(name: str) -> str:
    """Fail before any AWS call rather than after an upload if the name is unusable."""
    if not _NAME_RE.match(name) or len(name) > _MAX_NAME:
        raise DeployError(
            f"invalid --name {name!r}: use letters, digits and '-', at most {_MAX_NAME} characters"
        )
    return name


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` flags to the container's environment (EMBER_* configures the core)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DeployError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def package_model(model_dir: Path, out_dir: Path) -> Path:
    """Write model.tar.gz with the directory's *contents* at the archive root.

    SageMaker extracts the archive into /opt/ml/model, where the serve entrypoint looks
    for config.json; a nested top-level folder would hide it.
    """
    if not model_dir.is_dir():
        raise DeployError(f"--model-dir {model_dir} is not a directory")
    if not (model_dir / "config.json").is_file():
        raise DeployError(
            f"--model-dir {model_dir} has no config.json; pass a Hugging Face model directory "
            "or the output of `ember export`"
        )
    archive = out_dir / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(model_dir.iterdir()):
            tar.add(child, arcname=child.name)
    return archive


def upload_artifact(s3: Any, archive: Path, bucket: str, key: str) -> str:
    """Upload with boto3's managed transfer (multipart for multi-GB Neuron artifacts)."""
    try:
        s3.upload_file(str(archive), bucket, key)
    except (ClientError, S3UploadFailedError) as exc:
        raise DeployError(f"uploading {archive} to s3://{bucket}/{key} failed: {exc}") from exc
    return f"s3://{bucket}/{key}"


def container_definition(
    image_uri: str, model_data_url: str | None, env: dict[str, str]
) -> dict[str, Any]:
    """The PrimaryContainer: image, optional artifact (-> /opt/ml/model), environment."""
    container: dict[str, Any] = {"Image": image_uri, "Environment": dict(env)}
    if model_data_url:
        container["ModelDataUrl"] = model_data_url
    return container


def production_variant(
    model_name: str,
    instance_type: str,
    instance_count: int,
    health_check_timeout: int,
    download_timeout: int,
) -> dict[str, Any]:
    """One variant taking all traffic, with timeouts sized for Neuron start-up."""
    return {
        "VariantName": DEFAULT_VARIANT,
        "ModelName": model_name,
        "InstanceType": instance_type,
        "InitialInstanceCount": instance_count,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": health_check_timeout,
        "ModelDataDownloadTimeoutInSeconds": download_timeout,
    }


def create_model_and_config(
    sm: Any,
    *,
    base_name: str,
    suffix: str,
    role_arn: str,
    container: dict[str, Any],
    variant_args: dict[str, Any],
) -> tuple[str, str]:
    """Create the model and its endpoint config under ``<name>-<suffix>``."""
    model_name = f"{base_name}-{suffix}"
    config_name = f"{base_name}-{suffix}"
    _log(f"create_model {model_name} (image {container['Image']})")
    sm.create_model(ModelName=model_name, ExecutionRoleArn=role_arn, PrimaryContainer=container)
    _log(f"create_endpoint_config {config_name} ({variant_args['instance_type']})")
    sm.create_endpoint_config(
        EndpointConfigName=config_name,
        ProductionVariants=[production_variant(model_name, **variant_args)],
    )
    return model_name, config_name


def wait_in_service(sm: Any, endpoint: str, timeout_s: int, poll_s: int) -> None:
    """Block until InService; on failure surface SageMaker's FailureReason."""
    attempts = max(1, timeout_s // max(1, poll_s))
    _log(f"waiting for {endpoint} to be InService (up to {timeout_s}s)")
    try:
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint, WaiterConfig={"Delay": poll_s, "MaxAttempts": attempts}
        )
    except WaiterError as exc:
        reason = ""
        try:
            desc = sm.describe_endpoint(EndpointName=endpoint)
            reason = f" status={desc.get('EndpointStatus')} reason={desc.get('FailureReason')}"
        except ClientError:
            pass
        raise DeployError(
            f"endpoint {endpoint} did not reach InService:{reason or ' ' + str(exc)}. "
            "Check CloudWatch logs /aws/sagemaker/Endpoints/" + endpoint
        ) from exc


def invoke(runtime: Any, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST one JSON body to /invocations through the runtime API and parse the answer."""
    resp = runtime.invoke_endpoint(
        EndpointName=endpoint,
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps(body).encode(),
    )
    raw = resp["Body"].read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise DeployError(
            f"endpoint {endpoint} answered with non-JSON ({resp.get('ContentType')}): {raw[:200]!r}"
        ) from exc


def smoke_check(runtime: Any, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """One real request after InService: /ping only proves the container started."""
    out = invoke(runtime, endpoint, body)
    if not isinstance(out, dict) or "error" in out:
        raise DeployError(f"smoke invocation of {endpoint} failed: {json.dumps(out)[:500]}")
    if "data" in out and not out["data"]:
        raise DeployError(f"smoke invocation of {endpoint} returned no data: {out}")
    summary: dict[str, Any] = {"keys": sorted(out)}
    data = out.get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict) and "embedding" in data[0]:
        summary.update(items=len(data), dimensions=len(data[0]["embedding"]))
    _log(f"smoke invocation ok: {summary}")
    return summary


def _variant_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "instance_type": args.instance_type,
        "instance_count": args.instance_count,
        "health_check_timeout": args.health_check_timeout,
        "download_timeout": args.download_timeout,
    }


def _model_data(args: argparse.Namespace, clients: Clients, suffix: str) -> str | None:
    """The S3 URL for /opt/ml/model: packaged+uploaded, given, or none (HF_MODEL_ID)."""
    if args.model_data:
        return args.model_data
    if not args.model_dir:
        return None
    if not args.bucket:
        raise DeployError("--model-dir needs --bucket (where model.tar.gz is uploaded)")
    key = "/".join(
        p for p in (args.prefix.strip("/"), f"{args.name}-{suffix}", "model.tar.gz") if p
    )
    with tempfile.TemporaryDirectory() as tmp:
        archive = package_model(Path(args.model_dir), Path(tmp))
        _log(f"uploading {archive.stat().st_size} bytes to s3://{args.bucket}/{key}")
        return upload_artifact(clients.s3, archive, args.bucket, key)


def cmd_deploy(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Package + upload, create model, endpoint config and endpoint, wait, smoke-invoke."""
    name = check_name(args.name)
    env = parse_env(args.env)
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    if not (args.model_dir or args.model_data or args.hf_model_id):
        _log(
            "no --model-dir/--model-data/--hf-model-id: the image's default model is served "
            "(Dockerfile.cuda: the packaged all-MiniLM-L6-v2; the Neuron image has none)"
        )
    suffix = stamp()
    model_data = _model_data(args, clients, suffix)
    model_name, config_name = create_model_and_config(
        clients.sagemaker,
        base_name=name,
        suffix=suffix,
        role_arn=args.role_arn,
        container=container_definition(args.image_uri, model_data, env),
        variant_args=_variant_args(args),
    )
    _log(f"create_endpoint {name}")
    clients.sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=config_name)
    result: dict[str, Any] = {
        "endpoint": name,
        "model": model_name,
        "endpoint_config": config_name,
        "model_data": model_data,
        "instance_type": args.instance_type,
    }
    if args.no_wait:
        return result
    wait_in_service(clients.sagemaker, name, args.wait_timeout, args.poll_seconds)
    result["status"] = "InService"
    if not args.no_smoke:
        result["smoke"] = smoke_check(clients.runtime, name, json.loads(args.smoke_body))
    return result


def _current(sm: Any, endpoint: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The endpoint's live config name, that config, and the models it uses."""
    try:
        config_name = sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
    except ClientError as exc:
        raise DeployError(f"endpoint {endpoint} not found: {exc}") from exc
    config = sm.describe_endpoint_config(EndpointConfigName=config_name)
    models = [sm.describe_model(ModelName=v["ModelName"]) for v in config["ProductionVariants"]]
    return config_name, config, models


def cmd_update(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Roll the endpoint to a new model/config; unspecified settings keep their live values."""
    name = check_name(args.name)
    sm = clients.sagemaker
    old_config_name, old_config, old_models = _current(sm, name)
    old_variant = old_config["ProductionVariants"][0]
    old_container = old_models[0]["PrimaryContainer"]
    suffix = stamp()
    env = dict(old_container.get("Environment", {}))
    env.update(parse_env(args.env))
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    model_data = _model_data(args, clients, suffix) or old_container.get("ModelDataUrl")
    args.instance_type = args.instance_type or old_variant["InstanceType"]
    args.instance_count = args.instance_count or old_variant["InitialInstanceCount"]
    args.health_check_timeout = args.health_check_timeout or old_variant.get(
        "ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_HEALTH_CHECK_TIMEOUT_S
    )
    args.download_timeout = args.download_timeout or old_variant.get(
        "ModelDataDownloadTimeoutInSeconds", DEFAULT_DOWNLOAD_TIMEOUT_S
    )
    model_name, config_name = create_model_and_config(
        sm,
        base_name=name,
        suffix=suffix,
        role_arn=args.role_arn or old_models[0]["ExecutionRoleArn"],
        container=container_definition(args.image_uri or old_container["Image"], model_data, env),
        variant_args=_variant_args(args),
    )
    _log(f"update_endpoint {name}: {old_config_name} -> {config_name}")
    sm.update_endpoint(EndpointName=name, EndpointConfigName=config_name)
    result: dict[str, Any] = {
        "endpoint": name,
        "model": model_name,
        "endpoint_config": config_name,
        "model_data": model_data,
        "instance_type": args.instance_type,
        "replaced_endpoint_config": old_config_name,
    }
    if args.no_wait:
        return result
    wait_in_service(sm, name, args.wait_timeout, args.poll_seconds)
    result["status"] = "InService"
    if not args.no_smoke:
        result["smoke"] = smoke_check(clients.runtime, name, json.loads(args.smoke_body))
    # Only once the new config serves: SageMaker keeps the old one until the swap is done.
    _delete_config_and_models(sm, old_config_name, old_config)
    return result


def _delete_config_and_models(sm: Any, config_name: str, config: dict[str, Any]) -> list[str]:
    deleted = []
    sm.delete_endpoint_config(EndpointConfigName=config_name)
    deleted.append(config_name)
    for variant in config["ProductionVariants"]:
        sm.delete_model(ModelName=variant["ModelName"])
        deleted.append(variant["ModelName"])
    _log(f"deleted {', '.join(deleted)}")
    return deleted


def cmd_delete(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Delete the endpoint, then its config and models (and the artifact if asked)."""
    name = check_name(args.name)
    sm = clients.sagemaker
    config_name, config, models = _current(sm, name)
    _log(f"delete_endpoint {name}")
    sm.delete_endpoint(EndpointName=name)
    if not args.no_wait:
        sm.get_waiter("endpoint_deleted").wait(
            EndpointName=name,
            WaiterConfig={"Delay": args.poll_seconds, "MaxAttempts": 60},
        )
    deleted = _delete_config_and_models(sm, config_name, config)
    artifacts = []
    if args.delete_artifact:
        for model in models:
            url = model["PrimaryContainer"].get("ModelDataUrl")
            if url and url.startswith("s3://"):
                bucket, _, key = url[len("s3://") :].partition("/")
                clients.s3.delete_object(Bucket=bucket, Key=key)
                artifacts.append(url)
    return {"endpoint": name, "deleted": [name, *deleted], "deleted_artifacts": artifacts}


def cmd_invoke(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Send one body; the answer is printed as-is (handy after deploy or update)."""
    return invoke(clients.runtime, check_name(args.name), json.loads(args.body))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy.py", description="Deploy Ember to a SageMaker real-time endpoint."
    )
    parser.add_argument("--region", default=None, help="AWS region (default: from AWS config)")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", required=True, help="endpoint name; prefixes model/config")
        p.add_argument("--poll-seconds", type=int, default=30)
        p.add_argument("--wait-timeout", type=int, default=3600, help="seconds to wait")
        p.add_argument("--no-wait", action="store_true")

    def model_source(p: argparse.ArgumentParser, *, update: bool) -> None:
        p.add_argument("--image-uri", required=not update, help="ECR URI of the built image")
        p.add_argument("--role-arn", required=not update, help="SageMaker execution role")
        p.add_argument("--model-dir", help="HF model dir or `ember export` output to upload")
        p.add_argument("--model-data", help="existing s3://.../model.tar.gz to reuse")
        p.add_argument("--hf-model-id", help="Hub id downloaded at start (needs egress)")
        p.add_argument("--bucket", help="S3 bucket for model.tar.gz")
        p.add_argument("--prefix", default="ember", help="S3 key prefix")
        p.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
        p.add_argument("--instance-type", default=None if update else DEFAULT_INSTANCE_TYPE)
        p.add_argument("--instance-count", type=int, default=None if update else 1)
        p.add_argument(
            "--health-check-timeout",
            type=int,
            default=None if update else DEFAULT_HEALTH_CHECK_TIMEOUT_S,
            help="ContainerStartupHealthCheckTimeoutInSeconds",
        )
        p.add_argument(
            "--download-timeout",
            type=int,
            default=None if update else DEFAULT_DOWNLOAD_TIMEOUT_S,
            help="ModelDataDownloadTimeoutInSeconds",
        )
        p.add_argument("--smoke-body", default=json.dumps(DEFAULT_SMOKE_BODY))
        p.add_argument("--no-smoke", action="store_true")

    p_deploy = sub.add_parser("deploy", help="create model, config and endpoint")
    common(p_deploy)
    model_source(p_deploy, update=False)
    p_update = sub.add_parser("update", help="roll the endpoint to a new model/config")
    common(p_update)
    model_source(p_update, update=True)
    p_delete = sub.add_parser("delete", help="delete endpoint, config and models")
    common(p_delete)
    p_delete.add_argument("--delete-artifact", action="store_true", help="also the S3 tarball")
    p_invoke = sub.add_parser("invoke", help="send one JSON body")
    p_invoke.add_argument("--name", required=True)
    p_invoke.add_argument("--body", default=json.dumps(DEFAULT_SMOKE_BODY))
    return parser


COMMANDS = {"deploy": cmd_deploy, "update": cmd_update, "delete": cmd_delete, "invoke": cmd_invoke}


def main(argv: Sequence[str] | None = None, clients: Clients | None = None) -> int:
    """Run one subcommand; print its JSON summary on stdout; exit 1 with a message on error."""
    args = build_parser().parse_args(argv)
    try:
        result = COMMANDS[args.command](args, clients or Clients.create(args.region))
    except (DeployError, ClientError, WaiterError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
