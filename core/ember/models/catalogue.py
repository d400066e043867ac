"""The model catalogue: models named by ``--models-dir`` or ``--models-file`` that load on
first use, and how each may stay resident (pinned, idle unload, eager or lazy).

A ``--models-dir`` holds one model per subdirectory, named after it, lazy and unpinned. A
``--models-file`` is TOML, one table per model (its key is the served name)::

    [models.minilm]
    model_id = "sentence-transformers/all-MiniLM-L6-v2"   # a hub id, or a path (relative
    pin = true                                            # to the file)
    load = "eager"            # or "lazy" (the default)
    idle_unload = "10m"       # seconds or a duration; unset: --idle-unload
    backend = "onnx"          # and any per-model flag: task, dtype, device, pooling, ...

Models given by ``--model-id`` stay as they always were: loaded at start and pinned.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from ember.errors import ConfigError

RESIDENCE_KEYS = ("pin", "load", "idle_unload")
# Weight files, by format: a directory that ships several formats loads one of them.
WEIGHT_SUFFIXES = (
    (".safetensors",),
    (".bin", ".pt", ".pth"),
    (".onnx", ".onnx_data"),
    (".xml",),  # OpenVINO IR: the .bin beside it counts with torch's .bin (the larger wins)
    (".npy", ".npz"),
)


@dataclass(frozen=True)
class Residence:
    """How one served model stays in memory. ``--model-id`` models: eager and pinned."""

    pin: bool = True  # never evicted, never idle-unloaded; counted by readiness
    eager: bool = True  # loaded at start (else on its first request)
    idle_unload: float | None = None  # seconds idle before it unloads; None: never


@dataclass(frozen=True)
class ResidencyLimits:
    """The server's bounds on resident models (0: no bound)."""

    max_loaded: int = 0
    memory_budget: int = 0  # bytes: resident memory attributed to models, with device memory
    load_timeout: float = 300.0  # seconds a request waits for its model to load


@dataclass(frozen=True)
class CatalogueEntry:
    """One catalogue model: its served name, per-model flags and residence."""

    name: str
    options: dict[str, str]
    residence: Residence


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BYTES = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def duration_seconds(value: float | int | str) -> float:
    """Seconds of a duration as Ollama's ``keep_alive`` takes one: a number of seconds, or
    Go's form (``"5m"``, ``"1h30m"``, ``"-1"``); negative means forever. ValueError else."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as '5m'")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(
            f"{value!r} is not a duration: use seconds or a form such as '5m', '1h30m'"
        )
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def parse_bytes(value: int | str) -> int:
    """Bytes of ``"8GiB"``, ``"512MB"``, ``"1.5G"`` or a plain number; ValueError else."""
    if isinstance(value, int):
        return value
    match = _BYTES.fullmatch(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a size: use bytes or a form such as 8GiB, 512MB")
    number, unit = match.group(1), (match.group(2) or "").lower()
    base = 1024 if "i" in unit else 1000
    power = "bkmgt".index(unit[0]) if unit else 0
    return int(float(number) * base**power)


def weight_bytes(path: Path) -> int:
    """What a local model directory's weights take on disk: the largest format's files (a
    directory may ship safetensors, a .bin and an ONNX graph, and loads one). 0 when
    ``path`` is not a local directory (a hub id not yet downloaded)."""
    if not path.is_dir():
        return 0
    sizes = [0] * len(WEIGHT_SUFFIXES)
    for file in path.rglob("*"):
        for i, suffixes in enumerate(WEIGHT_SUFFIXES):
            if file.suffix in suffixes and file.is_file():
                sizes[i] += file.stat().st_size
    return max(sizes)


def _residence(name: str, table: dict[str, Any], idle_unload: float | None) -> Residence:
    load = table.get("load", "lazy")
    if load not in ("eager", "lazy"):
        raise ConfigError(f"catalogue model {name!r}: load must be eager or lazy, got {load!r}")
    pin = table.get("pin", False)
    if not isinstance(pin, bool):
        raise ConfigError(f"catalogue model {name!r}: pin must be true or false, got {pin!r}")
    idle = table.get("idle_unload")
    try:
        seconds = idle_unload if idle is None else duration_seconds(idle)
    except ValueError as exc:
        raise ConfigError(f"catalogue model {name!r}: idle_unload: {exc}") from None
    if seconds is not None and seconds <= 0:
        seconds = None  # 0 or negative: never unloads for idleness (as --idle-unload 0)
    return Residence(pin=pin, eager=load == "eager", idle_unload=seconds)


def read_models_dir(folder: Path, idle_unload: float | None) -> list[CatalogueEntry]:
    """Every subdirectory of ``folder`` that holds a model (a ``config.json`` or
    ``modules.json``), by its name: lazy and unpinned."""
    if not folder.is_dir():
        raise ConfigError(f"--models-dir {folder}: not a directory")
    return [
        CatalogueEntry(sub.name, {"model_id": str(sub)}, _residence(sub.name, {}, idle_unload))
        for sub in sorted(folder.iterdir())
        if sub.is_dir() and ((sub / "config.json").exists() or (sub / "modules.json").exists())
    ]


def read_models_file(
    path: Path, idle_unload: float | None, model_options: tuple[str, ...]
) -> list[CatalogueEntry]:
    """The ``[models.<name>]`` tables of a TOML models file, or ConfigError saying why not;
    ``model_options``: the per-model flags a table may set besides its residence."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--models-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--models-file {path} is not valid TOML: {exc}") from None
    models = raw.get("models")
    if not isinstance(models, dict) or set(raw) - {"models"}:
        raise ConfigError(f"--models-file {path}: expected only [models.<name>] tables")
    entries = []
    for name, table in models.items():
        if not isinstance(table, dict):
            raise ConfigError(f"--models-file {path}: models.{name} is not a table")
        unknown = set(table) - set(model_options) - set(RESIDENCE_KEYS)
        if unknown:
            raise ConfigError(
                f"--models-file {path}: models.{name} has unknown keys {sorted(unknown)}; "
                f"known: {', '.join(RESIDENCE_KEYS + model_options)}"
            )
        options = {k: str(v) for k, v in table.items() if k in model_options}
        model_id = options.get("model_id", name)
        local = path.parent / model_id
        if not Path(model_id).is_absolute() and local.exists():
            options["model_id"] = str(local)  # a path relative to the file
        else:
            options["model_id"] = model_id
        entries.append(CatalogueEntry(name, options, _residence(name, table, idle_unload)))
    return entries
