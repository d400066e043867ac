"""Finding, waiting for and removing this endpoint's stamped resources.

Model and endpoint config names carry a sortable UTC stamp (``<name>-<stamp>``). A pair
is superseded once the endpoint serves a newer config; ``cleanup`` deletes superseded
pairs, which is what an ``update --no-wait`` leaves behind, and nothing else.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError, WaiterError

from smdeploy.common import DeployError, log, stamp_of


def wait_in_service(sm: Any, endpoint: str, timeout_s: int, poll_s: int) -> None:
    """Block until InService; on failure surface SageMaker's FailureReason."""
    attempts = max(1, timeout_s // max(1, poll_s))
    log(f"waiting for {endpoint} to be InService (up to {timeout_s}s)")
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


def current(sm: Any, endpoint: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The endpoint's description, its live config, and the models that config uses."""
    try:
        desc = sm.describe_endpoint(EndpointName=endpoint)
    except ClientError as exc:
        raise DeployError(f"endpoint {endpoint} not found: {exc}") from exc
    config = sm.describe_endpoint_config(EndpointConfigName=desc["EndpointConfigName"])
    models = [sm.describe_model(ModelName=v["ModelName"]) for v in config["ProductionVariants"]]
    return desc, config, models


def _stamped_configs(sm: Any, name: str) -> list[str]:
    """Every endpoint config named ``<name>-<stamp>``, oldest first."""
    names: list[str] = []
    token: str | None = None
    while True:
        page = sm.list_endpoint_configs(
            NameContains=name, MaxResults=100, **({"NextToken": token} if token else {})
        )
        names += [
            c["EndpointConfigName"]
            for c in page["EndpointConfigs"]
            if stamp_of(name, c["EndpointConfigName"])
        ]
        token = page.get("NextToken")
        if not token:
            return sorted(names, key=lambda n: stamp_of(name, n) or "")


def delete_config_and_models(sm: Any, config_name: str) -> list[str]:
    """Delete one endpoint config and the models its variants name (gone ones skipped)."""
    try:
        config = sm.describe_endpoint_config(EndpointConfigName=config_name)
    except ClientError:
        return []
    deleted = []
    sm.delete_endpoint_config(EndpointConfigName=config_name)
    deleted.append(config_name)
    for v in config["ProductionVariants"]:
        try:
            sm.delete_model(ModelName=v["ModelName"])
            deleted.append(v["ModelName"])
        except ClientError as exc:
            log(f"model {v['ModelName']} not deleted: {exc}")
    log(f"deleted {', '.join(deleted)}")
    return deleted


def cleanup(sm: Any, name: str, live_config: str | None) -> list[str]:
    """Delete this endpoint's configs older than ``live_config`` and their models.

    Only stamped names older than the live one: a pair another operator is creating right
    now for the next update is newer, and a config with another name is not ours. With
    ``live_config`` None (the endpoint is gone) every stamped config goes.
    """
    live_stamp = stamp_of(name, live_config) if live_config else None
    if live_config and live_stamp is None:
        log(f"{live_config} is not a deploy.py name; nothing is cleaned up")
        return []
    deleted: list[str] = []
    for config_name in _stamped_configs(sm, name):
        if live_stamp is None or (stamp_of(name, config_name) or "") < live_stamp:
            deleted += delete_config_and_models(sm, config_name)
    return deleted
