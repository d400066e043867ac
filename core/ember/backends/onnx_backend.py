"""ONNX Runtime backend: one ``InferenceSession`` over the graph ``onnx_export`` prepared.

The session applies ``ORT_ENABLE_ALL`` for the machine it runs on, on top of the
hardware-independent fusions baked into the artifact. On CPU, several single-threaded
runs go at once (``ember.cpu.cpu_forward_plan``) and batches carry almost no padding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import ember.backends.artifacts as artifacts
from ember.backends.base import Backend, BackendDefaults, BackendInfo
from ember.backends.onnx_export import BACKEND, Plan, import_ort, plan_for, prepare
from ember.backends.onnx_session import ORT_CPU_PADDING, session_plan
from ember.batch import LOGITS, TOKEN_STATES, Outputs, TokenBatch
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

# ORT_CPU_PADDING: the padding budget its sessions run CPU batches with.
__all__ = ["ORT_CPU_PADDING", "OnnxBackend", "load"]


class OnnxBackend(BackendDefaults):
    """One ``InferenceSession``; on CPU ``forward`` runs from ``parallel_forwards`` threads
    at once (``session.run`` is thread-safe), each run on ``threads`` intra-op threads."""

    def __init__(self, model: ResolvedModel, path: Path, plan: Plan) -> None:
        ort = import_ort()
        opts, self.parallel_forwards, self.padding = session_plan(model, plan)
        self.session = ort.InferenceSession(str(path), opts, providers=plan.providers)
        inputs = {i.name: i.type for i in self.session.get_inputs()}
        if "input_ids" not in inputs:
            raise ConfigError(f"{path} has no input_ids input (inputs: {sorted(inputs)})")
        self._inputs = inputs
        self._int32 = {n for n, t in inputs.items() if t == "tensor(int32)"}
        self.path = path  # the artifact loaded (info shows it relative to the cache)
        self.name = TOKEN_STATES if model.backbone == "encoder" else LOGITS
        self.output = self._pick_output(model)
        self.info = BackendInfo(
            name=BACKEND,
            device=plan.device,
            dtype=plan.dtype,
            details={
                "providers": ",".join(self.session.get_providers()),
                "artifact": artifacts.shown_path(path, model),
                "threads": f"{self.parallel_forwards}x{opts.intra_op_num_threads}",
            },
        )

    def _pick_output(self, model: ResolvedModel) -> str:
        outs = {o.name: o.shape for o in self.session.get_outputs()}
        wanted = (
            ("last_hidden_state", "token_embeddings")
            if model.backbone == "encoder"
            else ("logits", "scores")
        )
        for name in wanted:
            if name in outs:
                return name
        rank = 3 if model.backbone == "encoder" else 2
        for name, shape in outs.items():
            if len(shape) == rank:
                return name
        raise ConfigError(
            f"{self.path}: no {'token-states' if rank == 3 else 'logits'} output among "
            f"{list(outs)}; Ember pools token states itself with the model's pooling mode"
        )

    def forward(self, batch: TokenBatch) -> Outputs:
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = batch.token_type_ids
        feeds = {
            k: (v.astype(np.int32) if k in self._int32 else v.astype(np.int64, copy=False))
            for k, v in feeds.items()
            if k in self._inputs
        }
        (out,) = self.session.run([self.output], feeds)
        return {self.name: np.asarray(out, dtype=np.float32)}

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]


def load(model: ResolvedModel) -> Backend:
    """The model's graph (``onnx_export.prepare``: its own export, or a cached build) in
    a session for the device and dtype asked for; a dual encoder's towers load in
    ``onnx_media``."""
    if model.backbone == "dual-encoder":
        from ember.backends.onnx_media import load as load_towers

        return load_towers(model)
    ort = import_ort()
    plan = plan_for(model, ort.get_available_providers())
    path = prepare(model, plan)
    return OnnxBackend(model, path, plan)
