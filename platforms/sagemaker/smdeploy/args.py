"""Argument groups shared by the subcommands (a new subcommand reuses what fits)."""

from __future__ import annotations

import argparse
import json

from smdeploy.endpoint import (
    DEFAULT_DOWNLOAD_TIMEOUT_S,
    DEFAULT_HEALTH_CHECK_TIMEOUT_S,
    DEFAULT_INSTANCE_TYPE,
    NO_AMI,
)
from smdeploy.invocation import DEFAULT_SMOKE_BODY
from smdeploy.variant import GPU_AMI


def common(p: argparse.ArgumentParser) -> None:
    """The endpoint's name and how long to wait for it."""
    p.add_argument("--name", required=True, help="endpoint name; prefixes model/config")
    p.add_argument("--poll-seconds", type=int, default=30)
    p.add_argument("--wait-timeout", type=int, default=3600, help="seconds to wait")
    p.add_argument("--no-wait", action="store_true")


def model_source(p: argparse.ArgumentParser, *, update: bool) -> None:
    """Image, role, where the weights come from, and the container's environment."""
    p.add_argument("--image-uri", required=not update, help="ECR URI of the built image")
    p.add_argument("--role-arn", required=not update, help="SageMaker execution role")
    p.add_argument("--model-dir", help="HF model dir or `ember export` output to upload")
    p.add_argument("--model-data", help="existing s3://.../model.tar.gz to reuse")
    p.add_argument("--hf-model-id", help="Hub id downloaded at start (needs egress)")
    p.add_argument("--bucket", help="S3 bucket for model.tar.gz")
    p.add_argument("--prefix", default="ember", help="S3 key prefix")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")


def endpoint_config(p: argparse.ArgumentParser, *, update: bool) -> None:
    """The production variant, asynchronous inference, autoscaling and the smoke test."""
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
    p.add_argument(
        "--inference-ami",
        help=f"InferenceAmiVersion (default on ml.g*/ml.p*: {GPU_AMI}, whose driver R580 runs "
        f"the image's CUDA 13 torch; '{NO_AMI}' for SageMaker's default host)",
    )
    p.add_argument(
        "--volume-size",
        type=int,
        help="VolumeSizeInGB: EBS volume for instances without local NVMe storage",
    )
    p.add_argument("--async-output", help="s3://... for answers: an asynchronous endpoint")
    p.add_argument("--async-failure", help="s3://... for error answers (async)")
    p.add_argument(
        "--async-max-concurrency", type=int, help="MaxConcurrentInvocationsPerInstance (async)"
    )
    scaling_args(p)
    p.add_argument("--smoke-body", default=json.dumps(DEFAULT_SMOKE_BODY))
    p.add_argument("--no-smoke", action="store_true")


def scaling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--autoscale", metavar="MIN:MAX", help="target-tracking instance range")
    p.add_argument(
        "--scale-target",
        type=float,
        help="invocations per instance per minute (async: queued requests per instance, default 5)",
    )
