"""Config resolves once: CLI flag > EMBER_* env > default; per-model values broadcast."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ember.cli import build_parser, settings_from_args
from ember.config import ServerSettings, settings_from_env
from ember.defaults import default_cache_dir
from ember.errors import ConfigError
from tests.support import REPO

CORE = REPO / "core" / "ember"


def test_defaults() -> None:
    settings = ServerSettings()
    assert settings.port == 7997
    (spec,) = settings.model_specs()
    assert spec.model_id == "" and spec.backend == "auto" and spec.max_batch_tokens == 8192


def test_env_and_broadcast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_ID", "a;b;c")
    monkeypatch.setenv("EMBER_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("EMBER_TASK", "embed;rerank;classify")
    monkeypatch.setenv("EMBER_PORT", "8123")
    settings = settings_from_env()
    specs = settings.model_specs()
    assert [s.model_id for s in specs] == ["a", "b", "c"]
    assert [s.max_batch_size for s in specs] == [16, 16, 16]
    assert [s.task for s in specs] == ["embed", "rerank", "classify"]
    assert settings.port == 8123


def test_cli_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_PORT", "8123")
    monkeypatch.setenv("EMBER_MODEL_ID", "from-env")
    args = build_parser().parse_args(
        ["serve", "--port", "9000", "--model-id", "x", "--model-id", "y", "--no-json-logs"]
    )
    settings = settings_from_args(args)
    assert settings.port == 9000
    assert [s.model_id for s in settings.model_specs()] == ["x", "y"]
    assert settings.json_logs is False


def test_mismatched_counts_are_refused() -> None:
    settings = settings_from_env(model_id="a;b;c", backend="torch;onnx")
    with pytest.raises(ConfigError, match="2 values for 3 models"):
        settings.model_specs()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("backend", "tensorflow", "backend"),
        ("device", "tpu", "device"),
        ("max_batch_tokens", "0", ">= 1"),
        ("max_batch_size", "many", "integer"),
        ("task", "summarize", "task"),
        ("forward_nice", "20", "--forward-nice must be 0-19"),
        ("forward_nice", "-1", "--forward-nice must be 0-19"),
    ],
)
def test_bad_values_are_refused(field: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_env(model_id="a", **{field: value}).model_specs()


def test_duplicate_names_refused() -> None:
    with pytest.raises(ConfigError, match="unique"):
        settings_from_env(model_id="a;a").model_specs()


def test_neuron_settings_reach_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NEURON_BATCH_SIZE", "4")
    monkeypatch.setenv("EMBER_NEURON_SEQUENCE_LENGTHS", "256, 64")
    monkeypatch.setenv("EMBER_NEURON_AUTO_CAST", "MatMul")
    monkeypatch.setenv("EMBER_NEURON_CORES", "2")
    (spec,) = settings_from_env(model_id="m").model_specs()
    assert spec.neuron_batch_size == 4
    assert spec.neuron_sequence_lengths == (64, 256)
    assert spec.neuron_auto_cast == "matmul"
    assert spec.neuron_cores == 2
    args = build_parser().parse_args(["serve", "--neuron-cores", "1", "--neuron-batch-size", "2"])
    (spec,) = settings_from_args(args).model_specs()
    assert (spec.neuron_cores, spec.neuron_batch_size) == (1, 2)  # the flag beats the env


def test_defaults_are_the_settings_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EMBER_NEURON_BATCH_SIZE", "EMBER_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    (spec,) = settings_from_env().model_specs()
    assert spec.neuron_batch_size == ServerSettings.model_fields["neuron_batch_size"].default
    assert spec.neuron_sequence_lengths is None and spec.neuron_cores is None
    assert spec.cache_dir is None and default_cache_dir() == Path.home() / ".cache" / "ember"
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert default_cache_dir() == Path("/xdg/ember")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--dtype", "float99"], "--dtype must be one of"),
        (["--neuron-auto-cast", "fp8"], "--neuron-auto-cast must be one of none|matmul|all"),
        (["--neuron-sequence-lengths", "1,64"], "--neuron-sequence-lengths: sequence lengths"),
        (["--neuron-batch-size", "0"], "--neuron-batch-size must be >= 1"),
    ],
)
def test_export_refuses_a_bad_option_as_serve_does(
    option: list[str], message: str, tmp_path: Path
) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ember", *argv, *option],
            capture_output=True,
            text=True,
            timeout=60,
        )

    serve = run("serve")
    export = run("export", "--backend", "onnx", "--output", str(tmp_path / "out"))
    assert serve.returncode == export.returncode == 2
    assert message in serve.stderr
    assert export.stderr == serve.stderr
    assert not (tmp_path / "out").exists()


def test_a_value_of_the_wrong_type_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NEURON_CORES", "two")
    with pytest.raises(ConfigError, match=r"--neuron-cores \(EMBER_NEURON_CORES\).*'two'"):
        settings_from_env()


def test_only_the_settings_read_ember_variables() -> None:
    """A module's own EMBER_* (or Infinity's INFINITY_*) read never reaches --help: every one
    goes through here."""
    reads = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*f?["'](EMBER|INFINITY)_""")
    offenders = [
        str(path.relative_to(CORE))
        for path in sorted(CORE.rglob("*.py"))
        if path.name != "config.py" and reads.search(path.read_text())
    ]
    assert offenders == []


def test_ember_env_reads_what_an_environment_sets_as_the_settings_do() -> None:
    """Adapters ask the core what was set (ember.config.ember_env) instead of parsing
    EMBER_* themselves: names case-insensitive, values stripped, empty ones unset."""
    env = {
        "EMBER_MODEL_ID": " a;b ",
        "ember_revision": "v2",
        "EMBER_BACKEND": "  ",
        "EMBER_MODAL_GPU": "L4",
        "EMBER_MODAL_SECRET": "",
        "HF_TOKEN": "x",
    }
    from ember.config import ember_env

    assert ember_env(env) == {"model_id": "a;b", "revision": "v2", "modal_gpu": "L4"}
    assert ember_env(env, "modal") == {"gpu": "L4"}
    assert ember_env({}, "bentoml") == {}
