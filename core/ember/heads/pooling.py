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
