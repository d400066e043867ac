"""Infinity's flags and INFINITY_* variables resolve in ember.config's one place: each sets
an Ember setting, or warns once what Ember does instead; none is dropped silently."""

from __future__ import annotations

import pytest

from ember.cli import build_parser, settings_from_args
from ember.config import ServerSettings, settings_from_env
from ember.errors import ConfigError
from ember.infinity_options import INFINITY_OPTIONS, infinity_settings
from tests.support import REPO


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what each test sets: no inherited EMBER_* or INFINITY_* variable."""
    import os

    for name in list(os.environ):
        if name.startswith(("EMBER_", "INFINITY_")):
            monkeypatch.delenv(name)


def _serve(*argv: str) -> ServerSettings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_variables_set_settings_with_per_model_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINITY_MODEL_ID", "org/a;org/b;")  # Infinity allows the trailing ;
    monkeypatch.setenv("INFINITY_SERVED_MODEL_NAME", "a;b")
    monkeypatch.setenv("INFINITY_BATCH_SIZE", "8;4")
    monkeypatch.setenv("INFINITY_ENGINE", "optimum;ctranslate2")
    monkeypatch.setenv("INFINITY_POOLING_METHOD", "mean")
    monkeypatch.setenv("INFINITY_DEVICE", "tensorrt")
    monkeypatch.setenv("INFINITY_PORT", "8123")
    monkeypatch.setenv("INFINITY_URL_PREFIX", "/v1")
    monkeypatch.setenv("INFINITY_API_KEY", "secret")
    monkeypatch.setenv("INFINITY_PERMISSIVE_CORS", "yes")
    monkeypatch.setenv("INFINITY_LOG_LEVEL", "trace")
    monkeypatch.setenv("INFINITY_QUEUE_SIZE", "100")
    monkeypatch.setenv("INFINITY_MAX_CLIENT_BATCH_SIZE", "16")
    settings = settings_from_env()
    specs = settings.model_specs()
    assert [(s.model_id, s.served_model_name) for s in specs] == [("org/a", "a"), ("org/b", "b")]
    assert [(s.max_batch_size, s.backend, s.pooling, s.device) for s in specs] == [
        (8, "onnx", "mean", "cuda"),
        (4, "ct2", "mean", "cuda"),
    ]
    assert [s.max_queue_size for s in specs] == [100, 100]
    assert (settings.port, settings.url_prefix, settings.api_key) == (8123, "/v1", "secret")
    assert (settings.cors_allow_origin, settings.log_level) == ("*", "debug")
    assert settings.max_client_batch_size == 16
    assert settings.compat_warnings == []


def test_ember_variables_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINITY_PORT", "8123")
    monkeypatch.setenv("INFINITY_BATCH_SIZE", "8")
    monkeypatch.setenv("INFINITY_API_KEY", "from-infinity")
    monkeypatch.setenv("EMBER_MAX_BATCH_SIZE", "16")  # EMBER_* beats INFINITY_*
    settings = _serve("--port", "9000")  # a flag beats both
    assert settings.port == 9000
    assert settings.model_specs()[0].max_batch_size == 16
    assert settings.api_key == "from-infinity"
    # Infinity's own flag beats EMBER_* too, as any flag does.
    assert _serve("--batch-size", "2").model_specs()[0].max_batch_size == 2


def test_v2_command_line_parses_to_ember_settings() -> None:
    settings = settings_from_args(
        build_parser().parse_args(
            [
                "v2",
                "--model-id",
                "org/a",
                "--model-id",
                "org/b",
                "--served-model-name",
                "a",
                "--served-model-name",
                "b",
                "--batch-size",
                "8",
                "--engine",
                "optimum",
                "--engine",
                "torch",
                "--pooling-method",
                "cls",
                "--dtype",
                "float32",
                "--compile",
                "--no-trust-remote-code",
                "--permissive-cors",
                "--url-prefix",
                "/v1",
                "--proxy-root-path",
                "/api",
                "--log-level",
                "critical",
                "--no-model-warmup",
                "--bettertransformer",
                "--device-id",
                "0,1",
            ]
        )
    )
    specs = settings.model_specs()
    assert [(s.served_model_name, s.backend, s.max_batch_size, s.pooling) for s in specs] == [
        ("a", "onnx", 8, "cls"),
        ("b", "torch", 8, "cls"),
    ]
    assert settings.torch_compile and not settings.trust_remote_code
    assert (settings.cors_allow_origin, settings.url_prefix, settings.proxy_root_path) == (
        "*",
        "/v1",
        "/api",
    )
    assert settings.log_level == "error"
    assert [line.split("=")[0] for line in settings.compat_warnings] == [
        "--model-warmup",
        "--device-id",
        "--bettertransformer",
    ]
    assert "always warms" in settings.compat_warnings[0]


def test_values_ember_already_has_do_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ember does anyway is no difference to warn about (Infinity's defaults are sent
    by deployments that never chose them)."""
    settings = _serve(
        "--model-warmup",
        "--no-bettertransformer",
        "--no-vector-disk-cache",
        "--lengths-via-tokenize",
        "--embedding-dtype",
        "float32",
    )
    assert settings.compat_warnings == []
    monkeypatch.setenv("INFINITY_ANONYMOUS_USAGE_STATS", "false")
    monkeypatch.setenv("INFINITY_VECTOR_DISK_CACHE", "true;false")
    monkeypatch.setenv("INFINITY_CALIBRATION_DATASET_URL", "https://example.invalid/x.txt")
    warnings = settings_from_env().compat_warnings
    assert [w.split("=")[0] for w in warnings] == [
        "INFINITY_VECTOR_DISK_CACHE",
        "INFINITY_CALIBRATION_DATASET_URL",
    ]


