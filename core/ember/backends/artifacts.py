"""Where converted model artifacts (ONNX graphs, CTranslate2 dirs) are cached, and their keys.

Exporting or converting a model takes seconds to minutes, so backends do it once at
first load and keep the result under ``<cache root>/<backend>/<name>-<key>``. The key
hashes everything that changes the artifact: the source files' identity, the converter
versions and the backend's options (dtype, optimisation level, ...). A changed input
gives a new directory instead of a stale hit; old entries are left for the user to
delete. Entries are built in a sibling temp dir and renamed into place when complete,
so a crash or two processes loading at once never leave a half-written artifact that
later loads would trust. The build itself runs in a child process (``isolated``), so a
server's first start does not keep the exporter's imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ember.defaults import default_cache_dir
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

MANIFEST_NAME = "ember_artifact.json"
# Files whose *content* is hashed; the (possibly large) weights are keyed by size + mtime.
_SMALL_SUFFIXES = {".json", ".txt", ".model"}
_SMALL_LIMIT = 4 * 1024 * 1024


def cache_root(model: ResolvedModel) -> Path:
    """``--cache-dir`` as the model's runtime settings carry it, else its default."""
    if model.runtime.cache_dir is not None:
        return Path(model.runtime.cache_dir).expanduser()
    return default_cache_dir()


def shown_path(path: Path, model: ResolvedModel) -> str:
    """An artifact's path as /v1/models shows it: relative to the cache root, so the
    answer names no directory of the host (a path outside the cache shows its last two
    parts)."""
    try:
        return str(Path(path).resolve().relative_to(cache_root(model).resolve()))
    except ValueError:
        return str(Path(*Path(path).parts[-2:]))


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of the converters: a new exporter may produce a different graph."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def source_fingerprint(path: Path) -> dict[str, str]:
    """Identity of a model directory: content hash of small files, size+mtime of weights.

    Hashing multi-GB weights on every start would cost more than it saves; size plus
    nanosecond mtime changes whenever the file is rewritten or re-downloaded.
    """
    files: dict[str, str] = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        stat = file.stat()
        if file.suffix in _SMALL_SUFFIXES and stat.st_size <= _SMALL_LIMIT:
            files[rel] = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
        else:
            files[rel] = f"size:{stat.st_size}:mtime:{stat.st_mtime_ns}"
    return files


def artifact_key(model: ResolvedModel, backend: str, options: Mapping[str, Any]) -> str:
    """A short stable hash of source identity + backend + options (options must be JSON)."""
    payload = {
        "backend": backend,
        "task": model.task,
        "options": dict(options),
        "source": source_fingerprint(model.path),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def artifact_dir(model: ResolvedModel, backend: str, options: Mapping[str, Any]) -> Path:
    """The cache directory this model + options maps to (it may not exist yet)."""
    # Named after the source, not the served name: one model served under two names
    # shares one artifact. The key alone identifies it; the name is for people.
    source = model.runtime.model_id or str(model.path)
    tail = "_".join(source.rstrip("/").split("/")[-2:])  # org_name or dir_model
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", tail).strip("_.")[-60:] or "model"
    return cache_root(model) / backend / f"{name}-{artifact_key(model, backend, options)}"


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a complete artifact, or None if absent/unreadable (=> rebuild)."""
    manifest = read_json(directory / MANIFEST_NAME)
    return manifest if isinstance(manifest, dict) else None


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    (directory / MANIFEST_NAME).write_text(
        json.dumps(dict(manifest), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8"
    )


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``final``; on success move it to ``final`` atomically.

    If another process published ``final`` first, its copy wins and ours is dropped,
    so concurrent first loads are safe. On error the temp dir is removed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        if final.exists() and read_manifest(final) is None:
            shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover
        try:
            os.replace(tmp, final)
        except OSError:
            if read_manifest(final) is None:
                raise
            log.info("artifact %s was published by another process; using it", final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# Ember's pooling names that sentence-transformers spells otherwise.
_ST_MODE_NAMES = {"mean_sqrt_len": "mean_sqrt_len_tokens", "last": "lasttoken"}


def write_pooling_files(model: ResolvedModel, dst: Path) -> None:
    """sentence-transformers files that pin the pipeline an export was served with.

    ``model.path`` is the transformer directory, which may not hold the source's
    modules.json; and ``--pooling`` may have overridden it. Writing the resolved values
    (pooling modes in the 5.x keys both 5.x and 6.x read, the Dense layers with their
    weights, Normalize) makes the exported directory resolve to exactly what was exported.
    """
    if not model.family.st_pipeline:
        return
    st = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
    ]
    for layer in model.dense_layers:
        idx = len(modules)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Dense", "type": st + "Dense"})
        shutil.copytree(layer.path, dst / f"{idx}_Dense", dirs_exist_ok=True)
    if model.normalize:
        idx = len(modules)
        path = f"{idx}_Normalize"
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": st + "Normalize"})
        (dst / path).mkdir(parents=True, exist_ok=True)
    modes = model.poolings
    width = model.dense_layers[0].in_features if model.dense_layers else model.hidden_size
    keys = {
        "cls": "pooling_mode_cls_token",
        "max": "pooling_mode_max_tokens",
        "mean": "pooling_mode_mean_tokens",
        "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
        "weightedmean": "pooling_mode_weightedmean_tokens",
        "last": "pooling_mode_lasttoken",
    }
    if len(modes) > 1 and list(modes) != [m for m in keys if m in modes]:
        # 5.x keys concatenate in their own order; another order only 6.x can write
        pooling: dict[str, Any] = {"pooling_mode": [_ST_MODE_NAMES.get(m, m) for m in modes]}
        pooling["embedding_dimension"] = width // len(modes)
    else:
        pooling = {"word_embedding_dimension": width // len(modes)}
        pooling.update({key: mode in modes for mode, key in keys.items()})
    pooling["include_prompt"] = model.include_prompt
    (dst / "1_Pooling").mkdir(parents=True, exist_ok=True)
    _write_json(dst / "modules.json", modules)
    _write_json(dst / "1_Pooling" / "config.json", pooling)
    st_config = dst / "sentence_bert_config.json"
    current = read_json(st_config) or {"do_lower_case": False}
    _write_json(st_config, {**current, "max_seq_length": model.max_length})


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def copy_model_files(src: Path, dst: Path, exclude: Iterable[str] = ()) -> None:
    """Copy config/tokenizer/sentence-transformers files (not weights) next to an export.

    An exported directory then resolves on its own (``--model-id DIR``): pooling,
    normalisation, max length and the tokenizer come from the same files as the source.
    """
    if src.resolve() == dst.resolve():
        return
    skip = set(exclude)
    weights = {".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot"}
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = file.relative_to(src)
        parts = rel.parts
        if parts[0].startswith(".") or parts[0] in skip or file.suffix in weights:
            continue
        if file.name.endswith(".onnx_data") or file.name == MANIFEST_NAME:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, target)
