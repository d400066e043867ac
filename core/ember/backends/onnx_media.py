"""ONNX Runtime for dual encoders (CLIP, SigLIP): one ``InferenceSession`` per tower.

The graphs come from ``onnx_media_export`` (exported, fused and, for int8, quantised
once, cached in ``--cache-dir``). ``forward`` feeds a tower what the model's processor
returned and the graph takes, and returns its projected embedding, as
``TorchMediaBackend`` does, so the same dense head normalises both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import ember.backends.artifacts as artifacts
from ember.backends.base import BackendDefaults, BackendInfo
from ember.backends.onnx_export import Plan, import_ort
from ember.backends.onnx_media_export import OUTPUT, TOWER_FILES, media_plan, prepare
from ember.backends.onnx_session import session_plan
from ember.batch import EMBEDDINGS, Batch, FeatureBatch, Outputs
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel


class OnnxMediaBackend(BackendDefaults):
    """A session per tower; on CPU ``forward`` runs from ``parallel_forwards`` threads at
    once, each run single-threaded or on a small pool (``cpu_forward_plan``), as the text
    ONNX backend does."""

    def __init__(self, model: ResolvedModel, directory: Path, plan: Plan) -> None:
        ort = import_ort()
        # CLIP's text is padded to the batch's longest and ORT computes every padded
        # position; images carry no padding (one shape per batch).
        opts, self.parallel_forwards, self.padding = session_plan(model, plan)
        modalities = model.family.modalities
        self.sessions: dict[str, Any] = {}
        self._inputs: dict[str, dict[str, str]] = {}
        for modality in modalities:
            path = directory / TOWER_FILES[modality]
            session = ort.InferenceSession(str(path), opts, providers=plan.providers)
            self.sessions[modality] = session
            self._inputs[modality] = {i.name: i.type for i in session.get_inputs()}
        self.info = BackendInfo(
            name="onnx",
            device=plan.device,
            dtype=plan.dtype,
            details={
                "providers": ",".join(self.sessions[modalities[0]].get_providers()),
                "artifact": artifacts.shown_path(directory, model),
                "threads": f"{self.parallel_forwards}x{opts.intra_op_num_threads}",
                "towers": ",".join(modalities),
            },
        )

    def forward(self, batch: Batch) -> Outputs:
        if not isinstance(batch, FeatureBatch):
            raise ConfigError("a media model's backend takes a FeatureBatch")
        takes = self._inputs[batch.modality]
        feeds = {}
        for name, kind in takes.items():
            if name not in batch.arrays:
                raise ConfigError(
                    f"the {batch.modality} tower takes {name!r}, which the processor did not "
                    f"return (it returned {sorted(batch.arrays)})"
                )
            dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(kind, np.float32)
            feeds[name] = np.ascontiguousarray(batch.arrays[name], dtype=dtype)
        (out,) = self.sessions[batch.modality].run([OUTPUT], feeds)
        return {EMBEDDINGS: np.asarray(out, dtype=np.float32)}

    def close(self) -> None:
        self.sessions = {}


def load(model: ResolvedModel) -> OnnxMediaBackend:
    """The towers' cached graphs (built on first load) in sessions for the device and
    dtype asked for."""
    ort = import_ort()
    plan = media_plan(model, ort.get_available_providers())
    return OnnxMediaBackend(model, prepare(model, plan), plan)
