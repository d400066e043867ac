"""A sentence-transformers Router's heads: each batch through its route's own head."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ember.batch import Batch, TokenBatch
from ember.capabilities import Output
from ember.heads.base import Head
from ember.outputs import Row, l2_normalize


@dataclass(frozen=True)
class RoutedHead:
    """One output of a Router: a batch holds one route's inputs (``TokenBatch.part``) and
    goes through that route's head. A route whose own pipeline ends in Normalize is
    normalised here: the engine normalises by the model's Normalize after the Router only."""

    output: Output
    heads: Mapping[str, Head]
    normalized: frozenset[str] = frozenset()

    def split(
        self, outputs: dict[str, np.ndarray], batch: Batch, rows: Sequence[int]
    ) -> Sequence[Row]:
        assert isinstance(batch, TokenBatch) and batch.part is not None
        results = self.heads[batch.part].split(outputs, batch, rows)
        if batch.part in self.normalized:
            return list(l2_normalize(np.stack(results)))
        return results
