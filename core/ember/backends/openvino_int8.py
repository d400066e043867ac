"""The fast tier's graph: the onnx backend's fp32 graph with int8 weights for OpenVINO
(``--dtype int8`` on a CPU with ``ember[openvino]``).

NNCF compresses every matmul's weights to int8 (symmetric, one scale per output channel);
at run time OpenVINO's CPU plugin quantises each matmul's activations on the fly, one
scale per group of ``ACTIVATION_GROUP`` inputs of each token, and multiplies on the CPU's
int8 units (VNNI, AMX-INT8); the rest runs at bf16 where the CPU has it
(``openvino_backend``). Nothing is calibrated: scales come from the weights and from each
batch's own activations, so the FFN's few huge post-GELU values that no static per-tensor
scale could hold cost nothing here.

Measured on all-MiniLM-L6-v2 over the whole 2,048-sentence anchor corpus
(benchmarks/corpus.py) against fp32, batches of 32 sorted by length, one stream on the
2-core Zen 4 (``benchmarks/results/2026-12-04-cpu-int8-schemes.md``): group 128 worst
cosine 0.99545 at 308 / 272 sent/s (two rounds), group 64 0.99724 at 292 / 253, the
static NNCF graph this replaced (int8 activations on one calibrated scale per tensor, the
FFN-out matmuls kept float) 0.99172 at 273 / 264, bf16 0.99996 at 239 / 225.

Built on first use (a child process: NNCF stays out of the server) and cached under
``--cache-dir``/openvino-int8, keyed by the source graph, the scheme and the library
versions.
"""

from __future__ import annotations

import logging
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import ember.backends.artifacts as artifacts
import ember.backends.isolated as isolated
from ember.errors import MissingDependency
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

MODEL_FILE = "model.xml"
# Inputs of a token that share one activation scale: 128 divides every hidden and FFN size
# of the encoders served here (MiniLM 384 / 1536); smaller groups hold tighter (64: worst
# 0.99724) and run slower (5% at 64).
ACTIVATION_GROUP = 128
SCHEME = f"nncf-weights-int8-sym-per-channel,dynamic-activations-g{ACTIVATION_GROUP}"


def slower_than_bf16() -> str | None:
    """Why the int8 graph would run slower than bf16 on this CPU, in words; None where it is
    the faster (VNNI without AMX).

    On AMX, OpenVINO's CPU plugin quantises no activation: it widens the int8 weights to
    bf16 for the AMX-BF16 tiles (``brgemm_avx512_amx_bf16``), so the int8 graph does bf16's
    work and the widening too. Measured on a 2-core Xeon with AMX, all-MiniLM-L6-v2, the
    anchor corpus in batches of 32, one stream (``benchmarks/inproc_backends.py``): int8
    507-527 sent/s at worst cosine 0.99788, bf16 672-676 at 0.99996, and a statically
    quantised graph that does run on the AMX-INT8 tiles 662 (at MiniLM's width the matmuls
    are not what bounds a forward there). So the fast tier serves bf16 on AMX."""
    from ember.cpu import native_bf16

    if native_bf16() == "amx":
        return "bf16 on its AMX tiles outruns int8 there (OpenVINO widens int8 weights to bf16)"
    return None


def runtime_config() -> dict[str, Any]:
    """What OpenVINO needs at compile time to quantise activations on the fly."""
    return {"DYNAMIC_QUANTIZATION_GROUP_SIZE": ACTIVATION_GROUP}


def _unique_names(ov_model: Any) -> None:
    """Give every op a unique friendly name: OpenVINO's ONNX reader repeats some (a BERT
    graph's position Gathers), and NNCF's graph builder then loses edges and fails."""
    for index, op in enumerate(ov_model.get_ordered_ops()):
        op.set_friendly_name(f"{op.get_friendly_name()}#{index}")


def _build(source: Path, out_dir: Path) -> dict[str, Any]:
    """Compress ``source``'s (an fp32 ONNX graph) matmul weights into ``out_dir``/model.xml."""
    import nncf
    import openvino

    ov_model = openvino.Core().read_model(str(source))
    _unique_names(ov_model)
    compressed = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_SYM)
    openvino.save_model(compressed, str(out_dir / MODEL_FILE), compress_to_fp16=False)
    weights = sum(
        1
        for op in compressed.get_ordered_ops()
        if op.get_type_name() == "Constant" and op.get_element_type().get_type_name() == "i8"
    )
    return {"int8_weights": weights}


def prepare(model: ResolvedModel, source: Path) -> Path:
    """The int8-weight IR for ``model`` built from its fp32 ONNX graph ``source`` (cached)."""
    # Looked up, not imported: importing nncf here would cost the server 2 s and 224 MiB on
    # every start, cached graph or not; only the build's child process imports it.
    if find_spec("nncf") is None:
        raise MissingDependency(
            "--dtype int8 on openvino compresses weights with nncf: pip install 'ember[openvino]'"
        )
    options = {
        "scheme": SCHEME,
        "source": str(source),
        "versions": artifacts.package_versions(("openvino", "nncf", "onnxruntime")),
    }
    target = artifacts.artifact_dir(model, "openvino-int8", options)
    if artifacts.read_manifest(target) is not None and (target / MODEL_FILE).is_file():
        return target / MODEL_FILE
    log.info(
        "int8 weights for %s, for OpenVINO, in %s (first load only)", model.served_name, target
    )
    with artifacts.staging(target) as tmp:
        built = isolated.run(_build, source, tmp)
        if not built["int8_weights"]:
            raise RuntimeError(f"nncf left no int8 weight in {source}")
        artifacts.write_manifest(tmp, {"backend": "openvino-int8", "scheme": SCHEME, **built})
    return target / MODEL_FILE
