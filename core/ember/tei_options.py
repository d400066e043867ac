"""text-embeddings-router's flags and variables, as Ember settings: ``ember tei``.

A TEI deployment moves over by changing the command (or the image, ``--target tei``), not
its flags or environment: each of the router's options (TEI 1.8, ``router/src/main.rs``)
is read here under its own flag (``--model-id``) and variable (``MODEL_ID``), and becomes
the Ember setting named, an environment variable of the library that reads it (the hub
token and cache), a one-line warning saying what Ember does instead, or a one-line refusal
where carrying on would serve something else than asked. Read by the CLI only: the bare
names (``PORT``, ``API_KEY``) are TEI's under ``ember tei`` and nobody's under ``ember
serve`` (which names them in a warning, ``ember.env_check``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember.config_values import env_var, flag
from ember.errors import ConfigError

TEI_TRUE = frozenset({"true", "1", "yes", "on"})
TEI_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True)
class TeiOption:
    """One of the router's options: ``--name`` (and ``short``), variable ``NAME``."""

    name: str
    setting: str | None  # the Ember setting it sets; None: see `environ`, `refused`, or a warning
    note: str  # how it maps (the table in docs), or the warning / refusal itself
    values: Mapping[str, str] = field(default_factory=dict)  # TEI's value -> Ember's
    allowed: frozenset[str] | None = None  # values taken; another is refused (one line)
    switch: bool = False  # a bare flag is true; a variable reads true|false
    honoured: str | None = None  # the one value Ember does anyway: given, no warning
    strict: bool = False  # with `honoured`: another value is refused, not warned of
    environ: str | None = None  # sets this environment variable (the hub client reads it)
    refused: bool = False  # given at all: refused
    many: bool = False  # may be given more than once (joined with commas)
    short: str | None = None
    metavar: str = "VALUE"

    @property
    def env(self) -> str:
        return self.name.upper()

    def read(self, raw: Any) -> str:
        """The value as Ember takes it, or a ConfigError naming the flag and variable."""
        text = ",".join(map(str, raw)) if isinstance(raw, (list, tuple)) else str(raw)
        text = text.strip()
        if self.switch:
            lowered = text.lower()
            if lowered not in TEI_TRUE | TEI_FALSE:
                raise ConfigError(f"{self.source()}: true or false, got {text!r}")
            text = "true" if lowered in TEI_TRUE else "false"
        key = text.lower()
        if self.allowed is not None and key not in self.allowed and key not in self.values:
            taken = sorted({*self.allowed, *self.values})
            raise ConfigError(
                f"{self.source()} {text!r}: ember tei takes {', '.join(taken)} ({self.note})"
            )
        return self.values.get(key, text)

    def source(self) -> str:
        return f"{flag(self.name)} ({self.env})"


