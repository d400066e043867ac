"""Unpadded (packed) forwards for the torch backend: a batch's real tokens as one stream.

A padded batch of mixed lengths spends a forward's work on padding (random lengths padded
together did 2.6x the real work on the anchor corpus). Packed, every row's real tokens lie
end to end in one sequence of ``T`` tokens; ``cu_seqlens`` marks where each row starts, and
attention runs per row with PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (a
FlashAttention kernel shipped in PyTorch >= 2.10: no ``flash-attn`` package to build). The
rest of the network (embeddings, projections, FFN, norms) is per token and runs unchanged.

The network is a transformers model with ``attn_implementation="ember_varlen"``, an
attention function registered with transformers' ``AttentionInterface``: the model passes
``cu_seq_lens_*``/``max_length_*`` (transformers' own packed-sequence keywords) down to it.
Position ids are each row's own (``0..len-1``, or RoBERTa's ``padding_idx + 1 + i``), so
absolute, rotary and token-type embeddings see what the padded batch gave them.

Off CUDA (the unit tests' CPU) the same function computes each row's attention with SDPA
one row at a time: slow, exact, and what the packing is checked against.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ember.batch import TokenBatch

ATTENTION_NAME = "ember_varlen"

# Architectures whose transformers modules pass attention keywords through to the registered
# function and whose every attention is plain (no additive position bias: MPNet's relative
# bias and DeBERTa's disentangled attention cannot run in a FlashAttention kernel).
PACKABLE_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "modernbert",
        "qwen2",
        "qwen3",
        "llama",
        "mistral",
        "gemma",
        "gemma2",
        "gemma3_text",
    }
)


@dataclass(frozen=True)
class PackedBatch:
    """A padded batch's real tokens as one stream (numpy, ready to copy to the device).

    ``ids``/``token_types``/``positions`` are [T] int64; ``cu_seqlens`` [rows + 1] int32
    (row ``i`` is ``stream[cu_seqlens[i]:cu_seqlens[i + 1]]``); ``flat`` [T] the stream's
    positions in the padded batch flattened (``row * seq + column``), to scatter back."""

    ids: np.ndarray
    token_types: np.ndarray
    positions: np.ndarray
    cu_seqlens: np.ndarray
    flat: np.ndarray
    max_length: int
    rows: int
    seq: int

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])


def pack(batch: TokenBatch, position_offset: int = 0) -> PackedBatch:
    """``batch``'s attended tokens, row after row; positions count from ``position_offset``
    within each row (RoBERTa-style embeddings start at ``padding_idx + 1``)."""
    mask = batch.attention_mask.astype(bool, copy=False)
    rows, seq = mask.shape
    flat = np.flatnonzero(mask.reshape(-1))
    lengths = mask.sum(axis=1, dtype=np.int64)
    cu_seqlens = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    # Each token's column in its row is its rank among that row's attended tokens: right
    # padding makes that its column; a hole-free mask is what packing requires.
    starts = np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
    positions = np.arange(flat.shape[0], dtype=np.int64) - starts + position_offset
    return PackedBatch(
        ids=batch.input_ids.reshape(-1)[flat],
        token_types=batch.token_type_ids.reshape(-1)[flat],
        positions=positions,
        cu_seqlens=cu_seqlens,
        flat=flat,
        max_length=int(lengths.max(initial=0)),
        rows=rows,
        seq=seq,
    )


def has_holes(mask: np.ndarray) -> bool:
    """Whether any row attends a position after one it masks (not right-padded): packing
    would then move tokens to other positions than the padded forward gave them."""
    m = mask.astype(bool, copy=False)
    return bool((m[:, 1:] & ~m[:, :-1]).any())


def unpack(stream: Any, packed: PackedBatch) -> Any:
    """[T, hidden] states of the stream -> [rows, seq, hidden], zeros at padding (torch)."""
    import torch

    hidden = stream.shape[-1]
    out = stream.new_zeros((packed.rows * packed.seq, hidden))
    index = torch.from_numpy(packed.flat).to(stream.device, non_blocking=True)
    out.index_copy_(0, index, stream.reshape(-1, hidden))
    return out.view(packed.rows, packed.seq, hidden)


def position_offset(net: Any) -> int:
    """Where a row's position ids start: RoBERTa-family embeddings count from
    ``padding_idx + 1`` (they derive positions from the ids, skipping padding)."""
    embeddings = getattr(getattr(net, "base_model", net), "embeddings", None)
    if embeddings is not None and hasattr(embeddings, "create_position_ids_from_input_ids"):
        return int(embeddings.padding_idx) + 1
    return 0


def unsupported_reason(net: Any, device: str, dtype: Any) -> str | None:
    """Why ``net`` cannot run packed on ``device`` in ``dtype``; None when it can."""
    import torch

    if device != "cuda":
        return "packed forwards run on CUDA (padded SDPA elsewhere)"
    if dtype not in (torch.float16, torch.bfloat16):
        return "varlen attention runs in float16/bfloat16"
    if varlen_kernel() is None:
        return f"this PyTorch ({torch.__version__}) has no torch.nn.attention.varlen"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return "varlen attention needs an sm_80 or newer GPU"
    model_type = str(getattr(getattr(net, "config", None), "model_type", ""))
    if model_type not in PACKABLE_MODEL_TYPES:
        return f"model type {model_type!r} has no packed path (its attention is not plain)"
    if not getattr(net, "_supports_attention_backend", False):
        return f"{type(net).__name__} does not take a registered attention function"
    return None


@lru_cache(maxsize=1)
def varlen_kernel() -> Callable[..., Any] | None:
    """PyTorch's varlen attention, or None before 2.10."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@lru_cache(maxsize=1)
