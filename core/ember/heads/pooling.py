"""Pooling token states into one vector per text.

Takes right-padded hidden states and an attention mask and matches
sentence-transformers' Pooling module (mean ignores padding, last takes the last
real token).
"""

from __future__ import annotations

import numpy as np

from ember.models.spec import Pooling


def pool_numpy(hidden: np.ndarray, mask: np.ndarray, mode: Pooling) -> np.ndarray:
    """hidden [B, T, H] float, mask [B, T] int -> [B, H] float32."""
    if mode == "cls":
        return np.ascontiguousarray(hidden[:, 0, :], dtype=np.float32)
    if mode == "last":
        last = mask.sum(axis=1).astype(np.int64) - 1
        return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), last, :], dtype=np.float32)
    if mode == "max":
        m = mask[..., None] > 0
        return np.where(m, hidden, -np.inf).max(axis=1).astype(np.float32)
    # mean: one batched matrix product [B, 1, T] @ [B, T, H], no [B, T, H] temporary
    m = mask.astype(np.float32)
    summed = np.matmul(m[:, None, :], hidden.astype(np.float32, copy=False))[:, 0, :]
    counts = np.clip(m.sum(axis=1, keepdims=True), 1e-9, None)
    return summed / counts
