"""AWS Inferentia2/Trainium backend: optimum-neuron graphs compiled for static shapes.

neuronx-cc compiles a model for one exact input shape. Ember compiles one graph per
sequence bucket at a fixed batch ``B`` (``export``), ships them in one directory with
an ``ember_neuron.json`` manifest, and at serve time reshapes every batch to fit
(``neuron_shapes``: smallest bucket per text, chunks of ``B`` rows padded to
``(B, L)``, results put back in order). One copy of every bucket's graph is loaded
per NeuronCore and chunks run on free cores in parallel.

The compile and load steps go through two small seams, ``Compiler`` and
``ModuleLoader`` (a ``CompiledModule`` per bucket and core), so everything above
them — manifest, bucketing, padding, truncation, ordering, multi-core dispatch —
runs and is tested on machines without the Neuron SDK. The default seams call
optimum-neuron (``NeuronModelForFeatureExtraction`` / ``...ForSequenceClassification``
``.from_pretrained(..., export=True, batch_size=, sequence_length=)``,
``save_pretrained``) and torch-neuronx core placement; those were written against
the optimum-neuron sources and have not been run on Inferentia from this repo.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import queue
import re
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ember.backends import artifacts
from ember.backends.base import (
    ATTENTION,
    LOGITS,
    TOKEN_STATES,
    BackendDefaults,
    BackendInfo,
    Outputs,
    TokenBatch,
)
from ember.backends.neuron_shapes import (
    Chunk,
    default_buckets,
    lengths_from_mask,
    normalize_buckets,
    pad_chunk,
    plan_chunks,
    scatter_results,
)
from ember.errors import ConfigError, MissingDependency
from ember.models.spec import ResolvedModel, Task

log = logging.getLogger(__name__)

MANIFEST_NAME = "ember_neuron.json"
ARTIFACT_KIND = "ember-neuron"
MANIFEST_VERSION = 1
MISSING_SDK = (
    "Neuron backend needs the AWS Neuron SDK: use the Neuron DLC image or "
    "pip install 'ember[neuron]'"
)
DEFAULT_BATCH_SIZE = 8
# NeuronCores per Neuron device on inf2 and trn1; inf2.xlarge has one device.
CORES_PER_DEVICE = 2

# The optimum-neuron class compiled per task, and the output field Ember reads from
# its forward. Embeddings come back as token states and are pooled on the host by the
# heads every backend shares, so the pooling mode is not baked into the artifact and
# can still be overridden at serve time.
TASK_CLASSES = {
    "embed": "NeuronModelForFeatureExtraction",
    "rerank": "NeuronModelForSequenceClassification",
    "classify": "NeuronModelForSequenceClassification",
}
OUTPUT_FIELDS = {
    "NeuronModelForFeatureExtraction": "last_hidden_state",
    "NeuronModelForSentenceTransformers": "token_embeddings",
    "NeuronModelForSequenceClassification": "logits",
}
AUTO_CAST_MODES = ("none", "matmul", "all")

# Files the core's resolver reads (config, tokenizer, sentence-transformers metadata);
# copied to the artifact's top level so it resolves like a plain model directory.
SUPPORT_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)


@runtime_checkable
class CompiledModule(Protocol):
    """One graph compiled for exactly ``static_shape == (B, L)``, loaded on one core.

    Embedding graphs return token states ``[B, L, H]``; classifier/reranker graphs
    return logits ``[B, num_labels]``. Inputs are int64 arrays of ``static_shape``.
    """

    static_shape: tuple[int, int]

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None = None,
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class NeuronManifest:
    """What ``ember_neuron.json`` records; enough to load without re-reading the model."""

    task: str
    pooling: str
    normalize: bool
    optimum_class: str
    batch_size: int
    sequence_lengths: tuple[int, ...]
    pad_token_id: int = 0
    num_cores: int | None = None
    auto_cast: str | None = None
    auto_cast_type: str | None = None
    source_model: str = ""
    model_type: str = ""
    architecture: str = ""
    hidden_size: int = 0
    num_labels: int = 0
    kind: str = ARTIFACT_KIND
    version: int = MANIFEST_VERSION
    bucket_dirs: dict[str, str] = field(default_factory=dict)

    @property
    def output_field(self) -> str:
        return OUTPUT_FIELDS[self.optimum_class]

    def bucket_dir(self, root: Path, sequence_length: int) -> Path:
        name = self.bucket_dirs.get(str(sequence_length), bucket_dir_name(sequence_length))
        return root / name

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sequence_lengths"] = list(self.sequence_lengths)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NeuronManifest:
        if data.get("kind") != ARTIFACT_KIND:
            raise ConfigError(f"not an Ember Neuron manifest (kind={data.get('kind')!r})")
        if int(data.get("version", 0)) > MANIFEST_VERSION:
            raise ConfigError(
                f"Neuron artifact manifest version {data['version']} is newer than this "
                f"Ember understands ({MANIFEST_VERSION}); upgrade Ember or re-export"
            )
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        values["sequence_lengths"] = normalize_buckets(values["sequence_lengths"])
        values["bucket_dirs"] = {str(k): str(v) for k, v in values.get("bucket_dirs", {}).items()}
        manifest = cls(**values)
        if manifest.optimum_class not in OUTPUT_FIELDS:
            raise ConfigError(f"unsupported optimum-neuron class {manifest.optimum_class!r}")
        return manifest


def bucket_dir_name(sequence_length: int) -> str:
    return f"seq_{sequence_length}"


def write_manifest(directory: Path, manifest: NeuronManifest) -> Path:
    path = Path(directory) / MANIFEST_NAME
    path.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(directory: Path) -> NeuronManifest:
    path = Path(directory) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"{directory} has no {MANIFEST_NAME}: not a Neuron artifact") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from err
    return NeuronManifest.from_dict(data)


def is_neuron_artifact(path: Path) -> bool:
    """True for a directory written by ``export`` (the resolver may use this)."""
    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("kind") == ARTIFACT_KIND
    except (OSError, json.JSONDecodeError):
        return False


# --------------------------------------------------------------------------- seams

# Compiles one bucket of ``model`` into ``bucket_dir``.
Compiler = Callable[..., None]
# Loads the graph of one bucket onto one NeuronCore: (artifact root, manifest, L, core).
ModuleLoader = Callable[[Path, NeuronManifest, int, int], CompiledModule]


def _import_optimum_neuron() -> Any:
    try:
        return importlib.import_module("optimum.neuron")
    except ImportError as err:
        raise MissingDependency(MISSING_SDK) from err


def optimum_compile(
    model: ResolvedModel,
    bucket_dir: Path,
    *,
    optimum_class: str,
    batch_size: int,
    sequence_length: int,
    auto_cast: str | None,
    auto_cast_type: str | None,
) -> None:
    """Default compiler: ``NeuronModelForX.from_pretrained(export=True)`` + ``save_pretrained``.

    The saved directory holds optimum's ``model.neuron`` and a ``config.json`` whose
    ``neuron`` section records the static shapes, so ``from_pretrained(bucket_dir)``
    reloads it without compiling.
    """
    optimum_neuron = _import_optimum_neuron()
    cls = getattr(optimum_neuron, optimum_class)
    kwargs: dict[str, Any] = {
        "export": True,
        "batch_size": batch_size,
        "sequence_length": sequence_length,
        "trust_remote_code": model.spec.trust_remote_code,
    }
    if auto_cast is not None:
        kwargs["auto_cast"] = auto_cast
        if auto_cast_type is not None:
            kwargs["auto_cast_type"] = auto_cast_type
    neuron_model = cls.from_pretrained(str(model.path), **kwargs)
    neuron_model.save_pretrained(str(bucket_dir))


class OptimumModule:
    """A loaded optimum-neuron model behind the ``CompiledModule`` interface.

    The static shape is read from the model itself (``input_static_shapes``), and
    ``token_type_ids`` is passed only if the compiled graph has that input (BERT does,
    DistilBERT does not). Shapes are checked here too: optimum would silently pad a
    smaller input, and Ember wants a wrong shape to be a loud bug instead.
    """

    def __init__(self, neuron_model: Any, output_field: str) -> None:
        self._model = neuron_model
        self._output_field = output_field
        shapes = neuron_model.input_static_shapes
        batch, length = (int(x) for x in shapes["input_ids"])
        self.static_shape = (batch, length)
        self._takes_token_types = "token_type_ids" in shapes

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        import torch

        if tuple(input_ids.shape) != self.static_shape:
            raise ValueError(f"compiled for {self.static_shape}, called with {input_ids.shape}")
        kwargs = {
            "input_ids": torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64)),
            "attention_mask": torch.from_numpy(
                np.ascontiguousarray(attention_mask, dtype=np.int64)
            ),
        }
        if self._takes_token_types:
            types = np.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            kwargs["token_type_ids"] = torch.from_numpy(np.ascontiguousarray(types, np.int64))
        with torch.inference_mode():
            out = self._model(**kwargs)
        return getattr(out, self._output_field).detach().cpu().float().numpy()


def optimum_load(root: Path, manifest: NeuronManifest, sequence_length: int, core: int) -> Any:
    """Default loader: ``from_pretrained(bucket_dir)``, then pin the graph to ``core``.

    optimum loads every traced model onto NeuronCore 0; ``set_neuron_cores`` (torch-
    neuronx's placement API) moves copy ``core`` to its own core so copies run in
    parallel instead of queueing on one.
    """
    optimum_neuron = _import_optimum_neuron()
    cls = getattr(optimum_neuron, manifest.optimum_class)
    neuron_model = cls.from_pretrained(str(manifest.bucket_dir(root, sequence_length)))
    if core != 0:
        try:
            import torch_neuronx
        except ImportError as err:
            raise MissingDependency(MISSING_SDK) from err
        torch_neuronx.experimental.set_neuron_cores(neuron_model.model, start_nc=core, nc_count=1)
    return OptimumModule(neuron_model, manifest.output_field)


# --------------------------------------------------------------------------- export


def _copy_support_files(src: Path, dst: Path) -> list[str]:
    """Copy config/tokenizer/sentence-transformers files (never weights) to ``dst``."""
    copied: list[str] = []
    for name in SUPPORT_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    modules = src / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            sub = module.get("path") or ""
            if sub and (src / sub).is_dir():
                # Pooling/Normalize configs are tiny; skip weight files such as Dense layers'.
                target = dst / sub
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(
                    src / sub,
                    target,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", "*.onnx"),
                )
                copied.append(sub)
    return copied


def _check_auto_cast(auto_cast: str | None) -> str | None:
    if auto_cast is None or auto_cast == "":
        return None
    if auto_cast not in AUTO_CAST_MODES:
        raise ConfigError(f"auto_cast must be one of {AUTO_CAST_MODES}, got {auto_cast!r}")
    return auto_cast


def export(
    model: ResolvedModel,
    out_dir: Path,
    *,
    batch_size: int,
    sequence_lengths: Sequence[int],
    num_cores: int | None = None,
    auto_cast: str | None = None,
    auto_cast_type: str | None = "bf16",
    progress: Callable[[str], None] | None = None,
    compiler: Compiler | None = None,
) -> Path:
    """Compile one graph per sequence length and write a self-contained artifact directory.

    Layout: ``ember_neuron.json`` + the model's config/tokenizer/sentence-transformers
    files at the top (so ``ember serve --model-id DIR`` resolves it like a plain model)
    + one ``seq_<L>/`` directory per bucket as written by optimum's ``save_pretrained``.
    The manifest is written last and any old one removed first, so an interrupted
    export is never mistaken for a finished artifact. ``num_cores`` is recorded as the
    serving default; it does not change the compiled graphs (one graph per core).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    buckets = normalize_buckets(sequence_lengths)
    if buckets[-1] > model.max_length:
        raise ConfigError(
            f"sequence length {buckets[-1]} exceeds the model's maximum of {model.max_length}"
        )
    if num_cores is not None and num_cores < 1:
        raise ConfigError(f"num_cores must be >= 1, got {num_cores}")
    auto_cast = _check_auto_cast(auto_cast)
    optimum_class = TASK_CLASSES[model.task]
    compile_bucket = compiler or optimum_compile
    say = progress or (lambda message: log.info("%s", message))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    _copy_support_files(model.path, out)

    bucket_dirs: dict[str, str] = {}
    for index, length in enumerate(buckets, start=1):
        name = bucket_dir_name(length)
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        step = f"[{index}/{len(buckets)}]"
        say(f"compiling {optimum_class} for (batch {batch_size}, seq {length}) {step}")
        compile_bucket(
            model,
            target,
            optimum_class=optimum_class,
            batch_size=batch_size,
            sequence_length=length,
            auto_cast=auto_cast,
            auto_cast_type=auto_cast_type if auto_cast else None,
        )
        bucket_dirs[str(length)] = name

    manifest = NeuronManifest(
        task=model.task,
        pooling=model.pooling,
        normalize=model.normalize,
        optimum_class=optimum_class,
        batch_size=batch_size,
        sequence_lengths=buckets,
        pad_token_id=_pad_token_id(model),
        num_cores=num_cores,
        auto_cast=auto_cast,
        auto_cast_type=auto_cast_type if auto_cast else None,
        source_model=model.spec.model_id,
        model_type=model.model_type,
        architecture=model.architecture,
        hidden_size=model.hidden_size,
        num_labels=model.num_labels,
        bucket_dirs=bucket_dirs,
    )
    write_manifest(out, manifest)
    say(f"wrote Neuron artifact to {out}")
    return out


def _pad_token_id(model: ResolvedModel) -> int:
    value = model.config.get("pad_token_id")
    return int(value) if isinstance(value, int) else 0


# --------------------------------------------------------------------------- cores


def _count_core_list(spec: str) -> int | None:
    """Count cores in a NEURON_RT_VISIBLE_CORES value such as ``0-1`` or ``0,2,3``."""
    total = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            return None
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            return None
        total += high - low + 1
    return total or None


def visible_neuron_cores(dev_dir: Path = Path("/dev")) -> int:
    """NeuronCores this process can use, from the runtime's env vars or the devices.

    Order: ``NEURON_RT_NUM_CORES``, ``NEURON_RT_VISIBLE_CORES``, then
    ``/dev/neuron*`` x 2 cores per device; 2 (one inf2.xlarge device) if none found.
    """
    num = os.environ.get("NEURON_RT_NUM_CORES", "").strip()
    if num.isdigit() and int(num) > 0:
        return int(num)
    visible = _count_core_list(os.environ.get("NEURON_RT_VISIBLE_CORES", ""))
    if visible:
        return visible
    try:
        devices = [p for p in dev_dir.iterdir() if re.fullmatch(r"neuron\d+", p.name)]
    except OSError:
        devices = []
    return len(devices) * CORES_PER_DEVICE if devices else CORES_PER_DEVICE


def resolve_num_cores(requested: int | None, manifest: NeuronManifest) -> int:
    """``requested`` > ``EMBER_NEURON_CORES`` > the manifest's export-time value > visible."""
    if requested is not None:
        cores = requested
    elif os.environ.get("EMBER_NEURON_CORES", "").strip():
        raw = os.environ["EMBER_NEURON_CORES"].strip()
        try:
            cores = int(raw)
        except ValueError as err:
            raise ConfigError(f"EMBER_NEURON_CORES must be an integer, got {raw!r}") from err
    elif manifest.num_cores:
        cores = manifest.num_cores
    else:
        cores = visible_neuron_cores()
    if cores < 1:
        raise ConfigError(f"the Neuron core count must be >= 1, got {cores}")
    return cores


# --------------------------------------------------------------------------- backend


class NeuronBackend(BackendDefaults):
    """Runs bucketed, padded chunks on per-core copies of the compiled graphs.

    ``max_batch_size`` is ``B x cores``: ``forward`` is called from one engine thread,
    so the only way to keep every NeuronCore busy is to receive enough rows for one
    full ``B`` chunk per core; the chunks then run concurrently, each on a free core.
    ``max_length`` is the largest bucket, which the engine truncates texts to.
    """

    def __init__(
        self,
        *,
        manifest: NeuronManifest,
        replicas: Sequence[dict[int, CompiledModule]],
        task: Task,
        out_dim: int,
    ) -> None:
        if not replicas:
            raise ConfigError("the Neuron backend needs at least one core's modules")
        self.manifest = manifest
        self.buckets = manifest.sequence_lengths
        self.compiled_batch_size = manifest.batch_size
        for core, modules in enumerate(replicas):
            for length in self.buckets:
                module = modules.get(length)
                if module is None:
                    raise ConfigError(f"core {core} has no module for sequence length {length}")
                expected = (manifest.batch_size, length)
                if tuple(module.static_shape) != expected:
                    raise ConfigError(
                        f"the graph for seq {length} is compiled for {module.static_shape}, "
                        f"the manifest says {expected}"
                    )
        self._replicas = list(replicas)
        self.num_cores = len(self._replicas)
        self.max_batch_size = self.compiled_batch_size * self.num_cores
        self.max_length = self.buckets[-1]
        # Feature-extraction graphs return token states, classifier graphs logits; the
        # pooling mode is applied by the heads, so it is not baked into the artifact.
        self.output = TOKEN_STATES if task == "embed" else LOGITS
        self._out_dim = out_dim
        self._free_cores: queue.Queue[int] = queue.Queue()
        for core in range(self.num_cores):
            self._free_cores.put(core)
        self._pool = (
            ThreadPoolExecutor(max_workers=self.num_cores, thread_name_prefix="ember-neuron")
            if self.num_cores > 1
            else None
        )
        casts = manifest.auto_cast not in (None, "none")
        self.info = BackendInfo(
            name="neuron",
            device=f"neuron ({self.num_cores} core{'s' if self.num_cores > 1 else ''})",
            dtype=f"{manifest.auto_cast_type} ({manifest.auto_cast})" if casts else "float32",
            details={
                "compiled_batch_size": str(self.compiled_batch_size),
                "sequence_buckets": ",".join(str(b) for b in self.buckets),
                "cores": str(self.num_cores),
                "optimum_class": manifest.optimum_class,
            },
        )

    def _run(self, chunk: Chunk, padded: TokenBatch) -> np.ndarray:
        """The chunk's padded rows through one free core's graph for its bucket."""
        core = self._free_cores.get()
        try:
            module = self._replicas[core][chunk.bucket]
            out = module(padded.input_ids, padded.attention_mask, padded.token_type_ids)
        finally:
            self._free_cores.put(core)
        out = np.asarray(out)
        if out.shape[0] != self.compiled_batch_size:
            raise RuntimeError(
                f"the graph for seq {chunk.bucket} returned {out.shape[0]} rows, "
                f"expected {self.compiled_batch_size}"
            )
        return out.astype(np.float32, copy=False)

    def forward(self, batch: TokenBatch) -> Outputs:
        rows = batch.shape[0]
        if rows == 0:
            return {self.output: np.zeros((0, self._out_dim), dtype=np.float32)}
        chunks = plan_chunks(
            lengths_from_mask(batch.attention_mask), self.buckets, self.compiled_batch_size
        )
        padded = [
            pad_chunk(batch, c, self.compiled_batch_size, self.manifest.pad_token_id)
            for c in chunks
        ]
        if self._pool is not None and len(chunks) > 1:
            results = list(self._pool.map(self._run, chunks, padded))
        else:
            results = [self._run(c, p) for c, p in zip(chunks, padded, strict=True)]
        if self.output == LOGITS:
            return {LOGITS: scatter_results(rows, list(zip(chunks, results, strict=True)))}
        # Token states come back at each chunk's bucket length: place them, and the mask
        # they were computed with (a row longer than its bucket was cut), at the longest.
        width = max(c.bucket for c in chunks)
        states = [_widen(r, width) for r in results]
        masks = [_widen(p.attention_mask, width) for p in padded]
        return {
            TOKEN_STATES: scatter_results(rows, list(zip(chunks, states, strict=True))),
            ATTENTION: scatter_results(rows, list(zip(chunks, masks, strict=True))).astype(
                np.int64
            ),
        }

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._replicas = []


def _widen(array: np.ndarray, width: int) -> np.ndarray:
    """Right-pad axis 1 with zeros to ``width``."""
    if array.shape[1] == width:
        return array
    pad = [(0, 0), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
    return np.pad(array, pad)


# --------------------------------------------------------------------------- load


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from err


def _compile_settings(model: ResolvedModel) -> tuple[int, tuple[int, ...], str | None]:
    batch_size = _env_int("EMBER_NEURON_BATCH_SIZE", DEFAULT_BATCH_SIZE)
    raw = os.environ.get("EMBER_NEURON_SEQUENCE_LENGTHS", "").strip()
    try:
        buckets = (
            normalize_buckets(int(x) for x in raw.split(",") if x.strip())
            if raw
            else default_buckets(model.max_length)
        )
    except ValueError as err:
        raise ConfigError(f"EMBER_NEURON_SEQUENCE_LENGTHS: {err}") from err
    auto_cast = _check_auto_cast(os.environ.get("EMBER_NEURON_AUTO_CAST", "").strip() or None)
    return batch_size, buckets, auto_cast


def _cache_root(model: ResolvedModel) -> Path:
    return artifacts.cache_root(model) / "neuron"


def _fingerprint(model: ResolvedModel, settings: tuple[int, tuple[int, ...], str | None]) -> str:
    """Key of a compile-at-load cache entry: the source files' identity + the shapes."""
    digest = hashlib.sha256()
    digest.update(repr((str(model.path), model.spec.revision, model.task, settings)).encode())
    for path in sorted(model.path.glob("*")):
        if path.is_file() and path.suffix in {".json", ".safetensors", ".bin"}:
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def compile_at_load(model: ResolvedModel, compiler: Compiler | None = None) -> Path:
    """Compile a hub id / plain model directory once into the cache; reuse it afterwards.

    Shapes come from ``EMBER_NEURON_BATCH_SIZE`` (default 8),
    ``EMBER_NEURON_SEQUENCE_LENGTHS`` (default 128,256,512 capped at the model's
    maximum) and ``EMBER_NEURON_AUTO_CAST``. Compiling takes minutes per bucket, which
    is why shipping an ``ember export`` artifact is the recommended path.
    """
    settings = _compile_settings(model)
    batch_size, buckets, auto_cast = settings
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.served_name).strip("_") or "model"
    out = _cache_root(model) / f"{name}-{_fingerprint(model, settings)}"
    if is_neuron_artifact(out):
        log.info("reusing compiled Neuron artifact %s", out)
        return out
    log.warning(
        "compiling %s for Neuron at load (batch %d, buckets %s); this takes minutes — "
        "`ember export --backend neuron` does it once ahead of time",
        model.spec.model_id,
        batch_size,
        list(buckets),
    )
    return export(
        model,
        out,
        batch_size=batch_size,
        sequence_lengths=buckets,
        auto_cast=auto_cast,
        compiler=compiler,
    )


def load(
    model: ResolvedModel,
    *,
    num_cores: int | None = None,
    module_loader: ModuleLoader | None = None,
    compiler: Compiler | None = None,
) -> NeuronBackend:
    """Load an ``export`` artifact (or compile a plain model first) onto the NeuronCores."""
    root = model.path if is_neuron_artifact(model.path) else compile_at_load(model, compiler)
    manifest = read_manifest(root)
    if TASK_CLASSES[model.task] != manifest.optimum_class and not (
        model.task == "embed" and manifest.optimum_class == "NeuronModelForSentenceTransformers"
    ):
        raise ConfigError(
            f"{root} was compiled as {manifest.optimum_class} (task {manifest.task}); "
            f"it cannot serve task {model.task!r}"
        )
    cores = resolve_num_cores(num_cores, manifest)
    loader = module_loader or optimum_load
    replicas = [
        {length: loader(root, manifest, length, core) for length in manifest.sequence_lengths}
        for core in range(cores)
    ]
    out_dim = model.hidden_size if model.task == "embed" else max(model.num_labels, 1)
    return NeuronBackend(
        manifest=manifest,
        replicas=replicas,
        task=model.task,
        out_dim=out_dim,
    )
