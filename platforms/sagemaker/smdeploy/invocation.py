"""Invoking an endpoint: real-time through InvokeEndpoint (6 MB cap), asynchronous through
S3 and InvokeEndpointAsync; and the smoke test deploy and update end with."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from botocore.exceptions import ClientError

from smdeploy import variant
from smdeploy.common import Clients, DeployError, check_name, log, parse_s3_url, stamp
from smdeploy.resources import current

DEFAULT_SMOKE_BODY = {"input": ["Ember smoke test"]}


def _parse_answer(endpoint: str, raw: bytes, content_type: str | None) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise DeployError(
            f"endpoint {endpoint} answered with non-JSON ({content_type}): {raw[:200]!r}"
        ) from exc


def invoke(runtime: Any, endpoint: str, body: dict[str, Any]) -> Any:
    """POST one JSON body to /invocations through the runtime API and parse the answer."""
    raw_body = json.dumps(body).encode()
    if len(raw_body) > variant.REALTIME_MAX_PAYLOAD_MB * 1024 * 1024:
        raise DeployError(
            f"the body is {len(raw_body)} bytes, over the {variant.REALTIME_MAX_PAYLOAD_MB} MB "
            "real-time cap: deploy with --async-output s3://... for larger payloads"
        )
    resp = runtime.invoke_endpoint(
        EndpointName=endpoint,
        ContentType="application/json",
        Accept="application/json",
        Body=raw_body,
    )
    return _parse_answer(endpoint, resp["Body"].read(), resp.get("ContentType"))


def invoke_async(
    clients: Clients,
    endpoint: str,
    body: dict[str, Any],
    input_location: str,
    *,
    timeout_s: int,
    poll_s: int,
) -> Any:
    """Put the body on S3, InvokeEndpointAsync, and wait for the answer (or failure) file."""
    bucket, key = parse_s3_url(input_location)
    clients.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode())
    resp = clients.runtime.invoke_endpoint_async(
        EndpointName=endpoint,
        InputLocation=input_location,
        ContentType="application/json",
        Accept="application/json",
        InvocationTimeoutSeconds=variant.ASYNC_TIMEOUT_S,
    )
    output, failure = resp["OutputLocation"], resp.get("FailureLocation")
    log(f"async invocation {resp.get('InferenceId')}: waiting for {output}")
    deadline = time.monotonic() + timeout_s
    while True:
        for location, failed in ((output, False), (failure, True)):
            if not location:
                continue
            out_bucket, out_key = parse_s3_url(location)
            try:
                raw = clients.s3.get_object(Bucket=out_bucket, Key=out_key)["Body"].read()
            except ClientError:
                continue
            if failed:
                raise DeployError(f"async invocation of {endpoint} failed: {raw[:500]!r}")
            return _parse_answer(endpoint, raw, "from S3")
        if time.monotonic() > deadline:
            raise DeployError(f"no answer at {output} after {timeout_s}s")
        time.sleep(poll_s)


def smoke_summary(endpoint: str, out: Any) -> dict[str, Any]:
    """One real request after InService: /ping only proves the container started."""
    if not isinstance(out, dict) or "error" in out:
        raise DeployError(f"smoke invocation of {endpoint} failed: {json.dumps(out)[:500]}")
    if "data" in out and not out["data"]:
        raise DeployError(f"smoke invocation of {endpoint} returned no data: {out}")
    summary: dict[str, Any] = {"keys": sorted(out)}
    data = out.get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict) and "embedding" in data[0]:
        summary.update(items=len(data), dimensions=len(data[0]["embedding"]))
    log(f"smoke invocation ok: {summary}")
    return summary


def smoke_check(runtime: Any, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    return smoke_summary(endpoint, invoke(runtime, endpoint, body))


def async_input_location(async_config: dict[str, Any], suffix: str) -> str:
    """Where request bodies go: beside the endpoint's answers, under ``ember-inputs/``."""
    bucket, prefix = parse_s3_url(async_config["OutputConfig"]["S3OutputPath"].rstrip("/") + "/")
    key = "/".join(p for p in (prefix.strip("/"), "ember-inputs", f"{suffix}.json") if p)
    return f"s3://{bucket}/{key}"


def smoke(args: argparse.Namespace, clients: Clients, name: str, async_cfg: Any) -> Any:
    body = json.loads(args.smoke_body)
    if not async_cfg:
        return smoke_check(clients.runtime, name, body)
    out = invoke_async(
        clients,
        name,
        body,
        async_input_location(async_cfg, stamp()),
        timeout_s=args.wait_timeout,
        poll_s=args.poll_seconds,
    )
    return smoke_summary(name, out)


def cmd_invoke(args: argparse.Namespace, clients: Clients) -> Any:
    """Send one body; the answer is printed as-is. An asynchronous endpoint gets it through
    S3 (``--input-location`` or beside its answers) and the answer is awaited."""
    name = check_name(args.name)
    if args.body_file:
        with open(args.body_file, "rb") as f:
            body = json.loads(f.read())
    else:
        body = json.loads(args.body)
    _, config, _ = current(clients.sagemaker, name)
    async_cfg = config.get("AsyncInferenceConfig")
    if not async_cfg:
        return invoke(clients.runtime, name, body)
    location = args.input_location or async_input_location(async_cfg, stamp())
    return invoke_async(
        clients, name, body, location, timeout_s=args.wait_timeout, poll_s=args.poll_seconds
    )
