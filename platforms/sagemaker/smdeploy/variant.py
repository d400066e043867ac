"""Pure decisions about an endpoint config: no AWS call, so each is tested alone.

* The inference AMI. Ember's CUDA image ships a CUDA 13 torch, which needs NVIDIA driver
  R580. SageMaker's default real-time GPU hosts run drivers 470-550; only the inference AMI
  ``al2023-ami-sagemaker-inference-gpu-4-1`` (``InferenceAmiVersion`` on the production
  variant; driver 580, CUDA 13.0 in the API reference) has R580. So every ``ml.g*`` and
  ``ml.p*`` variant gets it unless the operator names another.
* The storage volume. ``VolumeSizeInGB`` sizes the EBS volume of instances that have no
  instance storage; on families with local NVMe (``ml.g4dn``, ``ml.g5``, ``ml.p4d``, any
  ``*d`` family, ...) SageMaker uses that disk and refuses the field.
* Asynchronous inference (``AsyncInferenceConfig``): requests are read from S3 and answers
  written to S3, for payloads over the 6 MB real-time cap and work past its 60 s.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_VARIANT = "AllTraffic"
GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
# Families with local NVMe storage but no "d" in their name (the "d" ones are matched below).
NVME_FAMILIES = frozenset({"g5", "g6", "g6e", "p5", "p5e", "p5en", "trn1", "trn1n", "p6-b200"})
_D_FAMILY = re.compile(r"^[a-z]+\d+[a-z]*d[a-z]*$")  # m5d, c6id, g4dn, p3dn, p4d, p4de
# What SageMaker's container gets per real-time invocation, and how long it may take.
REALTIME_MAX_PAYLOAD_MB = 6
REALTIME_TIMEOUT_S = 60
# InvokeEndpointAsync's default InvocationTimeoutSeconds (max 3600).
ASYNC_TIMEOUT_S = 900
# Where the serve entrypoint learns the invocation cap it must answer within.
INVOCATION_TIMEOUT_ENV = "EMBER_SAGEMAKER_INVOCATION_TIMEOUT"


def family(instance_type: str) -> str:
    """``ml.g5.2xlarge`` -> ``g5``."""
    parts = instance_type.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "ml" else instance_type


def default_inference_ami(instance_type: str) -> str | None:
    """The AMI whose NVIDIA driver runs the image's CUDA 13 torch, for GPU instances."""
    return GPU_AMI if family(instance_type)[:1] in ("g", "p") else None


def has_instance_storage(instance_type: str) -> bool:
    """True where SageMaker mounts local NVMe and refuses ``VolumeSizeInGB``."""
    name = family(instance_type)
    return name in NVME_FAMILIES or bool(_D_FAMILY.match(name))


def production_variant(
    model_name: str,
    instance_type: str,
    instance_count: int,
    health_check_timeout: int,
    download_timeout: int,
    *,
    inference_ami: str | None = None,
    volume_size: int | None = None,
) -> dict[str, Any]:
    """One variant taking all traffic, with timeouts sized for model loading."""
    variant: dict[str, Any] = {
        "VariantName": DEFAULT_VARIANT,
        "ModelName": model_name,
        "InstanceType": instance_type,
        "InitialInstanceCount": instance_count,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": health_check_timeout,
        "ModelDataDownloadTimeoutInSeconds": download_timeout,
    }
    if inference_ami:
        variant["InferenceAmiVersion"] = inference_ami
    if volume_size:
        variant["VolumeSizeInGB"] = volume_size
    return variant


def async_inference_config(
    output_path: str, failure_path: str | None, max_concurrent: int | None
) -> dict[str, Any]:
    """``AsyncInferenceConfig``: answers to ``output_path``, errors to ``failure_path``."""
    config: dict[str, Any] = {"OutputConfig": {"S3OutputPath": output_path}}
    if failure_path:
        config["OutputConfig"]["S3FailurePath"] = failure_path
    if max_concurrent:
        config["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": max_concurrent}
    return config
