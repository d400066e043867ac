"""What every deploy.py command shares: AWS clients, names, the error type, logging."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import boto3

# SageMaker resource names: 63 characters of [a-zA-Z0-9-]; we append "-<17-digit stamp>".
_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
STAMP_DIGITS = 17
MAX_NAME = 63 - (STAMP_DIGITS + 1)


class DeployError(RuntimeError):
    """A deployment step failed; the message says which and what to do next."""


@dataclass(frozen=True)
class Clients:
    """The AWS clients the commands use; injectable so tests can stub them."""

    sagemaker: Any
    runtime: Any
    s3: Any
    autoscaling: Any = None

    @classmethod
    def create(cls, region: str | None) -> Clients:
        session = boto3.session.Session(region_name=region)
        return cls(
            sagemaker=session.client("sagemaker"),
            runtime=session.client("sagemaker-runtime"),
            s3=session.client("s3"),
            autoscaling=session.client("application-autoscaling"),
        )


def log(message: str) -> None:
    """Progress goes to stderr so stdout stays one machine-readable JSON summary."""
    print(f"[ember-sagemaker] {message}", file=sys.stderr, flush=True)


def stamp() -> str:
    """UTC time to the millisecond: unique enough for names created by one operator, and
    sortable, so an older model or endpoint config is told apart by its name alone."""
    now = time.time()
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"


def stamped(base_name: str, suffix: str) -> str:
    return f"{base_name}-{suffix}"


def stamp_of(base_name: str, resource_name: str) -> str | None:
    """The stamp of ``<base_name>-<stamp>``, or None when the name is not one of ours."""
    prefix = f"{base_name}-"
    rest = resource_name[len(prefix) :] if resource_name.startswith(prefix) else ""
    return rest if len(rest) == STAMP_DIGITS and rest.isdigit() else None


def check_name(name: str) -> str:
    """Fail before any AWS call rather than after an upload if the name is unusable."""
    if not _NAME_RE.match(name) or len(name) > MAX_NAME:
        raise DeployError(
            f"invalid --name {name!r}: use letters, digits and '-', at most {MAX_NAME} characters"
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


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` to (bucket, key)."""
    if not url.startswith("s3://") or "/" not in url[len("s3://") :]:
        raise DeployError(f"expected an s3://bucket/key URL, got {url!r}")
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key
