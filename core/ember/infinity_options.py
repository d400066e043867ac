"""Infinity's flags and ``INFINITY_*`` variables, as Ember settings.

Infinity (michaelfeil/infinity, 0.0.78) deployments switch by changing the image: its
`v2` flags are accepted by `ember serve`, and its INFINITY_* variables count wherever no
EMBER_* variable sets the same setting. Each is an Ember setting, or, where Ember has
none, a warning saying what Ember does instead; none is ignored silently. Read by
``ember.config.settings_from_env`` (the one place settings resolve) and the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember.config_values import PER_MODEL_FIELDS, env_var, flag, split_values

INFINITY_TRUE = frozenset({"true", "t", "1", "yes", "y"})  # Infinity's own reading


@dataclass(frozen=True)
class InfinityOption:
    """One of Infinity's flags (``--name``) and its variable (``INFINITY_NAME``)."""

    name: str
    setting: str | None  # the Ember setting it sets; None: no equivalent
    note: str  # how it maps; with no setting, what Ember does instead (the warning)
    values: Mapping[str, str] = field(default_factory=dict)  # Infinity's value -> Ember's
    switch: bool = False  # --name / --no-name; a variable reads true|t|1|yes|y
    honoured: str | None = None  # no setting, but Ember does this value anyway: no warning
    flag: bool = True  # False: a variable only
    per_model: bool = False  # one value per model, with no Ember setting

    @property
    def many(self) -> bool:
        """Takes one value per model (repeated flag, or ``;``-separated variable)."""
        return self.per_model or self.setting in PER_MODEL_FIELDS

    def translate(self, value: Any) -> Any:
        """Infinity's value as the Ember setting takes it: per model (``;``-separated or a
        list) where the setting is per model; a switch given once per model is on if any
        is (Ember's is server-wide)."""
        if isinstance(value, (list, tuple)):
            if self.switch:
                return self.translate(";".join(_switch_text(v) for v in value))
            return [self.translate(v) for v in value]
        text = _switch_text(value)
        if self.switch:
            on = any(p.strip().lower() in INFINITY_TRUE for p in text.split(";"))
            text = "true" if on else "false"
            return self.values.get(text, text)
        if self.setting in PER_MODEL_FIELDS:
            return ";".join(self.values.get(p.strip().lower(), p.strip()) for p in text.split(";"))
        return self.values.get(text.strip().lower(), text)


def _switch_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def infinity_env(name: str) -> str:
    return "INFINITY_" + name.upper()


ENGINES = {"torch": "torch", "optimum": "onnx", "ctranslate2": "ct2", "neuron": "neuron"}

INFINITY_OPTIONS: tuple[InfinityOption, ...] = (
    InfinityOption("model_id", "model_id", "same"),
    InfinityOption("served_model_name", "served_model_name", "same"),
    InfinityOption("batch_size", "max_batch_size", "--max-batch-size"),
    InfinityOption("revision", "revision", "same"),
    InfinityOption(
        "trust_remote_code",
        "trust_remote_code",
        "same, server-wide (on if on for any model); Infinity's default is on, Ember's off",
        switch=True,
    ),
    InfinityOption(
        "engine",
        "backend",
        "--backend: torch, optimum -> onnx, ctranslate2 -> ct2, neuron",
        values=ENGINES,
    ),
    InfinityOption(
        "model_warmup",
        None,
        "Ember always warms each model before /ready turns 200 (one short batch per forward "
        "worker on CPU, the largest batch on an accelerator)",
        switch=True,
        honoured="true",
    ),
    InfinityOption(
        "vector_disk_cache",
        None,
        "Ember keeps no vector cache on disk; its embedding cache is in memory, off unless "
        "--cache-entries is set (its key holds the model, the options and the whole input)",
        switch=True,
        honoured="false",
    ),
    InfinityOption(
        "device",
        "device",
        "same; tensorrt -> cuda (the onnx backend takes TensorRT's provider where installed)",
        values={"tensorrt": "cuda"},
    ),
    InfinityOption(
        "device_id",
        None,
        "Ember places one copy of each model on the first device it sees; choose it with "
        "CUDA_VISIBLE_DEVICES",
        per_model=True,
    ),
    InfinityOption(
        "lengths_via_tokenize",
        None,
        "Ember always batches by token counts and reports tokens in `usage`",
        switch=True,
        honoured="true",
    ),
    InfinityOption("dtype", "dtype", "same (fp8 is refused)"),
    InfinityOption(
        "embedding_dtype",
        "embedding_dtype",
        "same: int8 and uint8 at Cohere's fixed scales, not calibrated on a text set",
    ),
    InfinityOption("pooling_method", "pooling", "--pooling"),
    InfinityOption(
        "compile",
        "torch_compile",
        "--torch-compile; with a backend other than torch it does not apply and warns",
        switch=True,
    ),
    InfinityOption(
        "bettertransformer",
        None,
        "Ember has no BetterTransformer: the torch backend runs SDPA attention (flash-attn "
        "with ember[flash] on CUDA in half precision)",
        switch=True,
        honoured="false",
    ),
    InfinityOption("preload_only", "preload_only", "same", switch=True),
    InfinityOption("host", "host", "same"),
    InfinityOption("port", "port", "same"),
    InfinityOption("url_prefix", "url_prefix", "same; the routes stay at the root too"),
    InfinityOption(
        "redirect_slash",
        None,
        "GET / is not redirected (POST / is TEI's root route); the docs are at /docs",
        honoured="",
    ),
    InfinityOption(
        "log_level",
        "log_level",
        "same; trace -> debug, critical -> error",
        values={"trace": "debug", "critical": "error"},
    ),
    InfinityOption(
        "permissive_cors",
        "cors_allow_origin",
        "--cors-allow-origin '*'",
        values={"true": "*", "false": ""},
        switch=True,
    ),
    InfinityOption("api_key", "api_key", "same"),
    InfinityOption("proxy_root_path", "proxy_root_path", "same"),
    InfinityOption(
        "onnx_disable_optimize",
        None,
        "Ember always runs ONNX Runtime's transformer optimizer on its export",
        switch=True,
        honoured="false",
    ),
    InfinityOption(
        "onnx_do_not_prefer_quantized",
        None,
        "Ember exports its own graph; --dtype int8 asks for a quantized one",
        switch=True,
        honoured="true",
    ),
    InfinityOption("queue_size", "max_queue_size", "--max-queue-size", flag=False),
    InfinityOption("max_client_batch_size", "max_client_batch_size", "same", flag=False),
    InfinityOption("media_max_download_bytes", "max_media_bytes", "--max-media-bytes", flag=False),
    InfinityOption(
        "media_url_blacklist",
        None,
        "Ember refuses media URLs that resolve to loopback, private or link-local addresses "
        "unless --allow-private-urls",
        flag=False,
    ),
    InfinityOption(
        "calibration_dataset_url",
        None,
        "Ember's int8 and uint8 output types need no calibration set (fixed scales)",
        flag=False,
    ),
    InfinityOption(
        "anonymous_usage_stats",
        None,
        "Ember sends no usage statistics",
        switch=True,
        honoured="false",
        flag=False,
    ),
    InfinityOption(
        "home",
        None,
        "models download to the Hugging Face cache (HF_HOME); Ember's converted artifacts go "
        "to --cache-dir",
        flag=False,
    ),
    InfinityOption("disable_optimum", None, "deprecated in Infinity; Ember ignores it", flag=False),
)


