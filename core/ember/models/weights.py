"""Reading a checkpoint's tensors where Ember applies them itself (MLM heads, projections).

Backends load networks through their own libraries; the heads read a few tensors straight
from the files. They must find what transformers finds in the same directory, or a model
transformers serves is refused here: the file it would pick (safetensors before a torch
pickle, a single file before a sharded index) and the names it gives the tensors (its
``legacy`` renaming: ``LayerNorm.gamma``/``beta`` as ``weight``/``bias``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ember.errors import ConfigError

# What transformers' from_pretrained looks for, in the order it prefers them.
CHECKPOINT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# transformers 5's "legacy" renaming (conversion_mapping.py), applied to every checkpoint.
LEGACY_NAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def transformers_name(name: str) -> str:
    """The name transformers loads a stored tensor under."""
    for old, new in LEGACY_NAMES:
        name = name.replace(old, new)
    return name


def checkpoint_files(directory: Path) -> list[Path]:
    """The weight files transformers would load from ``directory``: one file, or the shards
    an index names."""
    for name in CHECKPOINT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path} is not a sharded-checkpoint index: {exc}") from exc
        shards = [directory / shard for shard in dict.fromkeys(weight_map.values())]
        if missing := [s.name for s in shards if not s.is_file()]:
            raise ConfigError(f"{path} names shards that are not there: {', '.join(missing)}")
        return shards
    raise ConfigError(
        f"{directory} has no weights transformers would load ({', '.join(CHECKPOINT_FILES)})"
    )


def read_checkpoint(directory: Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """float32 tensors of the checkpoint in ``directory``, by their transformers names;
    ``names`` (such names) limits what is read, so a head costs a few tensors, not the
    whole model."""
    wanted = None if names is None else set(names)
    tensors: dict[str, np.ndarray] = {}
    for path in checkpoint_files(directory):
        tensors.update(read_tensors(path, wanted))
    return tensors


def read_tensors(path: Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """float32 tensors of one safetensors file or torch pickle (torch imported only for a
    pickle, or for bfloat16, which numpy has no type for), by their transformers names."""
    wanted = None if names is None else set(names)

    def keep(stored: Iterable[str]) -> dict[str, str]:
        renamed = {k: transformers_name(k) for k in stored}
        return {k: n for k, n in renamed.items() if wanted is None or n in wanted}

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            chosen = keep(f.keys())
            try:
                return {n: np.asarray(f.get_tensor(k), dtype=np.float32) for k, n in chosen.items()}
            except TypeError:  # bfloat16 tensors: read through torch
                pass
        with safe_open(str(path), framework="pt") as f:
            return {n: f.get_tensor(k).float().numpy() for k, n in chosen.items()}
    import torch

    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return {n: state[k].float().numpy() for k, n in keep(state).items()}
