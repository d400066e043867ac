"""Which MatMuls ``--dtype int8`` quantises on the ONNX backend, and the quantisation.

Dynamic int8 (per-channel weights, per-tensor uint8 activations taken per batch) on
the MatMuls whose inputs are *not* LayerNorm outputs, first layer kept fp32: the
selection rule below, with the measurements that chose it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.cpu import int8_dot_product
from ember.errors import ConfigError

# Producers whose outputs are safe to quantise per-tensor at run time: attention
# context and FFN activations. LayerNorm outputs (inputs of QKV and FFN-in) carry a
# few outlier channels 10-20x the median; one per-tensor uint8 scale then wipes out
# the other channels, and on MiniLM that alone drops worst-case cosine to ~0.97.
_SAFE_PRODUCERS = {
    "Attention",
    "MultiHeadAttention",
    "MatMul",  # probs @ V in unfused attention
    "Gelu",
    "BiasGelu",
    "FastGelu",
    "QuickGelu",
    "Relu",
}
_PASS_THROUGH = {"Reshape", "Transpose", "Cast", "Identity"}
_ATTENTION_OPS = {"Attention", "MultiHeadAttention", "Softmax"}


def int8_nodes(onnx_model: Any) -> list[str]:
    """Nodes to quantise: MatMuls fed by attention context or an FFN activation.

    Worst-case cosine vs sentence-transformers fp32 on all-MiniLM-L6-v2 (60 mixed test
    texts): every MatMul + Attention per-channel 0.972, FFN-only 0.980, this set 0.993
    (over the 2,048-sentence benchmark corpus: 0.9926 in batches of 32, 0.985 in batches of
    1, as activation ranges are per batch). QKV and FFN-in read LayerNorm
    outputs (outlier channels) and the first layer is the most sensitive; classifier
    heads stay fp32 too. The price: ~1/3 of the FLOPs run int8, so the gain is ~10%
    CPU time, not the ~1.7x of quantising everything.
    """
    producer = {out: node for node in onnx_model.graph.node for out in node.output}
    weights = {init.name for init in onnx_model.graph.initializer}
    selected = []
    layer = -1
    for node in onnx_model.graph.node:
        if node.op_type in _ATTENTION_OPS:
            layer += 1
        if node.op_type != "MatMul" or node.input[1] not in weights or layer < 1:
            continue
        src = producer.get(node.input[0])
        while src is not None and src.op_type in _PASS_THROUGH:
            src = producer.get(src.input[0])
        if src is not None and src.op_type in _SAFE_PRODUCERS:
            selected.append(node.name)
    return selected


def cpu_int8_weights() -> str:
    """The weight format for this CPU: ``"s8"`` where int8 x uint8 products do not
    saturate (VNNI, and ARM's dot-product kernels), ``"u8"`` on x86 without VNNI.

    MLAS's u8u8 kernel widens both sides to 16 bits before multiplying, so nothing
    saturates on AVX2; its u8s8 kernel there sums pairs in 16 bits (ONNX Runtime's
    quantisation guide names it; ``reduce_range``'s 7-bit weights are its other way out,
    at twice the rounding error). Tiny CLIP/SigLIP towers served on an AVX2 CPU (emulated:
    ``qemu-x86_64 -cpu Haswell``), worst cosine to transformers: int8 weights 0.9958
    (CLIP text) / 0.9989 (CLIP image); uint8 weights 0.99998 / 0.99999, bit-identical to
    the same graphs on an AVX512-VNNI host, as the u8u8 kernel is exact integer math."""
    return "u8" if int8_dot_product() == "x86" else "s8"


def int8_scheme(weights: str) -> str:
    """What the artifact's cache key records of the quantisation: the node selection and
    the weight format, so an artifact built for one CPU kind is not reused on another."""
    return f"per-channel,non-LN-inputs,skip-first-layer,weights-{weights}"


def quantize_int8(src: Path, dst: Path, weights: str, large: bool = False) -> int:
    """Dynamic int8: per-channel weights in ``weights`` format (``cpu_int8_weights``),
    per-tensor uint8 activations; returns node count."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = int8_nodes(onnx.load(str(src), load_external_data=False))
    if not nodes:
        raise ConfigError(f"{src}: no MatMul found that int8 quantisation can safely replace")
    quantize_dynamic(
        str(src),
        str(dst),
        weight_type={"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[weights],
        per_channel=True,
        nodes_to_quantize=nodes,
        op_types_to_quantize=["MatMul"],
        # contrib ops (Attention, SkipLayerNorm) defeat ONNX shape inference
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        use_external_data_format=large,
    )
    return len(nodes)
