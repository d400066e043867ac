"""Batch Transform: embed JSON Lines files on S3 into JSON Lines files on S3, on the
serving image, with no endpoint.

SageMaker splits each input file by line (``SplitType=Line``), packs lines into
mini-batches of up to ``MaxPayloadInMB`` (``BatchStrategy=MultiRecord``) and POSTs each to
``/invocations`` as ``application/jsonlines``; Ember answers one line per line, in order
(``ember.platform.dispatch_jsonlines``), and SageMaker writes ``<file>.out`` with the
answers joined by line (``AssembleWith=Line``). A line is a JSON string or an object with
``text`` (and ``id``, passed through), or any body ``/invocations`` takes.

Why these settings:

* ``MaxConcurrentTransforms`` 2 per instance: the engine batches inside the container, so
  more concurrent requests only queue; two overlap one mini-batch's transfer with the
  other's compute, and each takes half the queue (``dispatch_jsonlines``).
* The container's payload limit (``EMBER_PAYLOAD_LIMIT``) is raised to the mini-batch
  size, and the invocation timeout it answers within to the job's
  ``InvocationsTimeoutInSeconds``: a mini-batch is answered whole or fails whole.
* GPU hosts: Batch Transform offers drivers 470 and 535 only (``TransformAmiVersion``
  ``al2-ami-sagemaker-batch-gpu-470`` / ``-535``), and the CUDA image's torch is built for
  CUDA 13, which needs R580: it would not start there. A GPU job is refused unless the
  operator names the AMI, meaning an image built with a CUDA 12 torch (535 runs 12.x).
"""

from __future__ import annotations

import argparse
from typing import Any

from botocore.exceptions import WaiterError

from smdeploy import variant
from smdeploy.artifact import model_data
from smdeploy.common import (
    Clients,
    DeployError,
    check_name,
    log,
    parse_env,
    parse_s3_url,
    stamp,
    stamped,
)
from smdeploy.resources import current