TEI_OPTIONS: tuple[TeiOption, ...] = (
    TeiOption("model_id", "model_id", "a hub id or a local directory", metavar="ID"),
    TeiOption("revision", "revision", "same"),
    TeiOption(
        "tokenization_workers",
        None,
        "Ember tokenises on its forward threads, which --forward-workers sizes",
        metavar="N",
    ),
    TeiOption(
        "dtype",
        "dtype",
        "TEI's values; float16 runs on a GPU",
        allowed=frozenset({"float16", "float32", "bfloat16"}),
    ),
    TeiOption("served_model_name", "served_model_name", "same", metavar="NAME"),
    TeiOption(
        "pooling",
        "pooling",
        "last-token is Ember's last; splade is found from the model's files, as "
        "Ember serves a SPLADE model's /embed_sparse",
        values={"last-token": "last", "splade": "auto"},
        allowed=frozenset({"cls", "mean"}),
    ),
    TeiOption(
        "max_concurrent_requests",
        None,
        "Ember bounds what waits by queued inputs per model (--max-queue-size, 429 past it) "
        "and open connections (--max-connections), not by requests",
        metavar="N",
    ),
    TeiOption(
        "max_batch_tokens",
        "max_batch_tokens",
        "a batch's padded cost, longest x count, on padded backends; its real tokens on "
        "packed ones",
        metavar="N",
    ),
    TeiOption(
        "max_batch_requests",
        "max_batch_size",
        "counts inputs, not requests",
        metavar="N",
    ),
    TeiOption("max_client_batch_size", "max_client_batch_size", "same", metavar="N"),
    TeiOption(
        "auto_truncate",
        None,
        "Ember's TEI routes truncate unless a request says truncate=false; "
        "--auto-truncate false (refusing long inputs by default) is not offered",
        switch=True,
        honoured="true",
        strict=True,
    ),
    TeiOption(
        "default_prompt_name",
        None,
        "Ember applies no server-wide prompt: send prompt_name with each request",
        refused=True,
        metavar="NAME",
    ),
    TeiOption(
        "default_prompt",
        None,
        "Ember applies no server-wide prompt: put it in the inputs or use prompt_name",
        refused=True,
        metavar="TEXT",
    ),
    TeiOption(
        "dense_path",
        None,
        "Ember reads the Dense modules that modules.json lists; another path is not offered",
        refused=True,
        metavar="PATH",
    ),
    TeiOption("hf_api_token", None, "HF_TOKEN, read by the hub client", environ="HF_TOKEN"),
    TeiOption("hf_token", None, "HF_TOKEN, read by the hub client", environ="HF_TOKEN"),
    TeiOption("hostname", "host", "same", metavar="ADDRESS"),
    TeiOption(
        "port",
        "port",
        "default 3000 as the router's; the tei image sets 80",
        short="-p",
        metavar="PORT",
    ),
    TeiOption(
        "uds_path",
        None,
        "Ember runs no internal gRPC backend, so it opens no socket there",
        metavar="PATH",
    ),
    TeiOption(
        "huggingface_hub_cache",
        None,
        "HF_HUB_CACHE, where the hub client keeps downloads",
        environ="HF_HUB_CACHE",
        metavar="PATH",
    ),
    TeiOption("payload_limit", "payload_limit", "bytes", metavar="BYTES"),
    TeiOption("api_key", "api_key", "Authorization: Bearer <key>", metavar="KEY"),
    TeiOption("json_output", "json_logs", "same", switch=True),
    TeiOption(
        "disable_spans",
        None,
        "Ember's log lines carry no span fields",
        switch=True,
        honoured="true",
    ),
    TeiOption("otlp_endpoint", "otlp_endpoint", "OTLP over gRPC", metavar="URL"),
    TeiOption(
        "otlp_service_name",
        None,
        "OTEL_SERVICE_NAME, read by the OpenTelemetry SDK",
        environ="OTEL_SERVICE_NAME",
        metavar="NAME",
    ),
    TeiOption(
        "prometheus_port",
        None,
        "Ember serves /metrics on its own port (--port), not on a second one",
        metavar="PORT",
    ),
    TeiOption(
        "cors_allow_origin",
        "cors_allow_origin",
        "repeats joined with commas",
        many=True,
        metavar="ORIGIN",
    ),
)

TEI_BY_ENV = {option.env: option for option in TEI_OPTIONS}
TEI_DEFAULT_PORT = 3000  # the router's; TEI's images set PORT=80, as Ember's tei stage does


@dataclass
class TeiSettings:
    """What ``ember tei`` resolved: Ember settings, variables to set for the libraries
    that read them, and one warning per option Ember does otherwise."""

    settings: dict[str, Any] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def tei_settings(flags: Mapping[str, Any], environ: Mapping[str, str]) -> TeiSettings:
    """The router's flags (by option name, as parsed) over its variables, as Ember's.

    Raises ConfigError, in one line, for an option Ember cannot honour.
    """
    out = TeiSettings()
    for option in TEI_OPTIONS:
        given = option.name in flags
        raw = flags[option.name] if given else environ.get(option.env)
        if raw is None or (not given and not str(raw).strip()):
            continue
        source = flag(option.name) if given else option.env
        if option.refused:
            raise ConfigError(f"{source}: {option.note}")
        value = option.read(raw)
        if option.setting is not None:
            out.settings.setdefault(option.setting, value)
        elif option.environ is not None:
            out.environ.setdefault(option.environ, value)
        elif option.honoured is None or value.lower() != option.honoured:
            if option.strict:
                raise ConfigError(f"{source}={value}: {option.note}")
            out.warnings.append(f"{source}={value}: {option.note}")
    if "port" not in out.settings and not environ.get(env_var("port"), "").strip():
        out.settings["port"] = TEI_DEFAULT_PORT
    return out


def tei_table() -> str:
    """The migration page's table of every router option, generated (a test keeps the
    page equal to it)."""
    rows = ["| TEI flag | variable | in Ember |", "| --- | --- | --- |"]
    for option in TEI_OPTIONS:
        if option.refused:
            meaning = f"refused: {option.note}"
        elif option.setting is not None:
            same = option.note == "same"
            meaning = f"`{flag(option.setting)}`" + ("" if same else f" ({option.note})")
        elif option.environ is not None:
            meaning = f"sets {option.note}"
        elif option.honoured is not None:
            otherwise = "refused" if option.strict else "warns"
            meaning = f"{option.honoured}: what Ember does; otherwise {otherwise} ({option.note})"
        else:
            meaning = f"accepted, warns: {option.note}"
        names = f"`{flag(option.name)}`" + (f", `{option.short}`" if option.short else "")
        rows.append(f"| {names} | `{option.env}` | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)
