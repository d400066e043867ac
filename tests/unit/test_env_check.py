"""No silent defaults: variables that set nothing are named, PORT is honoured, and --help
says each setting's default in a unit that fits it."""

from __future__ import annotations

import pytest

from ember.cli import UNITS, build_parser
from ember.config import ServerSettings, settings_from_env
from ember.env_check import environment_notes
from ember.errors import ConfigError

FIELDS = ServerSettings.model_fields


def test_a_misspelt_ember_variable_names_the_nearest_setting() -> None:
    notes = environment_notes({"EMBER_MODLE_ID": "BAAI/bge-small-en-v1.5"}, FIELDS)
    assert notes == [
        "EMBER_MODLE_ID is not a setting Ember reads (did you mean EMBER_MODEL_ID?); "
        "it sets nothing"
    ]
    far = environment_notes({"EMBER_ZZZ": "1"}, FIELDS)
    assert len(far) == 1 and "`ember serve --help` lists them" in far[0]


def test_settings_and_platform_knobs_are_not_named() -> None:
    environ = {
        "EMBER_MODEL_ID": "m",
        "ember_port": "1",  # read case-insensitively, as the settings read it
        "EMBER_MODAL_GPU": "H100",
        "EMBER_RUNPOD_CONCURRENCY": "4",
        "EMBER_REQUIRE_IMAGES": "1",
        "HOSTNAME": "pod-7",
        "PORT": "8080",
        "HF_TOKEN": "hf_x",
    }
    assert environment_notes(environ, FIELDS) == []


def test_teis_variables_under_serve_say_which_command_reads_them() -> None:
    notes = environment_notes({"MODEL_ID": "BAAI/bge-small-en-v1.5", "AUTO_TRUNCATE": "1"}, FIELDS)
    assert notes == [
        "AUTO_TRUNCATE is text-embeddings-router's variable, read by `ember tei`; "
        "`ember serve` ignores it (no such setting)",
        "MODEL_ID is text-embeddings-router's variable, read by `ember tei`; "
        "`ember serve` ignores it (it reads EMBER_MODEL_ID)",
    ]
    assert environment_notes({"MODEL_ID": "m"}, FIELDS, command="tei") == []


def test_the_server_logs_them_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MAX_BATCH_TOKEN", "4096")
    assert any("EMBER_MAX_BATCH_TOKENS?" in w for w in settings_from_env().compat_warnings)


def test_port_is_honoured_where_ember_port_is_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_PORT", raising=False)
    monkeypatch.setenv("PORT", "8080")
    assert settings_from_env().port == 8080
    assert settings_from_env(port=9000).port == 9000  # a flag wins
    monkeypatch.setenv("EMBER_PORT", "7000")
    assert settings_from_env().port == 7000  # Ember's own variable wins
    monkeypatch.delenv("EMBER_PORT")
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(ConfigError, match="PORT='eighty' is not a port number"):
        settings_from_env()
    monkeypatch.delenv("PORT")
    assert settings_from_env().port == 7997


def _serve_help() -> str:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return serve.format_help()


def test_help_shows_each_default_and_a_unit_that_fits() -> None:
    text = " ".join(_serve_help().split())
    assert "--max-image-aspect RATIO" in text and "--max-image-aspect SECONDS" not in text
    assert "--request-timeout SECONDS" in text and "--payload-limit BYTES" in text
    assert "--max-batch-tokens TOKENS" in text and "--min-body-rate BYTES/S" in text
    assert "[default 7997; env EMBER_PORT]" in text and "[default 2000000; env" in text
    for name, field in FIELDS.items():
        if field.annotation is float and name not in UNITS:
            # a float without a unit of its own is shown as SECONDS: it must be one
            assert "timeout" in name or "seconds" in name, name
