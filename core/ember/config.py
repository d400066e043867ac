"""Configuration resolves here, once: CLI flag > ``EMBER_*`` env var > default.

Per-model options (model id, task, backend, batch limits, ...) take several values
separated by ``;`` (or a repeated CLI flag); a value given once is broadcast to every
model. The CLI parser and the docs' flag table (docs/reference/cli.md) are both generated
from ``ServerSettings`` so they cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ember.backend_table import BACKEND_NAMES
from ember.config_limits import reconcile_limits
from ember.config_values import (
    PER_MODEL_FIELDS,
    at_least_one,
    buckets,
    choice,
    env_var,
    flag,
    lane_weights,
    nice_level,
    split_values,
)
from ember.defaults import (
    CACHE_MAX_BYTES,
    DEFAULT_MODEL_NAME,
    NEURON_AUTO_CAST,
    NEURON_BATCH_SIZE,
    NEURON_BUCKETS,
)
from ember.errors import ConfigError
from ember.families.registry import INSTRUCTIONS
from ember.lanes import WEIGHTS
from ember.models.catalogue import (
    CatalogueEntry,
    Residence,
    ResidencyLimits,
    parse_bytes,
    read_models_dir,
    read_models_file,
)
from ember.models.spec import (
    FORWARD_NICE,
    MAX_BATCH_SIZE,
    MAX_BATCH_TOKENS,
    MAX_QUEUE_SIZE,
    POOLINGS,
    REQUEST_TIMEOUT,
    TASKS,
    ModelSpec,
)

if TYPE_CHECKING:
    from ember.media.limits import MediaLimits

BACKENDS = ("auto", *BACKEND_NAMES)
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
NEAR_EXACT_CHECKS = ("start", "background")  # when the near-exact check runs (near_exact)
# /v1/embeddings' vector types: Infinity's names for Cohere's types (ember.heads.quantize).
EMBEDDING_DTYPES = ("float32", "int8", "uint8", "binary", "ubinary")


def _per_model(description: str, default: str | None = None) -> Any:
    return Field(default=default, description=description, json_schema_extra={"per_model": True})


class ServerSettings(BaseSettings):
    """Everything `ember serve` can be told; also the embedded API's keyword arguments."""

    model_config = SettingsConfigDict(env_prefix="EMBER_", extra="ignore")

    model_id: str | None = _per_model(
        "Hugging Face hub id or local directory; repeat (or ';'-separate) to serve several. "
        f"Default: the packaged {DEFAULT_MODEL_NAME}."
    )
    served_model_name: str | None = _per_model("Name clients use in `model`; default: the id.")
    task: str | None = _per_model(
        "auto|embed|rerank|classify; auto detects from config.json.", "auto"
    )
    backend: str | None = _per_model(
        f"{'|'.join(BACKENDS)}; auto is onnx on CPU when onnxruntime is installed, "
        "else torch; numpy for static embeddings (an `ember export` directory: the backend "
        "that wrote it).",
        "auto",
    )
    device: str | None = _per_model("auto|cpu|cuda|mps.", "auto")
    dtype: str | None = _per_model(
        "auto|float32|float16|bfloat16|int8; auto is float16 on CUDA, float32 on CPU (under "
        "--backend auto: bf16 where the CPU has it natively and a probe finds it near-exact); "
        "int8 on a CPU is the fast tier (openvino int8 where the CPU has VNNI, its bf16 where "
        "it has AMX, which runs that faster, else onnx int8).",
        "auto",
    )
    near_exact_check: str = Field(
        "start",
        description="start|background: when a model's near-exact (bf16) check runs where its "
        "verdict is not cached under --cache-dir. start: before the model serves (each new "
        "container without a kept /data pays it: ~12 s for MiniLM on 2 cores); background: "
        "the model serves float32 at once and moves to bf16 when the check, run beside it, "
        "passes.",
    )
    pooling: str | None = _per_model("auto|cls|mean|last|max; auto reads 1_Pooling.", "auto")
    embedding_dtype: str | None = _per_model(
        f"{'|'.join(EMBEDDING_DTYPES)}: the type /v1/embeddings answers dense vectors in "
        "(Infinity's --embedding-dtype), computed as Cohere's output types "
        "(docs/api/cohere.md); base64 needs float32.",
        "float32",
    )
    revision: str | None = _per_model("Hub revision (branch, tag or commit).")
    max_batch_tokens: str | None = _per_model(
        "A batch closes before its padded cost (longest x count) passes this.",
        str(MAX_BATCH_TOKENS),
    )
    max_batch_size: str | None = _per_model(
        "A batch closes at this many texts.", str(MAX_BATCH_SIZE)
    )
    max_queue_size: str | None = _per_model(
        "Inputs queued per model; past it requests get 429 at once, and one larger than it 413.",
        str(MAX_QUEUE_SIZE),
    )
    instruction: str | None = _per_model(
        f"An LLM reranker's instruction ({INSTRUCTIONS}); auto is its card's (its saved "
        "default prompt). A request's `instruction` replaces it.",
        "auto",
    )
    request_timeout: float = Field(
        REQUEST_TIMEOUT, description="Seconds a request may wait; then 504."
    )
    lane_weights: str = Field(
        ",".join(f"{w:g}" for w in WEIGHTS),
        description="interactive,default,bulk: under saturation each waiting priority lane "
        "gets its weight's share of the tokens forwarded; a light lane goes first "
        "(docs/operations/lanes.md).",
    )
    bulk_batch_tokens: int = Field(
        0,
        description="A bulk-lane batch closes before its padded cost passes this, so that "
        "a query waits at most about one bulk batch; 0 = auto: 512 on CPU, a quarter of "
        "--max-batch-tokens on an accelerator.",
    )
    forward_workers: int = Field(
        0,
        description="Forward passes run at once per model on CPU (0 = auto: one per core up "
        "to 4 cores, then cores/4), each with cores/workers threads.",
    )
    forward_nice: int = Field(
        FORWARD_NICE,
        description="Nice increment (0-19) for the threads that load and run the models, "
        "so that under full load the event loop still answers at once (refusals, probes); "
        "0 runs them at the server's own priority. Linux only.",
    )
    torch_compile: bool = Field(
        False,
        description="torch backend: torch.compile the model (dynamic shapes) while loading; "
        "~40 s more to start. Served MiniLM on a 2-core CPU measured no faster (85 vs 85 "
        "sentences/s); measure on your hardware.",
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the hub.")
    cache_dir: str | None = Field(
        None,
        description="Where artifacts converted at load (ONNX, CTranslate2, Neuron) are kept; "
        "default $XDG_CACHE_HOME/ember, else ~/.cache/ember.",
    )
    neuron_batch_size: int = Field(
        NEURON_BATCH_SIZE,
        description="neuron: rows per call of a compiled graph, when compiling (`ember export`, "
        "or at load a model that is not an export).",
    )
    neuron_sequence_lengths: str | None = Field(
        None,
        description="neuron: comma-separated sequence lengths to compile a graph for each; "
        f"default {','.join(map(str, NEURON_BUCKETS))}, each capped at the model's maximum.",
    )
    neuron_auto_cast: str | None = Field(
        None,
        description=f"neuron: {'|'.join(NEURON_AUTO_CAST)}, the compiler's cast to bf16 when "
        "compiling; unset keeps float32.",
    )
    neuron_cores: int | None = Field(
        None,
        description="neuron: NeuronCores to load a copy of every graph on; default: the count "
        "given at export, else the cores visible (NEURON_RT_NUM_CORES, "
        "NEURON_RT_VISIBLE_CORES, /dev/neuron*).",
    )
    models_dir: str | None = Field(
        None,
        description="Serve every model in this directory (one per subdirectory, named after "
        "it), each loaded on its first request and unloaded when idle or evicted. See "
        "docs/operations/models-on-demand.md.",
    )
    models_file: str | None = Field(
        None,
        description="TOML catalogue of models loaded on demand, each with its own flags and "
        "`pin`, `load` (eager|lazy) and `idle_unload`. See docs/operations/models-on-demand.md.",
    )
    max_loaded: int = Field(
        0,
        ge=0,
        description="Models loaded at once; a load past it first unloads the least recently "
        "used idle unpinned model. 0 = no limit.",
    )
    memory_budget: str | None = Field(
        None,
        description="Memory the loaded models may take together (bytes, or 8GiB, 512MB): each "
        "model's resident memory measured around its load, device memory included; a load "
        "that would pass it unloads least recently used idle unpinned models first. Unset: "
        "no budget.",
    )
    idle_unload: float = Field(
        0.0,
        ge=0,
        description="Seconds an unpinned catalogue model may stay idle before it unloads (a "
        "model's own `idle_unload` wins, a request's `keep_alive` for what follows it). "
        "0 = never.",
    )
    load_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds a request waits for its model to load (and for room to load "
        "it); then 503.",
    )
    host: str = Field("0.0.0.0", description="Interface to bind.")
    port: int = Field(7997, description="Port to bind.")
    url_prefix: str | None = Field(
        None,
        description="Also serve the model routes and /models under this prefix (`/v1`: "
        "`/v1/rerank`, `/v1/classify`, ...), as Infinity's --url-prefix; they stay at the "
        "root too.",
    )
    proxy_root_path: str | None = Field(
        None,
        description="The path a reverse proxy serves this server under and strips before "
        "forwarding (ASGI root_path): /docs and the schema link through it.",
    )
    preload_only: bool = Field(
        False,
        description="Download every model, build its backend's artifact (ONNX, CTranslate2), "
        "load and warm it, then exit 0 without serving: for an image build step.",
    )
    api_key: str | None = Field(
        None, description="Require `Authorization: Bearer <key>` on model routes."
    )
    api_keys_file: str | None = Field(
        None,
        description="TOML file of API keys (SHA-256 hashed), each with a name, allowed models "
        "and routes, rate limits, a concurrency cap and its own usage; reloaded when it "
        "changes or on SIGHUP. Works beside --api-key. See docs/operations/keys.md.",
    )
    payload_limit: int = Field(
        2_000_000, description="Largest request body in bytes; larger gets 413."
    )
    header_timeout: float = Field(
        10.0,
        description="Seconds a connection may take to send a request's headers, from opening "
        "or from the previous response; then 408 and closed.",
    )
    body_timeout: float = Field(
        10.0, description="Seconds a request body may go without progress; then 408 and closed."
    )
    body_total_timeout: float = Field(
        60.0,
        description="Seconds a whole request body may take from the end of its headers, "
        "however it trickles; then 408 and closed.",
    )
    min_body_rate: int = Field(
        500,
        ge=0,
        description="Bytes a second a request body must average: it may take --body-timeout "
        "plus a second per this many bytes received, else 408 and closed (Apache's "
        "mod_reqtimeout MinRate); 0 = no minimum.",
    )
    max_connections: int = Field(
        1024,
        description="Connections open at once; more are answered 503 and closed at once.",
    )
    ops_connections: int = Field(
        8,
        ge=0,
        description="Connections kept past --max-connections for the operations routes: "
        "taken only when every ordinary one is, each serves one GET of /health, /livez, "
        "/ready, /metrics (or a platform's probe) and closes; a model route on one gets "
        "503. 0 = none.",
    )
    cors_allow_origin: str | None = Field(
        None,
        description="Origins browsers may call from, comma-separated (`*` for any); "
        "default: no CORS headers.",
    )
    max_client_batch_size: int = Field(
        2048, description="Most inputs (texts or documents) in one request; more gets 413."
    )
    accept_token_ids: bool = Field(
        True,
        description="Take token-id input on /v1/embeddings (OpenAI's lists of ints, read in "
        "the model's own vocabulary); --no-accept-token-ids answers it 400, as Infinity "
        "does: ids from a client that tokenised with another vocabulary (LangChain's "
        "tiktoken default) then fail loudly instead of embedding the wrong tokens.",
    )
    cache_entries: int = Field(
        0,
        ge=0,
        description="Embedding cache: keep the finished embeddings of up to this many inputs "
        "(per model, input and options; least recently used dropped first) and answer "
        "repeats without a forward pass; 0 = off. Embeddings only, not rerank or classify.",
    )
    cache_max_bytes: int = Field(
        CACHE_MAX_BYTES,
        ge=1,
        description="Embedding cache: most bytes its entries may hold (vectors, texts and "
        "0.5 KB per entry; default 256 MiB), whatever --cache-entries allows.",
    )
    allow_private_urls: bool = Field(
        False,
        description="Let image and audio URLs reach loopback, private, link-local and other "
        "non-public addresses (checked after DNS and at every redirect); off, they get 400.",
    )
    media_fetch_timeout: float = Field(
        10.0, description="Seconds one image or audio download may take in all; then 400."
    )
    max_media_bytes: int = Field(
        10 * 1024 * 1024,
        description="Largest image or audio item in bytes (URL downloads and data: URIs); "
        "larger gets 413.",
    )
    max_image_pixels: int = Field(
        40_000_000,
        description="Largest image in pixels (width x height, read from its header before "
        "decoding); larger gets 400.",
    )
    max_image_side: int = Field(
        16_384,
        description="Longest side of an image in pixels, read from its header; longer gets 400.",
    )
    max_image_aspect: float = Field(
        50.0,
        description="Largest ratio of an image's long side to its short side, read from its "
        "header (a shortest-edge resize keeps it); larger gets 400.",
    )
    max_decoding_pixels: int = Field(
        40_000_000,
        description="Pixels of images being decoded at once, server-wide (a larger image "
        "takes all of it); an image waits for room within the request's deadline.",
    )
    max_audio_seconds: float = Field(
        60.0, description="Longest audio clip in seconds; longer gets 400."
    )
    max_request_fetches: int = Field(
        8, description="Image or audio downloads one request runs at once; the rest wait."
    )
    max_request_media_bytes: int = Field(
        64 * 1024 * 1024,
        description="Bytes of all image or audio items of one request together (downloads "
        "and data: URIs); more gets 413.",
    )
    max_fetches: int = Field(
        64,
        description="Image or audio downloads at once, server-wide; a download waits for a "
        "slot within --media-fetch-timeout.",
    )
    max_fetched_bytes: int = Field(
        256 * 1024 * 1024,
        description="Bytes of downloaded media held at once, server-wide, until decoded; "
        "a request that would pass it gets 503.",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry: export traces over OTLP to this collector (a base URL, as "
        "OTEL_EXPORTER_OTLP_ENDPOINT: gRPC by default, http/protobuf posts to <url>/v1/traces "
        "when OTEL_EXPORTER_OTLP_PROTOCOL says so). Off unless this or an "
        "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set; needs `pip install 'ember[otel]'`.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="debug|info|warning|error."
    )
    json_logs: bool = Field(False, description="Log one JSON object per line.")
    _compat_warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def compat_warnings(self) -> list[str]:
        """What Infinity's flags and INFINITY_* variables asked for that Ember does
        otherwise, and the limits reconciled with another (``ember.config_limits``), one
        line each: the server logs them as it starts."""
        return self._compat_warnings

    def model_specs(self) -> list[ModelSpec]:
        """Split per-model values, broadcast single ones, and validate them."""
        raw = {name: split_values(getattr(self, name)) for name in PER_MODEL_FIELDS}
        count = max(len(raw["model_id"]), 1)
        for name, values in raw.items():
            if len(values) not in (0, 1, count):
                raise ConfigError(
                    f"--{name.replace('_', '-')} has {len(values)} values for {count} models; "
                    "give one (broadcast) or one per model."
                )
        specs = []
        for i in range(count):

            def pick(name: str, i: int = i) -> str | None:
                values = raw[name]
                if not values:
                    return None
                return values[i] if len(values) == count else values[0]

            specs.append(self._spec(pick))
        names = [s.served_model_name or s.model_id for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"served model names must be unique, got {names}")
        return specs

    def catalogue(self) -> list[tuple[ModelSpec, Residence]]:
        """Every served model and how it stays resident: the ``--model-id`` models (eager,
        pinned; none when a catalogue is given without them), then the catalogue's, each
        with its own flags over the ones given once on the command line."""
        entries = self.catalogue_entries()
        served = [] if entries and not self.model_id else self.model_specs()
        pairs = [(spec, Residence()) for spec in served]
        given = {name: split_values(getattr(self, name)) for name in PER_MODEL_FIELDS}
        broadcast = {name: values[0] for name, values in given.items() if len(values) == 1}
        for entry in entries:

            def pick(name: str, entry: CatalogueEntry = entry) -> str | None:
                if name == "served_model_name":
                    return entry.name
                return entry.options.get(name, broadcast.get(name))

            pairs.append((self._spec(pick), entry.residence))
        names = [s.served_model_name or s.model_id for s, _ in pairs]
        if len(set(names)) != len(names):
            raise ConfigError(f"served model names must be unique, got {names}")
        return pairs

    def catalogue_entries(self) -> list[CatalogueEntry]:
        """The models of ``--models-dir`` and ``--models-file`` (the file's win by name)."""
        idle = self.idle_unload or None
        entries = {}
        if self.models_dir:
            entries.update({e.name: e for e in read_models_dir(Path(self.models_dir), idle)})
        if self.models_file:
            options = tuple(f for f in PER_MODEL_FIELDS if f != "served_model_name")
            path = Path(self.models_file)
            entries.update({e.name: e for e in read_models_file(path, idle, options)})
        return list(entries.values())

    def residency_limits(self) -> ResidencyLimits:
        """``--max-loaded``, ``--memory-budget`` and ``--load-timeout`` as the engines take them."""
        try:
            budget = parse_bytes(self.memory_budget) if self.memory_budget else 0
        except ValueError as exc:
            raise ConfigError(f"--memory-budget: {exc}") from None
        return ResidencyLimits(
            max_loaded=self.max_loaded, memory_budget=budget, load_timeout=self.load_timeout
        )

    def _spec(self, pick: Any) -> ModelSpec:
        task = choice("task", pick("task") or "auto", ("auto", *TASKS))
        pooling = choice("pooling", pick("pooling") or "auto", ("auto", *POOLINGS))
        return ModelSpec(
            model_id=pick("model_id") or "",
            served_model_name=pick("served_model_name"),
            task=None if task == "auto" else task,  # type: ignore[arg-type]
            backend=choice("backend", pick("backend") or "auto", BACKENDS),
            device=choice("device", pick("device") or "auto", DEVICES),
            dtype=choice("dtype", pick("dtype") or "auto", DTYPES),
            near_exact_check=choice("near_exact_check", self.near_exact_check, NEAR_EXACT_CHECKS),
            pooling=None if pooling == "auto" else pooling,  # type: ignore[arg-type]
            embedding_dtype=choice(
                "embedding_dtype", pick("embedding_dtype") or "float32", EMBEDDING_DTYPES
            ),
            revision=pick("revision"),
            max_batch_tokens=_positive_int("max_batch_tokens", pick("max_batch_tokens")),
            max_batch_size=_positive_int("max_batch_size", pick("max_batch_size")),
            max_queue_size=_positive_int("max_queue_size", pick("max_queue_size")),
            request_timeout=self.request_timeout,
            lane_weights=lane_weights("lane_weights", self.lane_weights),
            bulk_batch_tokens=(
                at_least_one("bulk_batch_tokens", self.bulk_batch_tokens)
                if self.bulk_batch_tokens
                else None
            ),
            accept_token_ids=self.accept_token_ids,
            forward_workers=self.forward_workers,
            forward_nice=nice_level("forward_nice", self.forward_nice),
            torch_compile=self.torch_compile,
            trust_remote_code=self.trust_remote_code,
            cache_dir=Path(self.cache_dir) if self.cache_dir else None,
            neuron_batch_size=at_least_one("neuron_batch_size", self.neuron_batch_size),
            neuron_sequence_lengths=buckets(
                "neuron_sequence_lengths", self.neuron_sequence_lengths
            ),
            neuron_auto_cast=(
                choice("neuron_auto_cast", self.neuron_auto_cast, NEURON_AUTO_CAST)
                if self.neuron_auto_cast
                else None
            ),
            neuron_cores=(
                None
                if self.neuron_cores is None
                else at_least_one("neuron_cores", self.neuron_cores)
            ),
            media=self.media_limits(),
            instruction=None if pick("instruction") in (None, "auto") else pick("instruction"),
        )

    def media_limits(self) -> MediaLimits:
        from ember.media.limits import MediaLimits

        for name in MEDIA_POSITIVE:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        if self.max_image_aspect < 1:
            raise ConfigError(f"--max-image-aspect must be >= 1, got {self.max_image_aspect}")
        return MediaLimits(
            allow_private_urls=self.allow_private_urls,
            fetch_timeout=self.media_fetch_timeout,
            max_bytes=self.max_media_bytes,
            max_image_pixels=self.max_image_pixels,
            max_image_side=self.max_image_side,
            max_image_aspect=self.max_image_aspect,
            max_audio_seconds=self.max_audio_seconds,
            max_request_fetches=self.max_request_fetches,
            max_request_bytes=self.max_request_media_bytes,
            max_fetches=self.max_fetches,
            max_fetched_bytes=self.max_fetched_bytes,
            max_decoding_pixels=self.max_decoding_pixels,
        )


# Media settings a zero or negative value of would refuse every item.
MEDIA_POSITIVE = (
    "media_fetch_timeout",
    "max_media_bytes",
    "max_image_pixels",
    "max_image_side",
    "max_decoding_pixels",
    "max_audio_seconds",
    "max_request_fetches",
    "max_request_media_bytes",
    "max_fetches",
    "max_fetched_bytes",
)


def setting_default(name: str) -> Any:
    """A setting's default, as --help shows it: for code handed a spec built without
    settings (a field left None), so that no default is written twice."""
    return ServerSettings.model_fields[name].default


def _positive_int(name: str, value: str | None) -> int:
    value = value or setting_default(name)
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{flag(name)} must be an integer, got {value!r}") from None
    return at_least_one(name, number)


def ember_env(environ: Mapping[str, str] | None = None, platform: str = "") -> dict[str, str]:
    """What an environment sets through ``EMBER_*`` variables, by name, read as the settings
    read them: names case-insensitive, values stripped, an empty value setting nothing (the
    default holds). A setting's name (``EMBER_MODEL_ID`` is ``model_id``), or with
    ``platform`` that platform's own knobs (``EMBER_MODAL_GPU`` is ``gpu`` for ``modal``).

    For adapters, which act on what was set before settings resolve (which weights to bake,
    whether a limit was asked for or is theirs to pick): they ask here rather than parse
    the variables themselves. ``environ`` defaults to this process's.
    """
    head = f"EMBER_{platform.upper()}_" if platform else "EMBER_"
    found = {}
    for key, value in (os.environ if environ is None else environ).items():
        name = key.upper()
        if name.startswith(head) and value.strip():
            found[name[len(head) :].lower()] = value.strip()
    return found


def settings_from_env(
    *,
    infinity_flags: Mapping[str, Any] | None = None,
    command: str = "serve",
    **overrides: Any,
) -> ServerSettings:
    """Settings from ``EMBER_*`` variables; keyword overrides win (as CLI flags do).

    Infinity's ``INFINITY_*`` variables count where no override or ``EMBER_*`` variable
    sets the same setting; ``infinity_flags`` are Infinity's flags that have no Ember
    setting (``ember serve --bettertransformer``), which only warn. ``PORT`` (Cloud Run's,
    Render's, Heroku's) sets the port where nothing else does. A variable that sets nothing
    under ``ember <command>`` (a misspelt ``EMBER_*``, TEI's own) is named in a warning.
    """
    from ember.env_check import environment_notes
    from ember.infinity_options import infinity_settings, translate_infinity_values

    clean = translate_infinity_values({k: v for k, v in overrides.items() if v is not None})
    from_infinity, notes = infinity_settings(infinity_flags or {}, os.environ, clean)
    clean = {**from_infinity, **clean}
    notes = [*environment_notes(os.environ, ServerSettings.model_fields, command), *notes]
    if "port" not in clean and not os.environ.get(env_var("port"), "").strip():
        if port := os.environ.get("PORT", "").strip():
            if not port.isdigit():
                raise ConfigError(
                    f"PORT={port!r} is not a port number (read where {env_var('port')} is unset)"
                )
            clean["port"] = int(port)
    for name in PER_MODEL_FIELDS:
        if isinstance(clean.get(name), (list, tuple)):
            clean[name] = ";".join(str(v) for v in clean[name])
        elif name in clean and not isinstance(clean[name], str):
            clean[name] = str(clean[name])
    try:
        settings = ServerSettings(**clean)
    except ValidationError as exc:
        raise _settings_error(exc, from_infinity) from None
    settings.compat_warnings.extend(notes)
    settings.compat_warnings.extend(reconcile_limits(settings))
    return settings


def _settings_error(exc: ValidationError, from_infinity: Mapping[str, Any]) -> ConfigError:
    """A value that is not of its setting's type, worded as the other config errors."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    message = str(error["msg"])
    source = env_var(name)
    if name in from_infinity:
        from ember.infinity_options import INFINITY_OPTIONS, infinity_env

        source = ", ".join(infinity_env(o.name) for o in INFINITY_OPTIONS if o.setting == name)
    return ConfigError(
        f"{flag(name)} ({source}): {message[:1].lower()}{message[1:]}, got {error.get('input')!r}"
    )


# The OpenTelemetry SDK reads its own OTEL_* variables (endpoint, headers, timeout, sampler,
# service name, batch schedule); Ember reads only whether one names an endpoint (tracing on)
# and the protocol, because the SDK's exporters are one class per protocol.
OTEL_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
OTEL_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")


def otlp_export(settings: ServerSettings) -> tuple[str | None, str] | None:
    """Where traces go: (``--otlp-endpoint``, or None for the SDK's own variables; the
    protocol), or None when tracing is off. The protocol defaults to gRPC, as the Python
    SDK's ``otlp`` exporter, TEI's ``--otlp-endpoint`` and vLLM's do."""
    if not settings.otlp_endpoint and not any(os.environ.get(v) for v in OTEL_ENDPOINTS):
        return None
    protocol = next((os.environ[v] for v in OTEL_PROTOCOLS if os.environ.get(v)), "grpc")
    if protocol.strip() not in OTLP_PROTOCOLS:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: Ember exports traces over "
            f"{' or '.join(OTLP_PROTOCOLS)}"
        )
    return settings.otlp_endpoint or None, protocol.strip()
