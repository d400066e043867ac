"""ONNX artifacts: export once, fuse with ORT's transformer optimizer, optionally int8.

Pipeline at first load (cached under ``artifacts.artifact_dir``; later loads open the
cached graph directly), and for ``ember export --backend onnx``:

1. ``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``), eager
   attention, dynamic batch/sequence axes. The dynamo exporter also works here but
   takes ~10x longer, and ORT's optimizer does not recognise its attention pattern,
   so it would lose the fused ``Attention`` kernel; it exports what TorchScript cannot
   trace (Gemma3's ``torch.vmap`` masks: EmbeddingGemma), at opset 18.
2. ``onnxruntime.transformers.optimizer`` (model_type ``bert``) fuses embeddings +
   LayerNorm, attention, skip-LayerNorm and bias-GELU. It is run offline at
   ``opt_level`` 0 (fusions only, hardware independent); the session then applies
   ``ORT_ENABLE_ALL`` for the machine it runs on.
3. ``--dtype int8``: ``quantize_dynamic`` with per-channel int8 weights on the MatMuls
   whose inputs are *not* LayerNorm outputs (attention-output and FFN-output
   projections), first layer kept fp32 (see ``onnx_int8``).
   ``--device cuda``: fp16 conversion (inputs/outputs kept float32).

A directory that already holds ``model.onnx`` (or ``onnx/model.onnx``) is used as is:
an ``ember export`` artifact directly, any other graph after the same optimise/quantise
steps (cached). The session that runs the graph is ``onnx_backend``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ember.backends.artifacts as artifacts
import ember.backends.isolated as isolated
from ember.backends.onnx_int8 import cpu_int8_weights, int8_scheme, quantize_int8
from ember.errors import ConfigError, MissingDependency, one_line
from ember.installed import installed, torch_installed
from ember.models.network import network_class
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

MISSING = (
    "the onnx backend needs onnxruntime: pip install 'ember[cpu]' "
    "(torch-free; 'ember[export]' converts models that ship no graph)"
)
MISSING_ONNX = (
    "building an ONNX graph (fusing a model's own graph, or exporting one) needs the onnx "
    "package: pip install 'ember[cpu]'"
)
BACKEND = "onnx"
MODEL_FILE = "model.onnx"
# Bump when the export/optimise/quantise code changes what it writes: old caches miss.
FORMAT_VERSION = 1
OPSET = 17  # LayerNormalization is a single op from 17 on, which the fusions expect
DYNAMO_OPSET = 18  # the lowest the torch.export exporter writes without converting down
OPT_LEVEL = 0  # offline: graph fusions only; runtime adds hardware-specific rewrites
# Above this many bytes of weights the graph is written with external data (2 GiB
# protobuf limit, with margin).
EXTERNAL_DATA_BYTES = 1_800_000_000
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".onnx_data", ".data")
Progress = Callable[[str], None]


def import_ort() -> Any:
    """ONNX Runtime, all that serving a built graph needs (a slim image ships no more)."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependency(MISSING) from exc
    return onnxruntime


def _onnx_installed() -> bool:
    return installed("onnx")


def require_onnx() -> None:
    """The onnx package, which building a graph needs (fusing, copying, quantising)."""
    try:
        import onnx  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(MISSING_ONNX) from exc


# ---------------------------------------------------------------- options


@dataclass(frozen=True)
class Plan:
    """What the session will run: device, weight dtype and execution providers; for int8,
    the weight format, chosen where the plan is made (the serving process, whose CPU runs
    the graph) and carried to the child that builds it, so the cache key and the
    artifact always name the same format."""

    device: str  # "cpu" | "cuda"
    dtype: str  # "float32" | "float16" | "int8"
    providers: list[Any]
    int8_weights: str = field(default_factory=cpu_int8_weights)  # "s8" | "u8"


def resolve_device(device: str, available: list[str]) -> str:
    if device == "auto":
        return "cuda" if "CUDAExecutionProvider" in available else "cpu"
    if device == "cuda" and "CUDAExecutionProvider" not in available:
        raise ConfigError(
            "--device cuda asked for, but onnxruntime has no CUDAExecutionProvider "
            f"(available: {', '.join(available)}); install onnxruntime-gpu: "
            "pip install 'ember[onnx-gpu]'"
        )
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"the onnx backend runs on cpu or cuda, not {device!r}")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "float16" if device == "cuda" else "float32"
    if dtype == "int8" and device != "cpu":
        raise ConfigError("--dtype int8 (dynamic quantisation) runs on --device cpu only")
    if dtype == "float16" and device != "cuda":
        raise ConfigError("--dtype float16 with the onnx backend needs --device cuda")
    if dtype not in ("float32", "float16", "int8"):
        raise ConfigError(
            f"the onnx backend serves float32, float16 (cuda) or int8 (cpu), not {dtype!r}"
        )
    return dtype


