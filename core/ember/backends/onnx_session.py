"""How an ONNX Runtime session runs on its device: what the text and media ONNX backends
share (options, forwards at once, padding budget)."""

from __future__ import annotations

from typing import Any

from ember.backends.base import PaddingBudget
from ember.backends.onnx_export import Plan, import_ort
from ember.cpu import cpu_forward_plan, physical_cores
from ember.models.spec import ResolvedModel

# ORT computes every padded position and a CPU run has little fixed cost, so batches
# carry almost no padding. Served MiniLM fp32, interleaved A/B against the engine's CPU
# default (64 tokens, 10%): 32 sentences x c4 took 19.1 / 19.4 s against 20.5 / 21.0,
# one sentence x c32 20.9 / 21.0 s against 21.4 / 22.3. Torch and CTranslate2 gained
# nothing from it (torch lost 3-5% at c32 to the extra, smaller forwards).
ORT_CPU_PADDING = PaddingBudget(tokens=4, fraction=0.01)


def session_plan(model: ResolvedModel, plan: Plan) -> tuple[Any, int, PaddingBudget | None]:
    """(session options, forwards run at once, padding budget) for ``plan``'s device; the
    text and media ONNX backends both run their sessions this way."""
    ort = import_ort()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    if plan.device != "cpu":
        return opts, 1, None  # the engine's default for the device
    # Several single-threaded runs beat one run on a pool that stalls at every barrier
    # when another process takes a core (ember.cpu.cpu_forward_plan).
    forwards, threads = cpu_forward_plan(model.runtime.forward_workers, physical_cores())
    opts.intra_op_num_threads = threads
    # Idle pool threads sleep instead of spinning: tokenisation, decoding and HTTP share
    # these cores between forward passes, and a spinning pool starves them (measured
    # here: 2-thread int8 pass 16.8 s spinning vs 10.9 s not, on a busy 2-core box).
    # Waking costs microseconds against 10-100 ms batches.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts, forwards, ORT_CPU_PADDING