def _kernel_takes() -> frozenset[str]:
    """The keywords this PyTorch's kernel takes: 2.10 took ``is_causal``, later releases
    ``window_size`` (left, right); some take ``enable_gqa`` for fewer key/value heads (the
    FlashAttention kernel itself runs grouped heads either way)."""
    kernel = varlen_kernel()
    return frozenset(inspect.signature(kernel).parameters) if kernel is not None else frozenset()


def _window(causal: bool, sliding_window: int | None) -> tuple[int, int]:
    """FlashAttention's (left, right) window; transformers' ``sliding_window`` counts the
    token itself (ModernBERT sets it to half its local window + 1)."""
    reach = sliding_window - 1 if sliding_window else -1
    return (reach, 0 if causal else reach)


def varlen_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function contract on a packed stream: q/k/v [1, heads, T, d]
    in, [1, T, heads, d] out; rows from ``cu_seq_lens_q`` (every row attends only itself)."""
    cu_seqlens = kwargs["cu_seq_lens_q"]
    max_length = int(kwargs["max_length_q"])
    causal = bool(module.is_causal if is_causal is None else is_causal)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]
    window = _window(causal, sliding_window)
    if q.is_cuda:
        kernel = varlen_kernel()
        assert kernel is not None  # unsupported_reason checked it at load
        takes = _kernel_takes()
        extra: dict[str, Any] = {"scale": scaling}
        if k.shape[1] != q.shape[1] and "enable_gqa" in takes:
            extra["enable_gqa"] = True
        if "window_size" in takes:
            extra["window_size"] = window
        elif sliding_window:
            raise RuntimeError("sliding-window attention needs PyTorch >= 2.11 packed")
        else:
            extra["is_causal"] = causal
        out = kernel(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, **extra)
    else:
        out = _rows_one_by_one(q, k, v, cu_seqlens, scaling, window)
    return out.unsqueeze(0), None


def _rows_one_by_one(
    q: Any, k: Any, v: Any, cu_seqlens: Any, scaling: float | None, window: tuple[int, int]
) -> Any:
    """The reference: each row's attention alone, with SDPA and an explicit window mask."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    group = q.shape[1] // k.shape[1]
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [heads, L, d]
        if group > 1:
            ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        length = end - start
        i = torch.arange(length, device=q.device)
        offset = i[None, :] - i[:, None]  # key column minus query row
        left, right = window
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device)
        if left >= 0:
            allowed &= offset >= -left
        if right >= 0:
            allowed &= offset <= right
        attended = scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=scaling)
        out[start:end] = attended.transpose(0, 1)
    return out


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Packed rows need no mask: ``cu_seqlens`` keeps them apart."""
    return None


@lru_cache(maxsize=1)
def register() -> str:
    """Register the attention function (and its mask builder) with transformers, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, varlen_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME


def packed_inputs(packed: PackedBatch, put: Callable[[np.ndarray], Any]) -> dict[str, Any]:
    """The keywords a transformers model takes for one packed forward; ``put`` moves a host
    array to the device (the backend's: through page-locked memory on CUDA)."""
    cu = put(packed.cu_seqlens)
    return {
        "input_ids": put(packed.ids)[None],
        "token_type_ids": put(packed.token_types)[None],
        "position_ids": put(packed.positions)[None],
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": packed.max_length,
        "max_length_k": packed.max_length,
    }
