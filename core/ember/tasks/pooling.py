"""Pooling token states into one vector per text, in numpy and in torch.

Both variants take right-padded hidden states and an attention mask and match
sentence-transformers' Pooling module (mean ignores padding, last takes the last
real token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ember.models.spec import Pooling

if TYPE_CHECKING:
    import torch


def pool_numpy(hidden: np.ndarray, mask: np.ndarray, mode: Pooling) -> np.ndarray:
    """hidden [B, T, H] float, mask [B, T] int -> [B, H] float32."""
    if mode == "cls":
        return np.ascontiguousarray(hidden[:, 0, :], dtype=np.float32)
    if mode == "last":
        last = mask.sum(axis=1).astype(np.int64) - 1
        return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), last, :], dtype=np.float32)
    m = mask[..., None].astype(hidden.dtype)
    if mode == "max":
        return np.where(m > 0, hidden, -np.inf).max(axis=1).astype(np.float32)
    summed = (hidden * m).sum(axis=1, dtype=np.float32)
    counts = np.clip(m.sum(axis=1, dtype=np.float32), 1e-9, None)
    return summed / counts


def pool_torch(hidden: torch.Tensor, mask: torch.Tensor, mode: Pooling) -> torch.Tensor:
    """The torch twin of ``pool_numpy``; stays on the model's device, returns float32."""
    import torch

    if mode == "cls":
        return hidden[:, 0, :].float()
    if mode == "last":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last, :].float()
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(m == 0, float("-inf")).amax(dim=1).float()
    summed = (hidden.float() * m.float()).sum(dim=1)
    return summed / m.float().sum(dim=1).clamp(min=1e-9)
