"""Neuron artifacts: compile a model for static shapes, and the manifest that describes it.

neuronx-cc compiles a graph for one exact input shape, so ``export`` compiles one graph
per sequence bucket at a fixed batch ``B`` and writes them into one directory, with the
model's config/tokenizer files (so ``--model-id DIR`` resolves it like a plain model)
and an artifact manifest (``ember.backends.artifacts``) that records the shapes. A model
that is not an export is compiled at load, once, into the artifact cache.

Shapes come from the model's runtime settings (``--neuron-batch-size``,
``--neuron-sequence-lengths``, ``--neuron-auto-cast``, ``--neuron-cores``). Compiling
goes through one seam, ``Compiler``: the default calls optimum-neuron
(``NeuronModelForX.from_pretrained(..., export=True, batch_size=, sequence_length=)``,
``save_pretrained``), which was written against the optimum-neuron sources and has not
been run on Inferentia from this repo; tests pass a stand-in.
"""

from __future__ import annotations

import importlib
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import ember.backends.artifacts as artifacts
from ember.backends.neuron_shapes import default_buckets, normalize_buckets
from ember.defaults import NEURON_AUTO_CAST, NEURON_BATCH_SIZE
from ember.errors import ConfigError, MissingDependency
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

BACKEND = "neuron"
MANIFEST_VERSION = 1
MISSING_SDK = (
    "Neuron backend needs the AWS Neuron SDK: use the Neuron DLC image or "
    "pip install 'ember[neuron]'"
)
AUTO_CAST_TYPE = "bf16"  # what auto_cast casts to
# Bump when what `export` writes changes: compile-at-load caches then miss.
FORMAT_VERSION = 1
Progress = Callable[[str], None]

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


