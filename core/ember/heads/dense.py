"""The dense head: token states pooled into one (un-normalised) vector per input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ember.backends.base import LOGITS, TOKEN_STATES, TokenBatch
from ember.heads.base import attention, select
from ember.heads.pooling import pool_numpy
from ember.models.spec import Pooling


@dataclass(frozen=True)
class DenseHead:
    pooling: Pooling
    output: Literal["dense"] = "dense"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        states = select(outputs[TOKEN_STATES], rows)
        mask = select(attention(outputs, batch), rows)
        return list(pool_numpy(states, mask, self.pooling))


@dataclass(frozen=True)
class LogitsHead:
    """A sequence classifier's logits, one row per input (scores come per request)."""

    output: Literal["logits"] = "logits"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        return list(select(outputs[LOGITS], rows))