def test_compile_warns_where_it_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _serve("--compile", "--engine", "ctranslate2")
    assert not settings.torch_compile
    assert settings.compat_warnings == [
        "--compile=true: applies to the torch backend only; Ember runs ct2 here, uncompiled"
    ]
    monkeypatch.setenv("INFINITY_COMPILE", "true")
    assert settings_from_env(backend="torch").torch_compile
    assert settings_from_env().torch_compile  # auto picks torch for it


def test_every_option_is_handled_and_bad_values_are_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of Infinity's variables either sets its setting or warns; a value Ember cannot
    take is an error naming the variable, not a silent default."""
    for option in INFINITY_OPTIONS:
        settings, warnings = infinity_settings({}, {f"INFINITY_{option.name.upper()}": "1"}, {})
        if option.setting is not None:
            assert list(settings) == [option.setting] and not warnings, option.name
        else:
            quiet = option.switch and option.honoured == "true"  # "1" is what Ember does
            assert not settings and len(warnings) == (0 if quiet else 1), option.name
    monkeypatch.setenv("INFINITY_ENGINE", "debugengine")
    with pytest.raises(ConfigError, match="--backend must be one of"):
        settings_from_env().model_specs()
    monkeypatch.delenv("INFINITY_ENGINE")
    monkeypatch.setenv("INFINITY_PORT", "eighty")
    with pytest.raises(ConfigError, match="INFINITY_PORT"):
        settings_from_env()


def test_migration_page_lists_every_option() -> None:
    page = (REPO / "docs" / "migrating-from-infinity.md").read_text()
    for option in INFINITY_OPTIONS:
        if option.flag:
            assert f"`--{option.name.replace('_', '-')}`" in page, option.name
        assert f"`INFINITY_{option.name.upper()}`" in page, option.name
    assert "docs/migrating-from-infinity.md" in (REPO / "README.md").read_text()


def test_an_option_shares_its_name_only_with_the_setting_it_sets() -> None:
    """`ember serve` adds Infinity's flags not named as an Ember setting
    (``infinity_cli_options``, which reads no ServerSettings: ember.config reads it)."""
    fields = ServerSettings.model_fields
    for option in INFINITY_OPTIONS:
        assert option.setting is None or option.setting in fields, option.name
        assert (option.name in fields) == (option.setting == option.name), option.name
