"""OpenVINO on the CPU: the onnx backend's float32 graph, run at bfloat16 precision, or
(``--dtype int8``, the fast tier) that graph with int8 weights, its activations quantised
as it runs (``openvino_int8``).

This is ``--backend auto``'s near-exact path on a CPU with AVX512-BF16 or AMX
(``ember.backends.near_exact``), not a backend of its own: it reads the same cached graph
``onnx_export`` builds, and OpenVINO's CPU plugin runs its matmuls in bf16 while keeping
normalisations and softmax in float32. Measured on the project's 2-core Zen 4 (AVX512-BF16),
all-MiniLM-L6-v2, 32 sentences of 64 tokens, one stream on both cores, quiet host: 145 ms
per batch (fp32 on the same plan 261 ms; the int8 tier 89 ms, its activations quantised in
groups of 128), worst cosine 0.99996 to fp32 over the 2,048-sentence anchor corpus.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np

import ember.backends.artifacts as artifacts
import ember.backends.openvino_int8 as openvino_int8
from ember.backends.base import Backend, BackendDefaults, BackendInfo
from ember.backends.onnx_export import find_onnx, import_ort, plan_for, prepare
from ember.batch import LOGITS, TOKEN_STATES, Outputs, TokenBatch
from ember.cpu import cpu_forward_plan, physical_cores
from ember.errors import ConfigError, MissingDependency
from ember.models.spec import ResolvedModel

NAME = "openvino"
PRECISIONS = {"bfloat16": "bf16", "float32": "f32"}
# The encoders the NNCF int8 graph was measured on (MiniLM's BERT, corpus-wide).
INT8_ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
INT8 = "int8"  # int8 matmuls; the rest at bf16 where the CPU has it natively, else f32
# Where a model folder may ship its OpenVINO IR: sentence-transformers' save, optimum-intel's.
IR_FILES = ("openvino/openvino_model.xml", "openvino_model.xml")


def shipped_ir(path: Path) -> Path | None:
    """The OpenVINO IR a model folder ships with no ONNX graph beside it (sentence-
    transformers' ``backend="openvino"`` save, or optimum-intel's root layout), its weights
    file beside it; None otherwise (a shipped ONNX graph stays the onnx backend's, and the
    near-exact check's reference)."""
    if find_onnx(path) is not None:
        return None
    for name in IR_FILES:
        xml = path / name
        if xml.is_file() and xml.with_suffix(".bin").is_file():
            return xml
    return None


def ir_choice(model: ResolvedModel) -> Path | None:
    """The IR auto serves ``model`` from on a CPU: a shipped one (``shipped_ir``), where
    openvino is installed and runs the model's family; None where the onnx path applies."""
    from importlib.util import find_spec

    if (ir := shipped_ir(model.path)) is None or find_spec("openvino") is None:
        return None
    return ir if serves(model, "float32") is None else None


def serves(model: ResolvedModel, precision: str) -> str | None:
    """Why openvino cannot serve ``model`` at ``precision`` here; None where it can: a
    text encoder pooled to one vector or a sequence classifier; for int8 (the fast tier)
    also a CPU with int8 dot-product units (VNNI, AMX) and nncf installed."""
    from importlib.util import find_spec

    from ember.cpu import int8_dot_product

    if model.backbone not in ("encoder", "sequence-classifier") or model.facts.answer_tokens:
        return f"no openvino path for {model.family.name} models"
    if model.task_adapters or not model.family.runs_on("onnx"):
        return f"{model.family.name} models have no ONNX graph to quantise"
    if model.backbone == "encoder" and model.family.capabilities != ["embed"]:
        return "no openvino path for multi-vector or sparse outputs"
    if precision != INT8:
        return None
    if model.model_type not in INT8_ENCODERS:
        # No probe guards the int8 graph: it serves only the encoders it was measured on
        # (a decoder embedder's int8 stays on onnx's exact integer kernels).
        return f"the int8 graph is measured on BERT-style encoders, not {model.model_type}"
    if int8_dot_product() != "vnni":
        return "this CPU has no int8 dot-product unit (AVX512-VNNI or AMX)"
    if find_spec("openvino") is None or find_spec("nncf") is None:
        return "openvino and nncf are not installed (pip install 'ember[openvino]')"
    return None


def _hint(precision: str) -> str:
    """OpenVINO's inference precision for ``precision`` (int8: what runs outside the
    int8 matmuls)."""
    if precision == INT8:
        from ember.cpu import native_bf16

        return "bf16" if native_bf16() else "f32"
    return PRECISIONS[precision]


def _ready_numpy_bridge(openvino: Any) -> None:
    """Make OpenVINO's first numpy view of a tensor here, in the loading thread.

    pybind11 looks numpy's C API up once per process, under a C++ static guard and the GIL
    at once: two forward threads making their first ``tensor.data`` together deadlock (one
    holds the GIL waiting on the guard, the other holds the guard waiting on the GIL). A
    start with a cached near-exact decision, whose first infers were the batcher's warm-up
    from two threads, hung so in 4 of 8 starts of ``examples/embedded.py``.
    """
    openvino.Tensor(np.zeros(1, dtype=np.float32)).data  # noqa: B018 (the lookup is the point)


def compile_graph(path: Any, precision: str, threads: int) -> Any:
    """An ONNX graph compiled for this CPU at ``precision``: one stream of ``threads``
    threads (all the cores the forward plan has), which every forward thread's infer
    request feeds in turn.

    One stream on all cores, not a stream per forward thread: on the 2-core Zen 4, MiniLM,
    a batch of 32 at 64 tokens took 145 ms on 1x2 against 257 ms on 2x1 at bf16 (int8: 97
    against 198), and served (``benchmarks/run.py --loads ab``, in one run) the near-exact
    default went from 117 to 175 sent/s at (a), 110 to 147 at (b); the fast tier from 135
    to 197 and 132 to 169. The second request waiting on the stream keeps the next batch
    ready while one runs.
    """
    import openvino

    _ready_numpy_bridge(openvino)
    config = {
        "INFERENCE_PRECISION_HINT": _hint(precision),
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    if precision == INT8:
        config.update(openvino_int8.runtime_config())
    return openvino.Core().compile_model(str(path), "CPU", config)


def backend_info(
    model: ResolvedModel, path: Any, precision: str, threads: str, **more: str
) -> BackendInfo:
    """What /v1/models and /info show for an OpenVINO path (text or towers)."""
    import openvino

    details = {
        "runtime": f"openvino {openvino.__version__.split('-')[0]}",
        "artifact": artifacts.shown_path(path, model),
        "threads": threads,
        **more,
    }
    return BackendInfo(name=NAME, device="cpu", dtype=precision, details=details)


def check_precision(precision: str) -> None:
    """Refuse what this path cannot run: openvino missing, or a dtype it has no hint for."""
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "the near-exact path needs openvino: pip install 'ember[openvino]'"
        ) from exc
    if precision not in (*PRECISIONS, INT8):
        raise ConfigError(f"openvino runs bfloat16, float32 or int8 here, not {precision!r}")


class OpenVinoBackend(BackendDefaults):
    """One compiled model on one stream; each forward thread feeds it its own infer request."""

    def __init__(self, model: ResolvedModel, path: Any, precision: str) -> None:
        self.parallel_forwards, threads = cpu_forward_plan(
            model.runtime.forward_workers, physical_cores()
        )
        # The engine's CPU budget, not ORT's near-zero one: one stream runs one batch at a
        # time, and a batch of 1-4 cost up to a third more per token than one of 8 or more
        # (int8, 72 tokens: 48-64 against 45-50 us per token). Served
        # in-process (anchor corpus, 4 clients x 32 / 32 x 1, two interleaved rounds, 2-core
        # Zen 4), ORT's budget -> this one: int8 219, 223 -> 257, 256 / 160, 188 -> 206, 218
        # sent/s; bf16 168, 174 -> 184, 200 / 148, 163 -> 178, 161.
        self.padding = None
        cores = self.parallel_forwards * threads
        self.compiled = compile_graph(path, precision, cores)
        self.inputs = {i.get_any_name() for i in self.compiled.inputs}
        if "input_ids" not in self.inputs:
            raise ConfigError(f"{path} has no input_ids input (inputs: {sorted(self.inputs)})")
        names = {n for o in self.compiled.outputs for n in o.get_names()}
        wanted = ("last_hidden_state", "token_embeddings", "logits", "scores")
        found = [n for n in wanted if n in names]
        if not found:
            raise ConfigError(f"{path}: none of the outputs {sorted(names)} is {wanted}")
        self.output_name = found[0]
        self.name = TOKEN_STATES if model.backbone == "encoder" else LOGITS
        # One infer request per forward thread, made here, not by the threads' first
        # forwards at once; each forward borrows one.
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.parallel_forwards):
            self._requests.put(self.compiled.create_infer_request())
        plan = f"1x{cores}, {self.parallel_forwards} requests"
        self.info = backend_info(model, path, precision, plan)

    def forward(self, batch: TokenBatch) -> Outputs:
        feeds = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
        }
        feeds = {k: v.astype(np.int64, copy=False) for k, v in feeds.items() if k in self.inputs}
        request = self._requests.get()
        try:
            result = request.infer(feeds)
            return {self.name: np.array(result[self.output_name], dtype=np.float32)}
        finally:
            self._requests.put(request)

    def close(self) -> None:
        self.compiled = None


