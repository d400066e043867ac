"""The head protocol: a batch's outputs -> one row of its output type per input it is
asked for (``ember.outputs``: the engine collects a request's rows into that type)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ember.batch import ATTENTION, Batch, TokenBatch
from ember.capabilities import Output
from ember.outputs import Row


class Head(Protocol):
    output: Output

    def split(
        self, outputs: dict[str, np.ndarray], batch: Batch, rows: Sequence[int]
    ) -> Sequence[Row]:
        """One row for each of ``rows`` (indices into the batch), in that order."""
        ...


def attention(outputs: dict[str, np.ndarray], batch: TokenBatch) -> np.ndarray:
    """The mask the token states were computed with (a backend may have reshaped it)."""
    return outputs.get(ATTENTION, batch.attention_mask)


def select(array: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """``array[rows]`` without a copy when the rows are the whole batch, in order."""
    if len(rows) == array.shape[0] and all(i == r for i, r in enumerate(rows)):
        return array
    return array[np.asarray(rows, dtype=np.int64)]
