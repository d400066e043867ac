"""Real-time and asynchronous endpoints: deploy, update, cleanup, autoscale, delete.

Model and endpoint config names carry a sortable UTC stamp (``<name>-<stamp>``), so
``update`` creates the next pair beside the live one and SageMaker swaps the endpoint
over without downtime. A pair is superseded once the endpoint serves a newer config;
``cleanup`` (and every ``update``, before and after its swap) deletes superseded pairs,
which is what an ``update --no-wait`` leaves behind. ``delete`` finds everything through
the endpoint's name, so no local state file is kept.
"""

from __future__ import annotations

import argparse
from typing import Any

from smdeploy import scaling, variant
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
from smdeploy.invocation import DEFAULT_SMOKE_BODY, smoke
from smdeploy.resources import cleanup, current, delete_config_and_models, wait_in_service

__all__ = [
    "DEFAULT_SMOKE_BODY",
    "cmd_autoscale",
    "cmd_cleanup",
    "cmd_delete",
    "cmd_deploy",
    "cmd_update",
]

DEFAULT_INSTANCE_TYPE = "ml.inf2.xlarge"
# Neuron runtimes load compiled graphs onto the NeuronCores at start; with a cold
# image pull and a multi-GB artifact that exceeds SageMaker's short defaults.
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 900
DEFAULT_DOWNLOAD_TIMEOUT_S = 900
# An asynchronous endpoint takes request bodies of up to 1 GB from S3; Ember's default
# payload limit (2 MB) would refuse what async is for. Raised, not unbounded.
ASYNC_PAYLOAD_LIMIT = 100 * 1024 * 1024
NO_AMI = "none"


# ------------------------------------------------------------------------------ pieces
def container_definition(
    image_uri: str, model_data_url: str | None, env: dict[str, str]
) -> dict[str, Any]:
    """The PrimaryContainer: image, optional artifact (-> /opt/ml/model), environment."""
    container: dict[str, Any] = {"Image": image_uri, "Environment": dict(env)}
    if model_data_url:
        container["ModelDataUrl"] = model_data_url
    return container


