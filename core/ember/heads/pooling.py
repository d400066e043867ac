"""Pooling token states into one vector per text.

Takes right-padded hidden states and an attention mask and matches
sentence-transformers' Pooling module: every mode of it, several concatenated in the
order given, and prompt tokens left out (``include_prompt: false``) by zeroing them in the
mask as it does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ember.models.spec import Pooling


def pool_numpy(hidden: np.ndarray, mask: np.ndarray, mode: Pooling) -> np.ndarray:
    """hidden [B, T, H] float, mask [B, T] int -> [B, H] float32."""
    if mode == "cls":  # the first attended position (0 unless the prompt is left out)
        if mask[:, 0].all():
            return np.ascontiguousarray(hidden[:, 0, :], dtype=np.float32)
        first = np.argmax(mask > 0, axis=1)
        return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), first, :], np.float32)
    if mode == "last":  # the last attended position; a row with none gives zeros
        attended = mask > 0
        last = mask.shape[1] - 1 - np.argmax(attended[:, ::-1], axis=1)
        rows = hidden[np.arange(hidden.shape[0]), last, :].astype(np.float32)
        return rows * attended.any(axis=1, keepdims=True)
    if mode == "max":
        m = mask[..., None] > 0
        return np.where(m, hidden, -np.inf).max(axis=1).astype(np.float32)
    m = mask.astype(np.float32)
    if mode == "weightedmean":  # position weights 1..T (right padding: no offset)
        m = m * np.arange(1, m.shape[1] + 1, dtype=np.float32)
    # one batched matrix product [B, 1, T] @ [B, T, H], no [B, T, H] temporary
    summed = np.matmul(m[:, None, :], hidden.astype(np.float32, copy=False))[:, 0, :]
    counts = np.clip(m.sum(axis=1, keepdims=True), 1e-9, None)
    return summed / (np.sqrt(counts) if mode == "mean_sqrt_len" else counts)


def pool_modes(
    hidden: np.ndarray,
    mask: np.ndarray,
    modes: Sequence[Pooling],
    skip: np.ndarray | None = None,
) -> np.ndarray:
    """Each of ``modes`` concatenated -> [B, len(modes) * H]. ``skip`` [B]: leading
    positions per row left out of pooling (a prompt's tokens, its [CLS] included)."""
    if skip is not None and skip.any():
        mask = np.where(np.arange(mask.shape[1])[None, :] < skip[:, None], 0, mask)
    if len(modes) == 1:
        return pool_numpy(hidden, mask, modes[0])
    return np.concatenate([pool_numpy(hidden, mask, mode) for mode in modes], axis=1)


def span_pools(hidden: np.ndarray, spans: Sequence[tuple[int, int]], mode: Pooling) -> np.ndarray:
    """Late chunking's partial pools of one row's states ``hidden`` [T, H]: per span
    ``[a, b)`` of positions, the sum of its states (``mean``, ``mean_sqrt_len``) or their
    maximum (``max``) -> [spans, H] float32. Partial pools of one chunk from several windows
    combine exactly (``pooled_spans``)."""
    out = np.empty((len(spans), hidden.shape[-1]), dtype=np.float32)
    for k, (a, b) in enumerate(spans):
        part = hidden[a:b].astype(np.float32, copy=False)
        out[k] = part.max(axis=0) if mode == "max" else part.sum(axis=0, dtype=np.float64)
    return out


def pooled_spans(parts: np.ndarray, counts: np.ndarray, mode: Pooling) -> np.ndarray:
    """Each chunk's pool from its combined partial pools ``parts`` [chunks, H] (sums or
    maxima, as ``span_pools`` gave them) over ``counts`` [chunks] tokens."""
    if mode == "max":
        return parts.astype(np.float32, copy=False)
    n = np.clip(counts.astype(np.float32), 1, None)[:, None]
    return (parts / (np.sqrt(n) if mode == "mean_sqrt_len" else n)).astype(np.float32)
