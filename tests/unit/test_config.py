"""Config resolves once: CLI flag > EMBER_* env > default; per-model values broadcast."""

from __future__ import annotations

import pytest

from ember.cli import build_parser, settings_from_args
from ember.config import ServerSettings, settings_from_env
from ember.errors import ConfigError


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
    ],
)
def test_bad_values_are_refused(field: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_env(model_id="a", **{field: value}).model_specs()


def test_duplicate_names_refused() -> None:
    with pytest.raises(ConfigError, match="unique"):
        settings_from_env(model_id="a;a").model_specs()