def plan_for(model: ResolvedModel, available: list[str]) -> Plan:
    device = resolve_device(model.runtime.device, available)
    dtype = model.runtime.dtype
    exported = _exported(model)[1]
    if dtype == "auto" and exported and exported.get("dtype"):  # serve as exported
        dtype = str(exported["dtype"])
    dtype = resolve_dtype(dtype, device)
    if device == "cpu":
        return Plan(device, dtype, ["CPUExecutionProvider"])
    providers: list[Any] = []
    if "TensorrtExecutionProvider" in available:
        cache = artifacts.cache_root(model) / "tensorrt"
        providers.append(
            (
                "TensorrtExecutionProvider",
                {
                    "trt_fp16_enable": dtype == "float16",
                    "trt_engine_cache_enable": True,
                    "trt_engine_cache_path": str(cache),
                },
            )
        )
    providers += ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return Plan(device, dtype, providers)


def build_options(model: ResolvedModel, plan: Plan) -> dict[str, Any]:
    """Everything that changes the artifact; hashed into the cache key."""
    return {
        "format": FORMAT_VERSION,
        "opset": OPSET,
        "opt_level": OPT_LEVEL,
        "dtype": plan.dtype,
        "gpu": plan.device == "cuda",
        "int8": int8_scheme(plan.int8_weights) if plan.dtype == "int8" else None,
        # an answer-token network's graph ends in those rows of the LM head (only there,
        # so no other model's cache key changes)
        **({"rows": list(rows)} if (rows := model.facts.answer_tokens) else {}),
        "versions": artifacts.package_versions(
            ["torch", "transformers", "onnx", "onnxruntime", "onnxruntime-gpu"]
        ),
    }


# ---------------------------------------------------------------- export


def _num_heads_hidden(config: dict) -> tuple[int, int]:
    heads = config.get("num_attention_heads") or config.get("n_heads") or 0
    hidden = config.get("hidden_size") or config.get("dim") or 0
    return int(heads), int(hidden)


def _is_large(model: ResolvedModel) -> bool:
    """Weights past ~1.8 GB go to external data (protobuf's 2 GiB limit)."""
    size = sum(p.stat().st_size for p in model.path.glob("*") if p.suffix in WEIGHT_SUFFIXES)
    return size > EXTERNAL_DATA_BYTES


def _copy_onnx(src: Path, dst: Path, large: bool) -> None:
    """Copy a graph via onnx so its external data (if any) is rewritten next to ``dst``."""
    import onnx

    graph = onnx.load(str(src))
    onnx.save_model(graph, str(dst), save_as_external_data=large, location=dst.name + ".data")


def _export_net(model: ResolvedModel) -> Any:
    """The network to trace: fp32, eager attention where the architecture has the switch
    (ORT's optimizer fuses its pattern), in eval mode; an LLM reranker's ends in its
    answer tokens' rows."""
    import torch

    auto = network_class(model)
    try:
        net = auto.from_pretrained(
            str(model.path),
            dtype=torch.float32,
            attn_implementation="eager",
            trust_remote_code=model.runtime.trust_remote_code,
        )
    except (ValueError, TypeError):  # architectures without the attn_implementation switch
        net = auto.from_pretrained(
            str(model.path), dtype=torch.float32, trust_remote_code=model.runtime.trust_remote_code
        )
    if rows := model.facts.answer_tokens:  # the graph's logits are its answer tokens'
        from ember.backends.torch_causal import AnswerTokenScorer

        net = AnswerTokenScorer(net, rows)
    return net.eval()


def export_torch(model: ResolvedModel, dst: Path) -> Path:
    """Export the HF model to ``dst`` (fp32, dynamic batch/sequence); returns the file."""
    import torch

    net = _export_net(model)
    takes_types = "token_type_ids" in inspect.signature(net.forward).parameters
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_types else [])
    out_name = "last_hidden_state" if model.backbone == "encoder" else "logits"

    class Wrapper(torch.nn.Module):
        """Positional inputs -> one tensor, so the graph has stable names."""

        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            out = self.net(**dict(zip(names, inputs, strict=True)))
            return out.last_hidden_state if out_name == "last_hidden_state" else out.logits

    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 2178, 102, 0, 0, 0]])
    ids = ids.clamp(max=int(net.config.vocab_size) - 1)
    mask = (torch.arange(6)[None, :] < torch.tensor([[6], [3]])).long()
    dummy = (ids, mask, torch.zeros_like(ids))[: len(names)]
    file = dst / "exported.onnx"
    with torch.inference_mode(False), torch.no_grad():
        _trace(Wrapper().eval(), dummy, file, names, out_name, model)
    return file


