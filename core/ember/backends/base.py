"""The one small protocol every backend implements.

A backend turns a padded batch of token ids into numbers: pooled sentence
embeddings for embedding models, logits for rerankers and classifiers. It never
sees HTTP, requests or per-request options; everything after the forward pass
(normalisation, Matryoshka truncation, sigmoid/softmax, output dtypes) lives in
``ember.tasks`` so every backend shares it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ember.models.spec import ResolvedModel


@dataclass(frozen=True)
class TokenBatch:
    """A padded batch, right-padded, as numpy int64 arrays of shape [batch, seq]."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass(frozen=True)
class PaddingBudget:
    """Padding a batch may carry: ``tokens``, or ``fraction`` of its padded cost if more."""

    tokens: int
    fraction: float

    def allows(self, waste: int, padded: int) -> bool:
        return waste <= max(self.tokens, self.fraction * padded)


@dataclass(frozen=True)
class BackendInfo:
    """What a backend reports about itself for /info, logs and metrics."""

    name: str
    device: str
    dtype: str
    details: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """Loaded once per served model.

    ``forward`` is called from up to ``parallel_forwards`` worker threads at once (an
    optional attribute, default 1): CPU backends run one single-threaded forward per core
    rather than one forward on a multi-threaded pool (see ``ember.config.cpu_forward_plan``).
    ``padding`` (an optional ``PaddingBudget``) is how much padding a batch may carry
    before smaller batches are cheaper; by default it follows ``info.device``
    (``ember.engine.batcher.padding_budget_for``).
    """

    info: BackendInfo

    def forward(self, batch: TokenBatch) -> np.ndarray:
        """Embedding models: pooled, *un-normalised* float32 [batch, hidden].

        Rerankers/classifiers: raw float32 logits [batch, num_labels].
        """
        ...

    def close(self) -> None:
        """Free device memory; the backend is not used afterwards."""
        ...


class BackendFactory(Protocol):
    def __call__(self, model: ResolvedModel) -> Backend: ...