def import_optimum_neuron() -> Any:
    try:
        return importlib.import_module("optimum.neuron")
    except ImportError as err:
        raise MissingDependency(MISSING_SDK) from err


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class NeuronManifest:
    """What a Neuron artifact's manifest records; enough to load without the model."""

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
        return {"backend": BACKEND, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NeuronManifest:
        if data.get("backend") != BACKEND:
            raise ConfigError(f"not a Neuron artifact manifest (backend={data.get('backend')!r})")
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
    artifacts.write_manifest(Path(directory), manifest.to_dict())
    return Path(directory) / artifacts.MANIFEST_NAME


def read_manifest(directory: Path) -> NeuronManifest:
    data = artifacts.read_manifest(Path(directory))
    if data is None:
        raise ConfigError(
            f"{directory} has no readable {artifacts.MANIFEST_NAME}: not a Neuron artifact"
        )
    return NeuronManifest.from_dict(data)


def is_neuron_artifact(path: Path) -> bool:
    """True for a directory written by ``export`` (or compiled at load) and complete."""
    return (artifacts.read_manifest(Path(path)) or {}).get("backend") == BACKEND


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class CompileOptions:
    """The shapes and casts to compile for, from the model's runtime settings."""

    batch_size: int
    sequence_lengths: tuple[int, ...]
    auto_cast: str | None
    num_cores: int | None  # recorded as the serving default; not part of the graphs

    @property
    def auto_cast_type(self) -> str | None:
        return AUTO_CAST_TYPE if self.auto_cast else None

    def cache_options(self) -> dict[str, Any]:
        """What changes the compiled graphs: the key of a compile-at-load cache entry."""
        return {
            "format": FORMAT_VERSION,
            "batch_size": self.batch_size,
            "sequence_lengths": list(self.sequence_lengths),
            "auto_cast": self.auto_cast,
            "auto_cast_type": self.auto_cast_type,
            "versions": artifacts.package_versions(
                ["optimum-neuron", "neuronx-cc", "torch-neuronx"]
            ),
        }


def compile_options(model: ResolvedModel) -> CompileOptions:
    """The model's neuron settings, checked against it (a spec built without
    settings gets the settings' defaults)."""
    if model.facts.answer_tokens:
        raise ConfigError(
            f"model {model.served_name!r} is an LLM reranker ({model.facts.network_name}, "
            f"{model.architecture}): the neuron backend compiles encoders and sequence "
            "classifiers; use --backend torch or onnx"
        )
    runtime = model.runtime
    batch_size = runtime.neuron_batch_size or NEURON_BATCH_SIZE
    if batch_size < 1:
        raise ConfigError(f"--neuron-batch-size must be >= 1, got {batch_size}")
    if runtime.neuron_sequence_lengths:
        buckets = normalize_buckets(runtime.neuron_sequence_lengths)
        if buckets[-1] > model.max_length:
            raise ConfigError(
                f"sequence length {buckets[-1]} exceeds the model's maximum of {model.max_length}"
            )
    else:
        buckets = default_buckets(model.max_length)
    auto_cast = runtime.neuron_auto_cast or None
    if auto_cast is not None and auto_cast not in NEURON_AUTO_CAST:
        raise ConfigError(
            f"--neuron-auto-cast must be one of {'|'.join(NEURON_AUTO_CAST)}, got {auto_cast!r}"
        )
    if runtime.neuron_cores is not None and runtime.neuron_cores < 1:
        raise ConfigError(f"--neuron-cores must be >= 1, got {runtime.neuron_cores}")
    return CompileOptions(batch_size, buckets, auto_cast, runtime.neuron_cores)


# --------------------------------------------------------------------------- compile

# Compiles one bucket of ``model`` into ``bucket_dir`` (keywords: optimum_class,
# batch_size, sequence_length, auto_cast, auto_cast_type).
Compiler = Callable[..., None]


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
    optimum_neuron = import_optimum_neuron()
    cls = getattr(optimum_neuron, optimum_class)
    kwargs: dict[str, Any] = {
        "export": True,
        "batch_size": batch_size,
        "sequence_length": sequence_length,
        "trust_remote_code": model.runtime.trust_remote_code,
    }
    if auto_cast is not None:
        kwargs["auto_cast"] = auto_cast
        if auto_cast_type is not None:
            kwargs["auto_cast_type"] = auto_cast_type
    neuron_model = cls.from_pretrained(str(model.path), **kwargs)
    neuron_model.save_pretrained(str(bucket_dir))


def _write(
    model: ResolvedModel,
    out: Path,
    options: CompileOptions,
    say: Progress,
    compiler: Compiler | None,
) -> Path:
    """Compile every bucket into ``out``; the manifest goes last, any old one first, so
    an interrupted compile is never taken for an artifact."""
    optimum_class = TASK_CLASSES[model.task]
    compile_bucket = compiler or optimum_compile
    out.mkdir(parents=True, exist_ok=True)
    (out / artifacts.MANIFEST_NAME).unlink(missing_ok=True)
    artifacts.copy_model_files(model.path, out)

    bucket_dirs: dict[str, str] = {}
    for index, length in enumerate(options.sequence_lengths, start=1):
        name = bucket_dir_name(length)
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        step = f"[{index}/{len(options.sequence_lengths)}]"
        say(f"compiling {optimum_class} for (batch {options.batch_size}, seq {length}) {step}")
        compile_bucket(
            model,
            target,
            optimum_class=optimum_class,
            batch_size=options.batch_size,
            sequence_length=length,
            auto_cast=options.auto_cast,
            auto_cast_type=options.auto_cast_type,
        )
        bucket_dirs[str(length)] = name

    pad = model.config.get("pad_token_id")
    manifest = NeuronManifest(
        task=model.task,
        pooling=model.pooling,
        normalize=model.normalize,
        optimum_class=optimum_class,
        batch_size=options.batch_size,
        sequence_lengths=options.sequence_lengths,
        pad_token_id=pad if isinstance(pad, int) else 0,
        num_cores=options.num_cores,
        auto_cast=options.auto_cast,
        auto_cast_type=options.auto_cast_type,
        source_model=model.runtime.model_id,
        model_type=model.model_type,
        architecture=model.architecture,
        hidden_size=model.hidden_size,
        num_labels=model.num_labels,
        bucket_dirs=bucket_dirs,
    )
    write_manifest(out, manifest)
    say(f"wrote Neuron artifact to {out}")
    return out


def export(
    model: ResolvedModel,
    out_dir: Path,
    progress: Progress | None = None,
    *,
    compiler: Compiler | None = None,
) -> Path:
    """``ember export --backend neuron``: one graph per sequence bucket in ``out_dir``.

    Layout: the manifest + the model's config/tokenizer/sentence-transformers files at
    the top (so ``ember serve --model-id DIR`` resolves it like a plain model) + one
    ``seq_<L>/`` directory per bucket as written by optimum's ``save_pretrained``.
    ``--neuron-cores`` is recorded as the serving default; it does not change the graphs.
    """
    options = compile_options(model)
    return _write(model, Path(out_dir), options, progress or log.info, compiler)


def compile_at_load(model: ResolvedModel, compiler: Compiler | None = None) -> Path:
    """Compile a hub id / plain model directory once into the cache; reuse it afterwards.

    Compiling takes minutes per bucket, which is why shipping an ``ember export``
    artifact is the recommended path. The cache entry records no core count: the one
    given when serving applies, else the cores visible.
    """
    options = replace(compile_options(model), num_cores=None)
    target = artifacts.artifact_dir(model, BACKEND, options.cache_options())
    if is_neuron_artifact(target):
        log.info("reusing compiled Neuron artifact %s", target)
        return target
    log.warning(
        "compiling %s for Neuron at load (batch %d, buckets %s); this takes minutes — "
        "`ember export --backend neuron` does it once ahead of time",
        model.runtime.model_id,
        options.batch_size,
        list(options.sequence_lengths),
    )
    with artifacts.staging(target) as tmp:
        _write(model, tmp, options, log.info, compiler)
    return target
