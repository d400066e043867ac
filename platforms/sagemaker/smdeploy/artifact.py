"""model.tar.gz: packaged from a model directory and uploaded, or an existing S3 URL."""

from __future__ import annotations

import argparse
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError

from smdeploy.common import Clients, DeployError, log


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


def model_data(args: argparse.Namespace, clients: Clients, suffix: str) -> str | None:
    """The S3 URL for /opt/ml/model: packaged+uploaded, given, or none (HF_MODEL_ID)."""
    if args.model_data:
        return str(args.model_data)
    if not args.model_dir:
        return None
    if not args.bucket:
        raise DeployError("--model-dir needs --bucket (where model.tar.gz is uploaded)")
    key = "/".join(
        p for p in (args.prefix.strip("/"), f"{args.name}-{suffix}", "model.tar.gz") if p
    )
    with tempfile.TemporaryDirectory() as tmp:
        archive = package_model(Path(args.model_dir), Path(tmp))
        log(f"uploading {archive.stat().st_size} bytes to s3://{args.bucket}/{key}")
        return upload_artifact(clients.s3, archive, args.bucket, key)