def infinity_settings(
    flags: Mapping[str, Any], environ: Mapping[str, str], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Ember settings from Infinity's flags and ``INFINITY_*`` variables, and one warning
    for each that Ember has no equivalent for.

    ``flags``: Infinity's flags by option name, as `ember serve` parsed them (those Ember
    shares, like --model-id, are Ember's own). A flag counts unless ``overrides`` (Ember's
    own flags or keywords) sets the same setting; a variable, unless an override, a flag or
    an ``EMBER_*`` variable does.
    """
    env = {k.upper(): v for k, v in environ.items()}
    settings: dict[str, Any] = {}
    warnings: list[str] = []
    sources: dict[str, str] = {}  # setting -> the flag or variable it came from
    for option in INFINITY_OPTIONS:
        given = option.name in flags
        raw = flags[option.name] if given else env.get(infinity_env(option.name))
        if raw is None:
            continue
        source = flag(option.name) if given else infinity_env(option.name)
        setting = option.setting
        if setting is None:
            shown = option.translate(raw) if option.switch else ";".join(_parts(raw))
            asked = {part.strip().lower() for part in shown.split(";")}
            if option.honoured is None or asked != {option.honoured}:
                warnings.append(f"{source}={shown}: {option.note}")
            continue
        if setting in overrides or setting in settings:
            continue
        if not given and env_var(setting) in env:
            continue
        settings[setting] = option.translate(raw)
        sources[setting] = source
    if _true(settings.get("torch_compile")):
        backends = split_values(
            ";".join(_parts(overrides.get("backend") or settings.get("backend")))
        )
        backends = backends or split_values(env.get(env_var("backend")))
        if backends and not {b.lower() for b in backends} & {"auto", "torch"}:
            del settings["torch_compile"]
            warnings.append(
                f"{sources['torch_compile']}=true: applies to the torch backend only; Ember "
                f"runs {';'.join(backends)} here, uncompiled"
            )
    return settings, warnings


def _parts(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _true(value: Any) -> bool:
    return str(value).lower() == "true"


def translate_infinity_values(overrides: dict[str, Any]) -> dict[str, Any]:
    """Infinity's value names on Ember's own flags too (``--device tensorrt``,
    ``--log-level trace``, ``--backend optimum``), so a v2 command line means the same."""
    out = dict(overrides)
    for option in INFINITY_OPTIONS:
        if option.values and not option.switch and option.setting in out:
            out[option.setting] = option.translate(out[option.setting])
    return out


def infinity_cli_options() -> list[InfinityOption]:
    """Infinity's v2 flags that `ember serve` adds: those it shares are Ember's own, the
    options named as the Ember setting they set."""
    return [o for o in INFINITY_OPTIONS if o.flag and o.name != o.setting]