def load(model: ResolvedModel) -> Backend:
    """The model's float32 ONNX graph (built or cached as the onnx backend does), compiled
    for this CPU at ``model.runtime.dtype``'s precision (bfloat16 or float32), or quantised
    to int8 weights (``openvino_int8``) except on AMX, where bf16 is the faster
    (``openvino_int8.slower_than_bf16``) and info's dtype says so. A folder that ships an
    IR and no ONNX graph (``shipped_ir``) runs its IR, as shipped, at bfloat16 or float32
    (auto's reference; no torch needed)."""
    precision = model.runtime.dtype
    ir = shipped_ir(model.path)
    if ir is not None and precision == "auto":
        precision = "float32"  # auto's reference: the near-exact check may move it to bf16
    check_precision(precision)
    if why_not := serves(model, precision):
        raise ConfigError(f"openvino {precision}: {why_not}")
    if precision == INT8 and openvino_int8.slower_than_bf16():
        precision = "bfloat16"  # the fast tier on AMX: faster than int8 and nearer fp32
    if ir is not None:
        if precision == INT8:
            raise ConfigError(
                f"model {model.served_name!r} ships an OpenVINO IR ({ir.relative_to(model.path)}) "
                "and no ONNX graph: the int8 tier quantises an ONNX graph; serve the IR with "
                "--dtype float32 or auto"
            )
        return OpenVinoBackend(model, ir, precision)

    exact = model.on_backend("onnx", "cpu", "float32")
    plan = plan_for(exact, import_ort().get_available_providers())
    graph = prepare(exact, plan)
    if precision == INT8:
        graph = openvino_int8.prepare(exact, graph)
    return OpenVinoBackend(model, graph, precision)
