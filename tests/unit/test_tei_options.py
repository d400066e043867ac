"""`ember tei`: every text-embeddings-router option, as a flag and as its variable."""

from __future__ import annotations

import pytest

from ember.cli import build_parser, settings_from_tei_args
from ember.errors import ConfigError
from ember.tei_options import TEI_OPTIONS, tei_settings

# option -> (what a TEI deployment passes, the Ember setting, what Ember gets): written out,
# not read off the table, so a changed mapping fails here.
MAPPED = {
    "model_id": ("BAAI/bge-small-en-v1.5", "model_id", "BAAI/bge-small-en-v1.5"),
    "revision": ("refs/pr/2", "revision", "refs/pr/2"),
    "dtype": ("float16", "dtype", "float16"),
    "served_model_name": ("bge", "served_model_name", "bge"),
    "pooling": ("last-token", "pooling", "last"),
    "max_batch_tokens": ("16384", "max_batch_tokens", "16384"),
    "max_batch_requests": ("64", "max_batch_size", "64"),
    "max_client_batch_size": ("32", "max_client_batch_size", "32"),
    "hostname": ("0.0.0.0", "host", "0.0.0.0"),
    "port": ("80", "port", "80"),
    "payload_limit": ("2000000", "payload_limit", "2000000"),
    "api_key": ("secret", "api_key", "secret"),
    "json_output": ("true", "json_logs", "true"),
    "otlp_endpoint": ("http://localhost:4317", "otlp_endpoint", "http://localhost:4317"),
    "cors_allow_origin": ("https://a.example", "cors_allow_origin", "https://a.example"),
}
ENVIRON = {
    "hf_token": ("hf_abc", "HF_TOKEN"),
    "hf_api_token": ("hf_abc", "HF_TOKEN"),
    "huggingface_hub_cache": ("/data", "HF_HUB_CACHE"),
    "otlp_service_name": ("embeddings", "OTEL_SERVICE_NAME"),
}
WARNED = {
    "tokenization_workers": "8",
    "max_concurrent_requests": "512",
    "uds_path": "/tmp/text-embeddings-inference-server",
    "prometheus_port": "9000",
    "disable_spans": "false",
}
REFUSED = {
    "default_prompt_name": "query",
    "default_prompt": "query: ",
    "dense_path": "2_Dense_1024",
    "auto_truncate": "false",
}


def test_every_router_option_is_covered_here() -> None:
    covered = {*MAPPED, *ENVIRON, *WARNED, *REFUSED, "auto_truncate", "disable_spans"}
    assert {o.name for o in TEI_OPTIONS} == covered


@pytest.mark.parametrize("name", sorted(MAPPED))
def test_a_mapped_option_sets_its_setting_as_flag_and_as_variable(name: str) -> None:
    given, setting, want = MAPPED[name]
    by_flag = tei_settings({name: given}, {})
    by_env = tei_settings({}, {name.upper(): given})
    for resolved in (by_flag, by_env):
        assert str(resolved.settings[setting]) == want
        assert not resolved.warnings and not resolved.environ


@pytest.mark.parametrize("name", sorted(ENVIRON))
def test_hub_and_tracing_options_set_the_variables_their_libraries_read(name: str) -> None:
    given, variable = ENVIRON[name]
    assert tei_settings({name: given}, {}).environ == {variable: given}
    assert tei_settings({}, {name.upper(): given}).environ == {variable: given}


@pytest.mark.parametrize("name", sorted(WARNED))
def test_an_option_ember_does_otherwise_warns_in_one_line(name: str) -> None:
    resolved = tei_settings({name: WARNED[name]}, {})
    assert len(resolved.warnings) == 1 and "\n" not in resolved.warnings[0]
    assert resolved.warnings[0].startswith(f"--{name.replace('_', '-')}={WARNED[name]}: ")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_option_ember_cannot_honour_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        tei_settings({}, {name.upper(): REFUSED[name]})
    assert str(info.value).startswith(name.upper()) and "\n" not in str(info.value)


def test_values_ember_does_anyway_pass_quietly() -> None:
    resolved = tei_settings({"auto_truncate": "true", "disable_spans": "true"}, {})
    assert not resolved.warnings and set(resolved.settings) == {"port"}


@pytest.mark.parametrize(
    ("name", "value"), [("dtype", "float8"), ("pooling", "splade2"), ("json_output", "maybe")]
)
def test_a_value_outside_teis_own_is_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"--{name.replace('_', '-')} \\({name.upper()}\\)"):
        tei_settings({name: value}, {})


def test_flags_beat_variables_and_the_port_defaults_to_the_routers() -> None:
    resolved = tei_settings({"port": "8080"}, {"PORT": "80", "MODEL_ID": "m"})
    assert resolved.settings == {"port": "8080", "model_id": "m"}
    assert tei_settings({}, {}).settings == {"port": 3000}
    assert tei_settings({}, {"EMBER_PORT": "7997"}).settings == {}  # Ember's own, then


def test_the_command_line_as_teis_readme_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PORT", "EMBER_PORT", "MODEL_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", "/before")  # restored after the test
    args = build_parser().parse_args(
        ["tei", "--model-id", "BAAI/bge-large-en-v1.5", "-p", "8080", "--json-output",
         "--auto-truncate", "--cors-allow-origin", "https://a", "--cors-allow-origin", "https://b",
         "--huggingface-hub-cache", "/data"]
    )  # fmt: skip
    settings = settings_from_tei_args(args)
    assert settings.model_id == "BAAI/bge-large-en-v1.5" and settings.port == 8080
    assert settings.json_logs is True and settings.cors_allow_origin == "https://a,https://b"
    import os

    assert os.environ["HF_HUB_CACHE"] == "/data"


def test_no_model_is_refused_as_the_router_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MODEL_ID", "EMBER_MODEL_ID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=r"--model-id \(MODEL_ID\) is required"):
        settings_from_tei_args(build_parser().parse_args(["tei"]))