def _trace(
    wrapper: Any, dummy: tuple, file: Path, names: list[str], out_name: str, model: ResolvedModel
) -> None:
    """Write ``wrapper``'s graph to ``file``: the TorchScript exporter first (ORT's optimizer
    fuses the attention it writes), else ``torch.export`` (the dynamo exporter). Gemma3's
    bidirectional sliding-window masks are built with ``torch.vmap``, which the TorchScript
    tracer fails on (``RuntimeError: unordered_map::at``) and ``torch.export`` traces:
    EmbeddingGemma's vectors then match sentence-transformers (cosine 1.00000)."""
    import torch

    axes = {n: {0: "batch", 1: "sequence"} for n in (*names, out_name)}
    if out_name != "last_hidden_state":
        axes[out_name] = {0: "batch"}  # logits: [batch, labels]
    io = {"input_names": names, "output_names": [out_name]}
    try:
        torch.onnx.export(
            wrapper,
            dummy,
            str(file),
            dynamo=False,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamic_axes=axes,
            **io,
        )
        return
    except Exception as exc:
        log.info(
            "the TorchScript exporter cannot trace %s (%s); exporting with torch.export (opset %d)",
            model.architecture,
            one_line(exc),
            DYNAMO_OPSET,
        )
    file.unlink(missing_ok=True)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with _quiet_dynamo():
        torch.onnx.export(
            wrapper,
            dummy,
            str(file),
            dynamo=True,
            opset_version=DYNAMO_OPSET,
            dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),),
            external_data=_is_large(model),
            verbose=False,
            **io,
        )


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """The dynamo exporter's own chatter kept out of the start-up log: a line per
    deduplicated initializer (onnx_ir, at info), one per torchvision op it skips, and
    warnings that the inputs share their batch and sequence axes (they do, by design) or
    that torch's pytree API is deprecated."""
    quiet = {"onnx_ir": logging.WARNING, "onnxscript": logging.WARNING}
    quiet["torch.onnx._internal.exporter._registration"] = logging.ERROR
    loggers = [logging.getLogger(name) for name in quiet]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*axis name: .* will not be used")
        warnings.filterwarnings("ignore", category=FutureWarning)
        for logger, level in zip(loggers, quiet.values(), strict=True):
            logger.setLevel(level)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def optimize(src: Path, dst: Path, model: ResolvedModel, plan: Plan) -> dict[str, int]:
    """ORT transformer fusions (+ fp16 on cuda); returns the fused-op counts."""
    from onnxruntime.transformers import optimizer

    heads, hidden = _num_heads_hidden(model.config)
    opt = optimizer.optimize_model(
        str(src),
        model_type="bert",
        num_heads=heads,
        hidden_size=hidden,
        opt_level=OPT_LEVEL,
        use_gpu=plan.device == "cuda",
    )
    if plan.dtype == "float16":
        opt.convert_float_to_float16(keep_io_types=True)
    opt.save_model_to_file(str(dst), use_external_data_format=_is_large(model))
    return {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def find_onnx(path: Path) -> Path | None:
    for candidate in (path / MODEL_FILE, path / "onnx" / MODEL_FILE):
        if candidate.is_file():
            return candidate
    return None


def _optimize_or_copy(model: ResolvedModel, plan: Plan, src: Path, dst: Path) -> dict[str, int]:
    """Fuse ``src`` into ``dst``; a foreign graph the optimizer rejects is copied as is."""
    try:
        fused = optimize(src, dst, model, plan)
    except Exception as exc:
        if find_onnx(model.path) != src:
            raise  # our own export must optimise; anything else is a bug to see
        log.warning("ORT optimizer failed on %s (%s); using the graph unfused", src, exc)
        _copy_onnx(src, dst, _is_large(model))
        return {}
    if not any(k in fused for k in ("Attention", "MultiHeadAttention")):
        log.warning("no attention fusion applied to %s (fused ops: %s)", model.path, fused)
    return fused


def _build(
    model: ResolvedModel,
    plan: Plan,
    out_dir: Path,
    say: Progress,
    source: Path | None,
    fused_source: bool = False,
) -> dict[str, Any]:
    """Write ``out_dir/model.onnx`` (+ manifest); returns the manifest.

    ``source``: an existing graph (None: export from the HF weights); ``fused_source``:
    it is already optimised (an fp32 artifact being quantised), so skip the fusions.
    """
    started = time.monotonic()
    final = out_dir / MODEL_FILE
    fused: dict[str, int] = {}
    quantized = 0
    with tempfile.TemporaryDirectory(prefix="ember-onnx-") as tmp_name:
        tmp = Path(tmp_name)
        if source is None:
            say(f"exporting {model.path} to ONNX (opset {OPSET})")
            source = export_torch(model, tmp)
        if fused_source:
            fused = (artifacts.read_manifest(source.parent) or {}).get("fused_ops", {})
        else:
            say("fusing attention/LayerNorm/GELU with onnxruntime.transformers.optimizer")
            target = tmp / "fused.onnx" if plan.dtype == "int8" else final
            fused = _optimize_or_copy(model, plan, source, target)
            source = target
        if plan.dtype == "int8":
            say("quantising to int8 (dynamic, per-channel)")
            quantized = quantize_int8(source, final, plan.int8_weights, _is_large(model))
        elif source != final:
            _copy_onnx(source, final, _is_large(model))
    # No timings and nothing of the run in it: two exports of one model are byte-identical
    # (the image's /models layer then survives an edit to Ember's code).
    manifest = {
        "backend": BACKEND,
        "task": model.task,
        "dtype": plan.dtype,
        "device": plan.device,
        "fused_ops": fused,
        "int8_nodes": quantized,
        "source": str(model.path),
        "options": build_options(model, plan),
    }
    artifacts.write_manifest(out_dir, manifest)
    seconds = time.monotonic() - started
    say(f"wrote {final} in {seconds:.1f} s (fused: {fused}, int8 nodes: {quantized})")
    return manifest


def export(model: ResolvedModel, out_dir: Path, progress: Progress | None = None) -> Path:
    """``ember export --backend onnx``: a directory that ``--model-id`` serves directly.

    Holds the optimised (and, for ``--dtype int8``, quantised) ``model.onnx``, a
    manifest, and the source's config/tokenizer/sentence-transformers files.
    """
    ort = import_ort()
    require_onnx()
    plan = plan_for(model, ort.get_available_providers())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = progress or log.info
    artifacts.copy_model_files(model.path, out_dir)
    artifacts.write_pooling_files(model, out_dir)
    _build(model, plan, out_dir, say, find_onnx(model.path))
    return out_dir


def require_exporter(model: ResolvedModel) -> None:
    """Refuse, in one line naming the install, converting a model that ships no graph
    where the exporter (torch, transformers) is not installed: a torch-free install
    (``ember[cpu]``) serves graphs, it does not make them."""
    if not torch_installed():
        raise MissingDependency(
            f"model {model.served_name!r} ships no ONNX graph (model.onnx or onnx/model.onnx) "
            "and converting it needs torch and transformers: pip install 'ember[export]', or "
            "run `ember export --backend onnx` where they are installed and serve that directory"
        )


def _exported(model: ResolvedModel) -> tuple[Path | None, dict[str, Any] | None]:
    """The model directory's own graph, and its manifest if ``ember export`` wrote it."""
    source = find_onnx(model.path)
    manifest = artifacts.read_manifest(source.parent) if source is not None else None
    return source, manifest if manifest and manifest.get("backend") == BACKEND else None


def prepare(model: ResolvedModel, plan: Plan, progress: Progress | None = None) -> Path:
    """The ``model.onnx`` to open: the model's own export, or a cached build.

    int8 is derived from the fp32 artifact (built first if missing), so switching
    dtypes never exports twice.
    """
    say = progress or log.info
    source, exported = _exported(model)
    if exported:  # an `ember export` directory
        if exported.get("dtype") == plan.dtype:
            return source
        if exported.get("dtype") != "float32":
            raise ConfigError(
                f"{source} was exported as {exported.get('dtype')}; it cannot be served as "
                f"{plan.dtype}: export again with --dtype {plan.dtype} (or from float32)"
            )
    if source is not None and plan.dtype == "float32" and not _onnx_installed():
        # A slim install (the torch-free image) has no onnx package to fuse with: the graph
        # runs as shipped, ORT's own session-time optimisations applied.
        log.warning(
            "model %s: its graph is served unfused (fusing it once needs the onnx package: "
            "pip install 'ember[cpu]')",
            model.served_name,
        )
        return source
    target = artifacts.artifact_dir(model, BACKEND, build_options(model, plan))
    if artifacts.read_manifest(target) is not None and (target / MODEL_FILE).is_file():
        log.info("using cached ONNX artifact %s", target)
        return target / MODEL_FILE
    require_onnx()
    fused_source = False
    if plan.dtype == "int8":
        source = prepare(model, replace(plan, dtype="float32"), progress)
        fused_source = True
    elif source is None:
        require_exporter(model)
    say(f"building ONNX artifact for {model.served_name} in {target} (first load only)")
    with artifacts.staging(target) as tmp:
        isolated.run(_build, model, plan, tmp, say, source, fused_source)
    return target / MODEL_FILE
