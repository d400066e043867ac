"""The multi-vector head: one projected, normalised vector per kept token position.

ColBERT (PyLate): every position of a query (expansion tokens included), a document's
positions without its skiplist tokens, each through the model's Dense projection.
BGE-M3: positions 1.. (after [CLS]) through ``colbert_linear``. Batch padding never.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ember.batch import TOKEN_STATES, TokenBatch
from ember.outputs import l2_normalize


@dataclass(frozen=True)
class MultiVectorHead:
    weight: np.ndarray | None  # [out, hidden]; None: the token states themselves
    bias: np.ndarray | None
    skip_first: bool = False  # BGE-M3 drops the [CLS] position
    output: Literal["multi"] = "multi"

    @property
    def dim(self) -> int | None:
        return None if self.weight is None else int(self.weight.shape[0])

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        states = outputs[TOKEN_STATES]
        lengths = batch.row_lengths()
        keep = batch.keep
        results = []
        for row in rows:
            start = 1 if self.skip_first else 0
            positions = keep[row] if keep is not None and keep[row] is not None else None
            if positions is None:
                vectors = states[row, start : int(lengths[row])]
            else:
                vectors = states[row, [p for p in positions if p >= start]]
            results.append(self.project(vectors))
        return results

    def project(self, vectors: np.ndarray) -> np.ndarray:
        vectors = vectors.astype(np.float32, copy=False)
        if self.weight is not None:
            vectors = vectors @ self.weight.T
            if self.bias is not None:
                vectors = vectors + self.bias
        return np.ascontiguousarray(l2_normalize(vectors), dtype=np.float32)