def create_model_and_config(
    sm: Any,
    *,
    base_name: str,
    suffix: str,
    role_arn: str,
    container: dict[str, Any],
    variant_args: dict[str, Any],
    async_config: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """Create the model and its endpoint config under ``<name>-<suffix>``."""
    model_name = config_name = stamped(base_name, suffix)
    log(f"create_model {model_name} (image {container['Image']})")
    sm.create_model(ModelName=model_name, ExecutionRoleArn=role_arn, PrimaryContainer=container)
    log(f"create_endpoint_config {config_name} ({variant_args['instance_type']})")
    request: dict[str, Any] = {
        "EndpointConfigName": config_name,
        "ProductionVariants": [variant.production_variant(model_name, **variant_args)],
    }
    if async_config:
        request["AsyncInferenceConfig"] = async_config
    sm.create_endpoint_config(**request)
    return model_name, config_name


# ------------------------------------------------------------------ variant settings
def _inference_ami(requested: str | None, instance_type: str, kept: str | None) -> str | None:
    if requested:
        return None if requested == NO_AMI else requested
    return kept or variant.default_inference_ami(instance_type)


def _volume_size(requested: int | None, instance_type: str, kept: int | None) -> int | None:
    if requested and variant.has_instance_storage(instance_type):
        raise DeployError(
            f"--volume-size: {instance_type} has local NVMe storage, which SageMaker uses "
            "instead of an EBS volume (VolumeSizeInGB is refused there)"
        )
    if requested:
        return requested
    return None if variant.has_instance_storage(instance_type) else kept


def _async_config(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.async_output:
        if args.async_failure or args.async_max_concurrency:
            raise DeployError("--async-failure/--async-max-concurrency need --async-output")
        return None
    parse_s3_url(args.async_output.rstrip("/") + "/")
    if args.async_failure:
        parse_s3_url(args.async_failure.rstrip("/") + "/")
    return variant.async_inference_config(
        args.async_output, args.async_failure, args.async_max_concurrency
    )


def _async_env(env: dict[str, str]) -> dict[str, str]:
    """What the container needs to serve asynchronous requests: their longer timeout and
    larger bodies (each only where the operator has not set it)."""
    out = dict(env)
    out.setdefault(variant.INVOCATION_TIMEOUT_ENV, str(variant.ASYNC_TIMEOUT_S))
    out.setdefault("EMBER_PAYLOAD_LIMIT", str(ASYNC_PAYLOAD_LIMIT))
    return out


# -------------------------------------------------------------------------- commands
def cmd_deploy(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Package + upload, create model, endpoint config and endpoint, wait, smoke-invoke."""
    name = check_name(args.name)
    env = parse_env(args.env)
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    async_cfg = _async_config(args)
    if async_cfg:
        env = _async_env(env)
    auto = scaling.parse(args.autoscale, args.scale_target, asynchronous=bool(async_cfg))
    if auto and args.no_wait:
        raise DeployError(
            "--autoscale registers the variant once InService: drop --no-wait, or run "
            "`deploy.py autoscale` when the endpoint is up"
        )
    variant_args = {
        "instance_type": args.instance_type,
        "instance_count": args.instance_count,
        "health_check_timeout": args.health_check_timeout,
        "download_timeout": args.download_timeout,
        "inference_ami": _inference_ami(args.inference_ami, args.instance_type, None),
        "volume_size": _volume_size(args.volume_size, args.instance_type, None),
    }
    if not (args.model_dir or args.model_data or args.hf_model_id):
        log(
            "no --model-dir/--model-data/--hf-model-id: the image's default model is served "
            "(Dockerfile.cuda: the packaged all-MiniLM-L6-v2; the Neuron image has none)"
        )
    suffix = stamp()
    data_url = model_data(args, clients, suffix)
    model_name, config_name = create_model_and_config(
        clients.sagemaker,
        base_name=name,
        suffix=suffix,
        role_arn=args.role_arn,
        container=container_definition(args.image_uri, data_url, env),
        variant_args=variant_args,
        async_config=async_cfg,
    )
    log(f"create_endpoint {name}")
    clients.sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=config_name)
    result: dict[str, Any] = {
        "endpoint": name,
        "model": model_name,
        "endpoint_config": config_name,
        "model_data": data_url,
        "instance_type": args.instance_type,
        "inference_ami": variant_args["inference_ami"],
        "asynchronous": bool(async_cfg),
    }
    if args.no_wait:
        return result
    wait_in_service(clients.sagemaker, name, args.wait_timeout, args.poll_seconds)
    result["status"] = "InService"
    if auto:
        result["autoscaling"] = scaling.apply(
            clients.autoscaling, name, auto, asynchronous=bool(async_cfg)
        )
    if not args.no_smoke:
        result["smoke"] = smoke(args, clients, name, async_cfg)
    return result


def cmd_update(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Roll the endpoint to a new model/config; unspecified settings keep their live values."""
    name = check_name(args.name)
    sm = clients.sagemaker
    desc, old_config, old_models = current(sm, name)
    old_config_name = desc["EndpointConfigName"]
    if desc.get("EndpointStatus") == "InService":
        cleanup(sm, name, old_config_name)  # what an earlier `update --no-wait` left
    old_variant = old_config["ProductionVariants"][0]
    old_container = old_models[0]["PrimaryContainer"]
    old_type = old_variant["InstanceType"]
    instance_type = args.instance_type or old_type
    same_type = instance_type == old_type
    async_cfg = _async_config(args) or old_config.get("AsyncInferenceConfig")
    auto_now = scaling.current(clients.autoscaling, name)
    auto_new = scaling.parse(args.autoscale, args.scale_target, asynchronous=bool(async_cfg))
    if (auto_now and not same_type or auto_new) and args.no_wait:
        raise DeployError(
            "this update (re)registers autoscaling once the endpoint is InService: drop --no-wait"
        )
    instance_count = args.instance_count or old_variant["InitialInstanceCount"]
    if auto_now and not args.instance_count:
        # The new fleet starts at today's autoscaled size, not the first deploy's count.
        live = desc.get("ProductionVariants") or [{}]
        instance_count = live[0].get("CurrentInstanceCount") or instance_count
    suffix = stamp()
    env = dict(old_container.get("Environment", {}))
    env.update(parse_env(args.env))
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    if async_cfg:
        env = _async_env(env)
    data_url = model_data(args, clients, suffix) or old_container.get("ModelDataUrl")
    variant_args = {
        "instance_type": instance_type,
        "instance_count": instance_count,
        "health_check_timeout": args.health_check_timeout
        or old_variant.get(
            "ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_HEALTH_CHECK_TIMEOUT_S
        ),
        "download_timeout": args.download_timeout
        or old_variant.get("ModelDataDownloadTimeoutInSeconds", DEFAULT_DOWNLOAD_TIMEOUT_S),
        "inference_ami": _inference_ami(
            args.inference_ami,
            instance_type,
            old_variant.get("InferenceAmiVersion") if same_type else None,
        ),
        "volume_size": _volume_size(
            args.volume_size, instance_type, old_variant.get("VolumeSizeInGB")
        ),
    }
    model_name, config_name = create_model_and_config(
        sm,
        base_name=name,
        suffix=suffix,
        role_arn=args.role_arn or old_models[0]["ExecutionRoleArn"],
        container=container_definition(args.image_uri or old_container["Image"], data_url, env),
        variant_args=variant_args,
        async_config=async_cfg,
    )
    if auto_now and not same_type:
        # UpdateEndpoint refuses an instance type change on a scalable target.
        scaling.remove(clients.autoscaling, name)
    log(f"update_endpoint {name}: {old_config_name} -> {config_name}")
    sm.update_endpoint(EndpointName=name, EndpointConfigName=config_name)
    result: dict[str, Any] = {
        "endpoint": name,
        "model": model_name,
        "endpoint_config": config_name,
        "model_data": data_url,
        "instance_type": instance_type,
        "inference_ami": variant_args["inference_ami"],
        "replaced_endpoint_config": old_config_name,
    }
    if args.no_wait:
        result["cleanup"] = f"pending: run `deploy.py cleanup --name {name}` once InService"
        return result
    wait_in_service(sm, name, args.wait_timeout, args.poll_seconds)
    result["status"] = "InService"
    again = auto_new or (auto_now if not same_type else None)
    if again:
        result["autoscaling"] = scaling.apply(
            clients.autoscaling, name, again, asynchronous=bool(async_cfg)
        )
    if not args.no_smoke:
        result["smoke"] = smoke(args, clients, name, async_cfg)
    # Only once the new config serves: SageMaker keeps the old one until the swap is done.
    result["deleted"] = cleanup(sm, name, config_name)
    return result


def cmd_cleanup(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Wait until the endpoint is InService, then delete the configs and models it left."""
    name = check_name(args.name)
    if not args.no_wait:
        wait_in_service(clients.sagemaker, name, args.wait_timeout, args.poll_seconds)
    desc = clients.sagemaker.describe_endpoint(EndpointName=name)
    if desc["EndpointStatus"] != "InService":
        raise DeployError(
            f"endpoint {name} is {desc['EndpointStatus']}: its next config may still be "
            "deploying, so nothing is deleted until it is InService"
        )
    deleted = cleanup(clients.sagemaker, name, desc["EndpointConfigName"])
    return {"endpoint": name, "deleted": deleted}


def cmd_delete(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Delete autoscaling, the endpoint, every config and model of this name (and the
    artifacts if asked)."""
    name = check_name(args.name)
    sm = clients.sagemaker
    desc, config, models = current(sm, name)
    scaling.remove(clients.autoscaling, name)  # AWS: deregister before deleting
    log(f"delete_endpoint {name}")
    sm.delete_endpoint(EndpointName=name)
    if not args.no_wait:
        sm.get_waiter("endpoint_deleted").wait(
            EndpointName=name,
            WaiterConfig={"Delay": args.poll_seconds, "MaxAttempts": 60},
        )
    deleted = delete_config_and_models(sm, desc["EndpointConfigName"])
    deleted += cleanup(sm, name, None)
    artifacts = []
    if args.delete_artifact:
        for model in models:
            url = model["PrimaryContainer"].get("ModelDataUrl")
            if url and url.startswith("s3://"):
                bucket, key = parse_s3_url(url)
                clients.s3.delete_object(Bucket=bucket, Key=key)
                artifacts.append(url)
    return {"endpoint": name, "deleted": [name, *deleted], "deleted_artifacts": artifacts}


def cmd_autoscale(args: argparse.Namespace, clients: Clients) -> dict[str, Any]:
    """Register (or with --off remove) target tracking on an InService endpoint."""
    name = check_name(args.name)
    if args.off:
        return {"endpoint": name, "removed": scaling.remove(clients.autoscaling, name)}
    _, config, _ = current(clients.sagemaker, name)
    asynchronous = bool(config.get("AsyncInferenceConfig"))
    auto = scaling.parse(args.autoscale, args.scale_target, asynchronous=asynchronous)
    if auto is None:
        raise DeployError("autoscale needs --autoscale MIN:MAX (or --off)")
    if not args.no_wait:
        wait_in_service(clients.sagemaker, name, args.wait_timeout, args.poll_seconds)
    return {
        "endpoint": name,
        "autoscaling": scaling.apply(clients.autoscaling, name, auto, asynchronous=asynchronous),
    }
