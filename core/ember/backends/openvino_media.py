"""OpenVINO on the CPU for dual encoders (CLIP, SigLIP): the onnx backend's float32 tower
graphs, each compiled at bfloat16 precision.

The towers' side of ``--backend auto``'s near-exact path (``ember.backends.near_exact``):
the same cached graphs ``onnx_media_export`` builds, fed as ``OnnxMediaBackend`` feeds
them, returning the projected embedding the dense head normalises.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np

from ember.backends.base import BackendDefaults
from ember.backends.onnx_export import import_ort
from ember.backends.onnx_media_export import OUTPUT, TOWER_FILES, media_plan, prepare
from ember.backends.openvino_backend import backend_info, check_precision, compile_graph
from ember.batch import EMBEDDINGS, Batch, FeatureBatch, Outputs
from ember.cpu import cpu_forward_plan, physical_cores
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel


class OpenVinoMediaBackend(BackendDefaults):
    """A compiled graph per tower, one stream each; each forward thread feeds its own
    infer requests."""

    def __init__(self, model: ResolvedModel, directory: Any, precision: str) -> None:
        self.parallel_forwards, threads = cpu_forward_plan(
            model.runtime.forward_workers, physical_cores()
        )
        self.compiled: dict[str, Any] = {}
        self._inputs: dict[str, dict[str, np.dtype]] = {}
        for modality in model.family.modalities:
            path = directory / TOWER_FILES[modality]
            compiled = compile_graph(path, precision, self.parallel_forwards * threads)
            self.compiled[modality] = compiled
            self._inputs[modality] = {
                i.get_any_name(): np.dtype(i.get_element_type().to_dtype()) for i in compiled.inputs
            }
        # One infer request per tower and forward thread, made here and lent to forwards
        # (as the text backend does), not made by the threads' first forwards at once.
        self._requests = {m: queue.SimpleQueue() for m in self.compiled}
        for modality, compiled in self.compiled.items():
            for _ in range(self.parallel_forwards):
                self._requests[modality].put(compiled.create_infer_request())
        threading_plan = f"1x{self.parallel_forwards * threads}, {self.parallel_forwards} requests"
        towers = ",".join(model.family.modalities)
        self.info = backend_info(model, directory, precision, threading_plan, towers=towers)

    def forward(self, batch: Batch) -> Outputs:
        if not isinstance(batch, FeatureBatch):
            raise ConfigError("a media model's backend takes a FeatureBatch")
        feeds = {}
        for name, dtype in self._inputs[batch.modality].items():
            if name not in batch.arrays:
                raise ConfigError(
                    f"the {batch.modality} tower takes {name!r}, which the processor did not "
                    f"return (it returned {sorted(batch.arrays)})"
                )
            feeds[name] = np.ascontiguousarray(batch.arrays[name], dtype=dtype)
        requests = self._requests[batch.modality]
        request = requests.get()
        try:
            result = request.infer(feeds)
            return {EMBEDDINGS: np.array(result[OUTPUT], dtype=np.float32)}
        finally:
            requests.put(request)

    def close(self) -> None:
        self.compiled = {}


def load(model: ResolvedModel) -> OpenVinoMediaBackend:
    """The towers' float32 graphs (built or cached as the onnx backend does), compiled for
    this CPU at ``model.runtime.dtype``'s precision (bfloat16 or float32)."""
    precision = model.runtime.dtype
    check_precision(precision)
    exact = model.on_backend("onnx", "cpu", "float32")
    plan = media_plan(exact, import_ort().get_available_providers())
    return OpenVinoMediaBackend(model, prepare(exact, plan), precision)
