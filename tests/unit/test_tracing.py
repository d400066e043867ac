"""Tracing's switch: off (and OpenTelemetry never imported) unless an endpoint is set, the
exporter's protocol from the standard variables, a clear error where the extra is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ember import tracing
from ember.config import OTEL_ENDPOINTS, OTEL_PROTOCOLS, otlp_export, settings_from_env
from ember.errors import ConfigError
from tests.support import REPO, child_env


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*OTEL_ENDPOINTS, *OTEL_PROTOCOLS, "EMBER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def test_off_unless_an_endpoint_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert otlp_export(settings_from_env()) is None
    flag = settings_from_env(otlp_endpoint="http://127.0.0.1:4317")
    assert otlp_export(flag) == ("http://127.0.0.1:4317", "grpc")
    # The standard variable alone turns it on; the SDK reads its value itself.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # wins
    assert otlp_export(settings_from_env()) == (None, "http/protobuf")


def test_a_protocol_without_an_exporter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="grpc or http/protobuf"):
        otlp_export(settings_from_env(otlp_endpoint="http://127.0.0.1:4318"))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_without_the_extra_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)  # not installed
    monkeypatch.setattr(tracing, "_tracer", None)
    with pytest.raises(ConfigError, match=r"pip install 'ember\[otel\]'"):
        tracing.configure(("http://127.0.0.1:4318", protocol))
    assert not tracing.enabled()


@pytest.mark.parametrize(("protocol", "module"), [("grpc", "grpc"), ("http/protobuf", "http")])
def test_the_protocol_picks_the_sdks_exporter(protocol: str, module: str) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the otel extra")
    tracer = tracing.Tracer("http://127.0.0.1:4317", protocol)  # connects to nothing yet
    try:
        assert type(tracer.exporter).__module__.startswith(
            f"opentelemetry.exporter.otlp.proto.{module}"
        )
    finally:
        tracer.provider.shutdown()


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    drop = ("EMBER_", "OTEL_")
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=child_env(env, drop_prefixes=drop),
        capture_output=True,
        text=True,
        timeout=120,
    )


# What the extra brings, and what start-up must not pay for without an endpoint. (FastAPI
# itself imports opentelemetry-api, for its own telemetry: that is FastAPI's, and no SDK.)
EXTRA_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto", "grpc")


def test_off_imports_nothing_of_the_sdk_or_exporters() -> None:
    """Start-up pays nothing: the server's app, the adapters' core and the job import no
    module of the SDK, the exporters, protobuf messages or gRPC when no endpoint is set."""
    done = _python(
        "import sys\n"
        "from ember.api.app import create_app\n"
        "import ember.platform, ember.jobs.runner\n"
        "create_app()\n"
        f"print(sorted(m for m in sys.modules if m.startswith({EXTRA_MODULES!r})))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_serve_with_an_endpoint_and_no_extra_exits_with_the_hint() -> None:
    done = _python(
        "import sys\n"
        "sys.modules['opentelemetry.sdk'] = None  # the extra not installed\n"
        "from ember.cli import main\n"
        "sys.exit(main(['serve', '--host', '127.0.0.1', '--port', '0']))\n",
        {"EMBER_OTLP_ENDPOINT": "http://127.0.0.1:4317"},
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'ember[otel]'" in done.stderr
