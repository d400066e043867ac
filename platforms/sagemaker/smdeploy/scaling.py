"""Target-tracking autoscaling of the endpoint's variant (application-autoscaling).

Real-time endpoints track ``SageMakerVariantInvocationsPerInstance`` (invocations per
instance per minute); asynchronous ones track ``ApproximateBacklogSizePerInstance`` (queued
requests per instance), the metric AWS documents for them, and may scale to zero. The
variant is registered only once the endpoint is InService, deregistered before the
endpoint is deleted, and around an update that changes the instance type (UpdateEndpoint
refuses that change while the variant is a scalable target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smdeploy.common import DeployError, log
from smdeploy.variant import DEFAULT_VARIANT

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
POLICY = "ember-target-tracking"
SCALE_IN_COOLDOWN_S = 300  # slow to give back instances that took minutes to warm
SCALE_OUT_COOLDOWN_S = 60


@dataclass(frozen=True)
class Scaling:
    min_instances: int
    max_instances: int
    target: float


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{DEFAULT_VARIANT}"


def parse(spec: str | None, target: float | None, *, asynchronous: bool) -> Scaling | None:
    """``--autoscale MIN:MAX`` and ``--scale-target`` to a Scaling, checked before any call."""
    if not spec:
        return None
    low, sep, high = spec.partition(":")
    if not (sep and low.isdigit() and high.isdigit()):
        raise DeployError(f"--autoscale expects MIN:MAX, got {spec!r}")
    lowest = 0 if asynchronous else 1
    if not lowest <= int(low) <= int(high) or int(high) < 1:
        raise DeployError(
            f"--autoscale {spec}: need {lowest} <= MIN <= MAX and MAX >= 1"
            + ("" if asynchronous else " (only asynchronous endpoints scale to zero)")
        )
    if target is None:
        if not asynchronous:
            raise DeployError(
                "--autoscale needs --scale-target: invocations per instance per minute to aim "
                "for (measure one instance's sustained rate and take about half of it)"
            )
        target = 5.0  # queued requests per instance, AWS's example for async endpoints
    if target <= 0:
        raise DeployError(f"--scale-target must be positive, got {target}")
    return Scaling(int(low), int(high), float(target))


def policy_configuration(endpoint: str, target: float, *, asynchronous: bool) -> dict[str, Any]:
    """The TargetTrackingScalingPolicyConfiguration for this kind of endpoint."""
    config: dict[str, Any] = {
        "TargetValue": target,
        "ScaleInCooldown": SCALE_IN_COOLDOWN_S,
        "ScaleOutCooldown": SCALE_OUT_COOLDOWN_S,
    }
    if asynchronous:
        config["CustomizedMetricSpecification"] = {
            "MetricName": "ApproximateBacklogSizePerInstance",
            "Namespace": "AWS/SageMaker",
            "Dimensions": [{"Name": "EndpointName", "Value": endpoint}],
            "Statistic": "Average",
        }
    else:
        config["PredefinedMetricSpecification"] = {
            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
        }
    return config


def apply(aas: Any, endpoint: str, scaling: Scaling, *, asynchronous: bool) -> dict[str, Any]:
    """Register the variant and put the target-tracking policy (both idempotent)."""
    if aas is None:
        raise DeployError("autoscaling needs an application-autoscaling client")
    rid = resource_id(endpoint)
    log(f"autoscaling {rid}: {scaling.min_instances}..{scaling.max_instances}")
    aas.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        MinCapacity=scaling.min_instances,
        MaxCapacity=scaling.max_instances,
    )
    aas.put_scaling_policy(
        PolicyName=POLICY,
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration=policy_configuration(
            endpoint, scaling.target, asynchronous=asynchronous
        ),
    )
    return {
        "min": scaling.min_instances,
        "max": scaling.max_instances,
        "target": scaling.target,
        "metric": "ApproximateBacklogSizePerInstance"
        if asynchronous
        else "SageMakerVariantInvocationsPerInstance",
    }


def current(aas: Any, endpoint: str) -> Scaling | None:
    """The variant's registration and our policy's target, or None when not autoscaled."""
    if aas is None:
        return None
    rid = resource_id(endpoint)
    targets = aas.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[rid], ScalableDimension=DIMENSION
    )["ScalableTargets"]
    if not targets:
        return None
    policies = aas.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
    )["ScalingPolicies"]
    target = next(
        (
            p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
            for p in policies
            if p.get("PolicyName") == POLICY
        ),
        None,
    )
    return Scaling(targets[0]["MinCapacity"], targets[0]["MaxCapacity"], target or 0.0)


def remove(aas: Any, endpoint: str) -> bool:
    """Delete our policy and deregister the variant; False when it was not registered."""
    if current(aas, endpoint) is None:
        return False
    rid = resource_id(endpoint)
    policies = aas.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
    )["ScalingPolicies"]
    for policy in policies:
        aas.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=NAMESPACE,
            ResourceId=rid,
            ScalableDimension=DIMENSION,
        )
    aas.deregister_scalable_target(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
    )
    log(f"deregistered {rid} from autoscaling")
    return True
