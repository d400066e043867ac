"""Deploy Ember to a SageMaker endpoint (Inferentia2 by default) with boto3.

    python platforms/sagemaker/deploy.py deploy --name ember-minilm \\
        --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/ember-sagemaker:neuron \\
        --role-arn arn:aws:iam::123456789012:role/SageMakerExecution \\
        --model-dir ./minilm-neuron --bucket my-artifacts
    python platforms/sagemaker/deploy.py update --name ember-minilm --image-uri ...:new-tag
    python platforms/sagemaker/deploy.py cleanup --name ember-minilm
    python platforms/sagemaker/deploy.py autoscale --name ember-minilm --autoscale 1:4 \\
        --scale-target 600
    python platforms/sagemaker/deploy.py invoke --name ember-minilm --body '{"input": "hi"}'
    python platforms/sagemaker/deploy.py delete --name ember-minilm
    python platforms/sagemaker/deploy.py batch --name ember-corpus --from-endpoint ember-minilm \\
        --input s3://my-data/corpus/ --output s3://my-data/vectors/ --instance-count 4

Why a script and not the SageMaker Python SDK: the whole flow is a handful of boto3
calls, and spelling them out keeps every parameter that matters visible (the health check
and model download timeouts must cover Neuron model loading, which takes minutes; GPU
instances need the inference AMI whose driver runs the image's CUDA).

This file is the command line only: each subcommand is one row of ``COMMANDS`` (its
arguments and its function), the work lives in ``smdeploy/``. boto3 honours
``AWS_ENDPOINT_URL``, which is how the tests point this script at a local moto server.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError, WaiterError

# smdeploy/ sits beside this file: on sys.path when run as a script, added when imported
# by path (the tests load it so; platforms/ is deployable files, not a package).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from smdeploy import args as cli  # noqa: E402
from smdeploy import batch, common, endpoint, invocation, resources, scaling, variant  # noqa: E402
from smdeploy.common import Clients, DeployError  # noqa: E402

__all__ = [
    "COMMANDS",
    "Clients",
    "DeployError",
    "batch",
    "common",
    "endpoint",
    "invocation",
    "main",
    "resources",
    "scaling",
    "variant",
]

DEFAULT_SMOKE_BODY = invocation.DEFAULT_SMOKE_BODY


def _deploy_args(p: argparse.ArgumentParser) -> None:
    cli.common(p)
    cli.model_source(p, update=False)
    cli.endpoint_config(p, update=False)


def _update_args(p: argparse.ArgumentParser) -> None:
    cli.common(p)
    cli.model_source(p, update=True)
    cli.endpoint_config(p, update=True)


def _delete_args(p: argparse.ArgumentParser) -> None:
    cli.common(p)
    p.add_argument("--delete-artifact", action="store_true", help="also the S3 tarball")


def _invoke_args(p: argparse.ArgumentParser) -> None:
    cli.common(p)
    p.add_argument("--body", default=json.dumps(DEFAULT_SMOKE_BODY))
    p.add_argument("--body-file", help="read the JSON body from this file")
    p.add_argument("--input-location", help="async endpoints: s3://... to put the body at")


def _autoscale_args(p: argparse.ArgumentParser) -> None:
    cli.common(p)
    cli.scaling_args(p)
    p.add_argument("--off", action="store_true", help="remove the policy and registration")


Command = Callable[[argparse.Namespace, Clients], Any]
# name: (help, arguments, function). A new subcommand is one row.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {
    "deploy": ("create model, config and endpoint", _deploy_args, endpoint.cmd_deploy),
    "update": ("roll the endpoint to a new model/config", _update_args, endpoint.cmd_update),
    "cleanup": (
        "delete configs and models an update left (after InService)",
        cli.common,
        endpoint.cmd_cleanup,
    ),
    "autoscale": ("target-tracking autoscaling", _autoscale_args, endpoint.cmd_autoscale),
    "delete": ("delete endpoint, configs and models", _delete_args, endpoint.cmd_delete),
    "invoke": ("send one JSON body (async: through S3)", _invoke_args, invocation.cmd_invoke),
    "batch": (
        "Batch Transform: S3 JSON Lines in, one line out each",
        batch.add_arguments,
        batch.run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy.py", description="Deploy Ember to a SageMaker endpoint."
    )
    parser.add_argument("--region", default=None, help="AWS region (default: from AWS config)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text))
    return parser


def main(argv: Sequence[str] | None = None, clients: Clients | None = None) -> int:
    """Run one subcommand; print its JSON summary on stdout; exit 1 with a message on error."""
    args = build_parser().parse_args(argv)
    try:
        result = COMMANDS[args.command][2](args, clients or Clients.create(args.region))
    except (DeployError, ClientError, WaiterError, json.JSONDecodeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