JSONLINES = "application/jsonlines"
DEFAULT_INSTANCE_TYPE = "ml.c5.2xlarge"
DEFAULT_MAX_PAYLOAD_MB = 6  # SageMaker's default; at most 100
MAX_PAYLOAD_MB = 100
DEFAULT_CONCURRENCY = 2
DEFAULT_INVOCATION_TIMEOUT_S = 600  # SageMaker's default; at most 3600
MAX_INVOCATION_TIMEOUT_S = 3600
GPU_BATCH_AMIS = ("al2-ami-sagemaker-batch-gpu-470", "al2-ami-sagemaker-batch-gpu-535")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job's name, its model (created, or an endpoint's), data and resources."""
    p.add_argument("--name", required=True, help="prefix of the transform job (and model)")
    p.add_argument("--input", required=True, help="s3://bucket/prefix/ of JSON Lines files")
    p.add_argument("--output", required=True, help="s3://bucket/prefix/ for <file>.out")
    p.add_argument(
        "--from-endpoint", help="use the model a deployed endpoint serves (no new model)"
    )
    p.add_argument("--image-uri", help="ECR URI of the serving image (new model)")
    p.add_argument("--role-arn", help="SageMaker execution role (new model)")
    p.add_argument("--model-dir", help="HF model dir or `ember export` output to upload")
    p.add_argument("--model-data", help="existing s3://.../model.tar.gz to reuse")
    p.add_argument("--hf-model-id", help="Hub id downloaded at start (needs egress)")
    p.add_argument("--bucket", help="S3 bucket for model.tar.gz")
    p.add_argument("--prefix", default="ember", help="S3 key prefix")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    p.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument(
        "--transform-ami",
        choices=GPU_BATCH_AMIS,
        help="TransformAmiVersion; GPU instances need it (and a CUDA 12 image)",
    )
    p.add_argument(
        "--max-payload-mb",
        type=int,
        default=DEFAULT_MAX_PAYLOAD_MB,
        help=f"MaxPayloadInMB: mini-batch size (1-{MAX_PAYLOAD_MB})",
    )
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="MaxConcurrentTransforms per instance",
    )
    p.add_argument(
        "--invocation-timeout",
        type=int,
        default=DEFAULT_INVOCATION_TIMEOUT_S,
        help=f"InvocationsTimeoutInSeconds per mini-batch (at most {MAX_INVOCATION_TIMEOUT_S})",
    )
    p.add_argument("--retries", type=int, default=1, help="InvocationsMaxRetries")
    p.add_argument(
        "--join-input",
        action="store_true",
        help="DataProcessing JoinSource=Input: each output line carries its input record",
    )
    p.add_argument("--gzip", action="store_true", help="the input files are gzip-compressed")
    p.add_argument("--keep-model", action="store_true", help="keep a created model afterwards")
    p.add_argument("--poll-seconds", type=int, default=30)
    p.add_argument("--wait-timeout", type=int, default=24 * 3600, help="seconds to wait")
    p.add_argument("--no-wait", action="store_true")


def container_env(env: dict[str, str], max_payload_mb: int, timeout_s: int) -> dict[str, str]:
    """The container's environment for a transform job: bodies of a whole mini-batch, and
    the invocation cap it answers within (each only where the operator has not set it)."""
    out = dict(env)
    out.setdefault("EMBER_PAYLOAD_LIMIT", str(max_payload_mb * 1024 * 1024 + 64 * 1024))
    out.setdefault(variant.INVOCATION_TIMEOUT_ENV, str(timeout_s))
    return out


def check_resources(instance_type: str, transform_ami: str | None) -> None:
    """Refuse a GPU job the image cannot start on (see the module's docstring)."""
    if variant.family(instance_type)[:1] in ("g", "p") and not transform_ami:
        raise DeployError(
            f"{instance_type}: Batch Transform's GPU hosts run NVIDIA drivers 470 or 535 "
            f"({' / '.join(GPU_BATCH_AMIS)}), and Ember's CUDA image ships a CUDA 13 torch, "
            "which needs R580 and would not start there. Use a CPU instance (ml.c5, ml.m5), "
            "or an image built with a CUDA 12 torch and --transform-ami "
            f"{GPU_BATCH_AMIS[1]}"
        )


def transform_job_request(
    *,
    job_name: str,
    model_name: str,
    input_s3: str,
    output_s3: str,
    instance_type: str,
    instance_count: int,
    max_payload_mb: int = DEFAULT_MAX_PAYLOAD_MB,
    max_concurrent: int = DEFAULT_CONCURRENCY,
    invocation_timeout: int = DEFAULT_INVOCATION_TIMEOUT_S,
    retries: int = 1,
    environment: dict[str, str] | None = None,
    transform_ami: str | None = None,
    join_input: bool = False,
    gzip: bool = False,
) -> dict[str, Any]:
    """CreateTransformJob's request: JSON Lines in, split by line, packed into mini-batches,
    one answer line per line, assembled by line."""
    if not 1 <= max_payload_mb <= MAX_PAYLOAD_MB:
        raise DeployError(f"--max-payload-mb must be 1-{MAX_PAYLOAD_MB}, got {max_payload_mb}")
    if not 1 <= invocation_timeout <= MAX_INVOCATION_TIMEOUT_S:
        raise DeployError(f"--invocation-timeout must be 1-{MAX_INVOCATION_TIMEOUT_S}")
    for url in (input_s3, output_s3):
        parse_s3_url(url.rstrip("/") + "/")
    resources: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": instance_count}
    if transform_ami:
        resources["TransformAmiVersion"] = transform_ami
    request: dict[str, Any] = {
        "TransformJobName": job_name,
        "ModelName": model_name,
        "MaxConcurrentTransforms": max_concurrent,
        "MaxPayloadInMB": max_payload_mb,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {
            "InvocationsTimeoutInSeconds": invocation_timeout,
            "InvocationsMaxRetries": retries,
        },
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": input_s3}},
            "ContentType": JSONLINES,
            "CompressionType": "Gzip" if gzip else "None",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": output_s3,
            "Accept": JSONLINES,
            "AssembleWith": "Line",
        },
        "TransformResources": resources,
    }
    if environment:
        request["Environment"] = dict(environment)
    if join_input:
        request["DataProcessing"] = {"JoinSource": "Input"}
    return request


