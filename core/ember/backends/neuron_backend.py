"""AWS Inferentia2/Trainium backend: graphs compiled for static shapes, run per NeuronCore.

A Neuron artifact (``neuron_export``: one graph per sequence bucket at a fixed batch
``B``) is loaded once per NeuronCore, and every batch is reshaped to fit
(``neuron_shapes``: smallest bucket per text, chunks of ``B`` rows padded to ``(B, L)``,
results put back in order); chunks run on free cores in parallel.

Loading goes through one seam, ``ModuleLoader`` (a ``CompiledModule`` per bucket and
core), so everything above it (bucketing, padding, truncation, ordering, multi-core
dispatch) runs and is tested on machines without the Neuron SDK. The default loader
calls optimum-neuron's ``from_pretrained`` and torch-neuronx core placement; those were
written against the optimum-neuron sources and have not been run on Inferentia from
this repo.
"""

from __future__ import annotations

import os
import queue
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ember.backends.base import BackendDefaults, BackendInfo
from ember.backends.neuron_export import (
    MISSING_SDK,
    TASK_CLASSES,
    Compiler,
    NeuronManifest,
    compile_at_load,
    import_optimum_neuron,
    is_neuron_artifact,
    read_manifest,
)
from ember.backends.neuron_shapes import (
    Chunk,
    lengths_from_mask,
    pad_chunk,
    plan_chunks,
    scatter_results,
)
from ember.batch import ATTENTION, LOGITS, TOKEN_STATES, Outputs, TokenBatch
from ember.errors import ConfigError, MissingDependency
from ember.models.spec import ResolvedModel, Task

# NeuronCores per Neuron device on inf2 and trn1; inf2.xlarge has one device.
CORES_PER_DEVICE = 2


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


# Loads the graph of one bucket onto one NeuronCore: (artifact root, manifest, L, core).
ModuleLoader = Callable[[Path, NeuronManifest, int, int], CompiledModule]


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
    optimum_neuron = import_optimum_neuron()
    cls = getattr(optimum_neuron, manifest.optimum_class)
    neuron_model = cls.from_pretrained(str(manifest.bucket_dir(root, sequence_length)))
    if core != 0:
        try:
            import torch_neuronx
        except ImportError as err:
            raise MissingDependency(MISSING_SDK) from err
        torch_neuronx.experimental.set_neuron_cores(neuron_model.model, start_nc=core, nc_count=1)
    return OptimumModule(neuron_model, manifest.output_field)


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
    """``requested`` (``--neuron-cores``) > the manifest's export-time value > visible."""
    if requested is not None:
        cores = requested
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


def load(
    model: ResolvedModel,
    *,
    num_cores: int | None = None,
    module_loader: ModuleLoader | None = None,
    compiler: Compiler | None = None,
) -> NeuronBackend:
    """Load an export artifact (or compile a plain model first) onto the NeuronCores.

    ``num_cores`` defaults to the model's ``--neuron-cores``.
    """
    root = model.path if is_neuron_artifact(model.path) else compile_at_load(model, compiler)
    manifest = read_manifest(root)
    if TASK_CLASSES[model.task] != manifest.optimum_class and not (
        model.task == "embed" and manifest.optimum_class == "NeuronModelForSentenceTransformers"
    ):
        raise ConfigError(
            f"{root} was compiled as {manifest.optimum_class} (task {manifest.task}); "
            f"it cannot serve task {model.task!r}"
        )
    requested = num_cores if num_cores is not None else model.runtime.neuron_cores
    cores = resolve_num_cores(requested, manifest)
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
