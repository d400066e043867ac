"""The dense head: token states pooled into one (un-normalised) vector per input, through
the model's sentence-transformers Dense layers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ember.batch import EMBEDDINGS, LOGITS, TOKEN_STATES, TokenBatch
from ember.heads.base import attention, select
from ember.heads.pooling import pool_modes, pooled_spans, span_pools
from ember.models.spec import Pooling

# Poolings a backend may apply before the head (``TokenBatch.reduce``): each gives one
# vector per row that the same pooling over that one position returns unchanged.
DEVICE_POOLINGS = ("cls", "mean", "last", "max")

# sentence-transformers Dense activations (torch.nn classes), applied in numpy.
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@dataclass(frozen=True)
class Projection:
    """A sentence-transformers Dense module: ``act(x @ weight.T + bias)``, plus the input
    (or ``residual @ x`` when the widths differ) with ``use_residual``."""

    weight: np.ndarray  # [out, in]
    bias: np.ndarray | None
    activation: str = "Identity"
    residual: bool = False
    residual_weight: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = x @ self.weight.T
        if self.bias is not None:
            out += self.bias
        out = ACTIVATIONS[self.activation](out)
        if self.residual:
            out = out + (x if self.residual_weight is None else x @ self.residual_weight.T)
        return out.astype(np.float32, copy=False)


@dataclass(frozen=True)
class DenseHead:
    """Token states pooled (every mode, concatenated), then the model's Dense layers; a
    row's ``pool_from`` positions (its prompt) are left out when the model says so."""

    pooling: Pooling | tuple[Pooling, ...]
    include_prompt: bool = True
    projections: tuple[Projection, ...] = ()
    output: Literal["dense"] = "dense"

    def reduction(self, batch: TokenBatch) -> str | None:
        """The one pooling this head applies over every attended token of ``batch``'s rows,
        which a backend may apply itself (``TokenBatch.reduce``); None: it needs them all."""
        if not isinstance(self.pooling, str) or self.pooling not in DEVICE_POOLINGS:
            return None
        if batch.spans is not None:  # late chunking pools each row's spans itself
            return None
        if not self.include_prompt and batch.pool_from is not None:
            return None
        return self.pooling

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        """One vector per row; a row with spans (late chunking) gets its spans' partial
        pools instead, [spans, H] before the Dense layers (``span_pools``)."""
        spans = batch.spans
        if spans is not None and any(spans[r] is not None for r in rows):
            plain = [r for r in rows if spans[r] is None]
            pooled = iter(self._pooled(outputs, batch, plain) if plain else ())
            states = outputs[TOKEN_STATES]
            mode = self.mode
            assert mode is not None  # late chunking takes one pooling (ember.chunking)
            return [
                next(pooled) if spans[r] is None else span_pools(states[r], spans[r], mode)
                for r in rows
            ]
        return self._pooled(outputs, batch, rows)

    @property
    def mode(self) -> Pooling | None:
        """The one pooling this head applies (None: several, concatenated)."""
        if isinstance(self.pooling, str):
            return self.pooling
        return self.pooling[0] if len(self.pooling) == 1 else None

    def chunk_vectors(self, parts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Late chunking: chunks' combined partial pools -> their vectors, through the
        model's Dense layers."""
        mode = self.mode
        assert mode is not None
        pooled = pooled_spans(parts, counts, mode)
        for project in self.projections:
            pooled = project(pooled)
        return pooled

    def _pooled(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        states = select(outputs[TOKEN_STATES], rows)
        mask = select(attention(outputs, batch), rows)
        modes = (self.pooling,) if isinstance(self.pooling, str) else self.pooling
        skip = None
        if not self.include_prompt and batch.pool_from is not None:
            skip = select(batch.pool_from, rows)
        pooled = pool_modes(states, mask, modes, skip)
        for project in self.projections:
            pooled = project(pooled)
        return list(pooled)


@dataclass(frozen=True)
class PooledHead:
    """A vector per input the backend already pooled (StaticEmbedding's mean of its token
    vectors), then the pipeline's Dense layers."""

    projections: tuple[Projection, ...] = ()
    output: Literal["dense"] = "dense"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        pooled = select(outputs[EMBEDDINGS], rows)
        for project in self.projections:
            pooled = project(pooled)
        return list(pooled)


@dataclass(frozen=True)
class LogitsHead:
    """A sequence classifier's logits, one row per input (scores come per request)."""

    output: Literal["logits"] = "logits"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        return list(select(outputs[LOGITS], rows))


@dataclass(frozen=True)
class AnswerTokensHead:
    """An LLM reranker's score logit, from its answer tokens' logits (positive first):
    positive - negative, the log-odds whose sigmoid is the softmax over the two (Qwen3-Reranker,
    mxbai-rerank-v2), or the positive logit alone (bge-reranker-v2-gemma). One value per
    input, as a one-label cross-encoder's logit, so rerank scores it the same way."""

    output: Literal["logits"] = "logits"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        logits = select(outputs[LOGITS], rows).astype(np.float64)
        score = logits[:, 0] - logits[:, 1] if logits.shape[1] == 2 else logits[:, 0]
        return list(score[:, None])