def _model(args: argparse.Namespace, clients: Clients, name: str, suffix: str) -> tuple[str, bool]:
    """(model name, whether this command created it)."""
    if args.from_endpoint:
        if args.image_uri or args.model_dir or args.model_data or args.hf_model_id:
            raise DeployError("--from-endpoint uses that endpoint's model: drop the model flags")
        _, _, models = current(clients.sagemaker, args.from_endpoint)
        return models[0]["ModelName"], False
    if not (args.image_uri and args.role_arn):
        raise DeployError("give --from-endpoint, or --image-uri and --role-arn for a new model")
    env = container_env(parse_env(args.env), args.max_payload_mb, args.invocation_timeout)
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    container: dict[str, Any] = {"Image": args.image_uri, "Environment": env}
    data_url = model_data(args, clients, suffix)
    if data_url:
        container["ModelDataUrl"] = data_url
    model_name = stamped(name, suffix)
    log(f"create_model {model_name} (image {args.image_uri})")
    clients.sagemaker.create_model(
        ModelName=model_name, ExecutionRoleArn=args.role_arn, PrimaryContainer=container
    )
    return model_name, True


def wait_done(sm: Any, job: str, timeout_s: int, poll_s: int) -> dict[str, Any]:
    """Block until the job completes; a failed or stopped job raises with SageMaker's reason."""
    attempts = max(1, timeout_s // max(1, poll_s))
    log(f"waiting for transform job {job} (up to {timeout_s}s)")
    try:
        sm.get_waiter("transform_job_completed_or_stopped").wait(
            TransformJobName=job, WaiterConfig={"Delay": poll_s, "MaxAttempts": attempts}
        )
    except WaiterError:
        pass  # the waiter also gives up on Failed: the description below says why
    desc = sm.describe_transform_job(TransformJobName=job)
    if desc.get("TransformJobStatus") != "Completed":
        raise DeployError(
            f"transform job {job} ended {desc.get('TransformJobStatus')}: "
            f"{desc.get('FailureReason', 'no reason given')}. Check CloudWatch logs "
            "/aws/sagemaker/TransformJobs"
        )
    return desc


def run(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Create (or reuse) the model, create the transform job, wait, remove a created model."""
    name = check_name(args.name)
    check_resources(args.instance_type, args.transform_ami)
    suffix = stamp()
    job_name = stamped(name, suffix)
    request = transform_job_request(  # checked before any model is created
        job_name=job_name,
        model_name="pending",
        input_s3=args.input,
        output_s3=args.output,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        max_payload_mb=args.max_payload_mb,
        max_concurrent=args.max_concurrent,
        invocation_timeout=args.invocation_timeout,
        retries=args.retries,
        transform_ami=args.transform_ami,
        join_input=args.join_input,
        gzip=args.gzip,
    )
    model_name, created = _model(args, clients, name, suffix)
    request["ModelName"] = model_name
    if not created:  # an endpoint's model keeps its env: the job's own settings go here
        request["Environment"] = container_env({}, args.max_payload_mb, args.invocation_timeout)
    log(f"create_transform_job {job_name} ({args.instance_count} x {args.instance_type})")
    clients.sagemaker.create_transform_job(**request)
    result: dict[str, Any] = {
        "transform_job": job_name,
        "model": model_name,
        "model_created": created,
        "input": args.input,
        "output": args.output,
    }
    if args.no_wait:
        if created and not args.keep_model:
            log(f"--no-wait: delete model {model_name} once the job has finished")
        return result
    desc = wait_done(clients.sagemaker, job_name, args.wait_timeout, args.poll_seconds)
    result["status"] = desc["TransformJobStatus"]
    if created and not args.keep_model:
        clients.sagemaker.delete_model(ModelName=model_name)
        log(f"deleted model {model_name}")
        result["model_deleted"] = True
    return result
