"""Sparse heads: one weight per vocabulary id, zeros dropped, sorted by id.

SPLADE (sentence-transformers ``SparseEncoder``): the model's MLM head over each real
token, log(1 + relu(logit)), max over tokens. BGE-M3: relu(``sparse_linear``) per token,
the max per token id, special tokens dropped (FlagEmbedding's lexical weights).
The MLM head runs here, per input on its real tokens only: a [batch, seq, vocab] logits
tensor would be 500 MB for 32 x 128 tokens over BERT's 30,522 ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ember.batch import EMBEDDINGS, TOKEN_STATES, TokenBatch
from ember.heads.base import attention
from ember.outputs import SparseVector


def erf(x: np.ndarray) -> np.ndarray:
    """erf to within 1.5e-7 (Abramowitz & Stegun 7.1.26); numpy has none."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return sign * (1.0 - poly * np.exp(-a * a))


def activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "gelu":
        return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if name == "relu":
        return np.maximum(x, 0)
    raise ValueError(f"MLM head activation {name!r} is not supported")


@dataclass(frozen=True)
class MlmHead:
    """BERT-style ``cls.predictions``: dense + activation + LayerNorm, then the decoder."""

    dense_w: np.ndarray
    dense_b: np.ndarray
    norm_w: np.ndarray
    norm_b: np.ndarray
    eps: float
    act: str
    decoder_w: np.ndarray  # [vocab, hidden]
    decoder_b: np.ndarray

    def logits(self, states: np.ndarray) -> np.ndarray:
        x = activation(self.act, states @ self.dense_w.T + self.dense_b)
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        x = (x - mean) / np.sqrt(var + self.eps) * self.norm_w + self.norm_b
        return x.astype(np.float32) @ self.decoder_w.T + self.decoder_b


@dataclass(frozen=True)
class SpladeHead:
    """``log_twice``: SpladePooling's ``log1p_relu`` (OpenSearch's), log1p(log1p(relu)),
    taken after the max, which it commutes with."""

    mlm: MlmHead
    output: Literal["sparse"] = "sparse"
    log_twice: bool = False

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[SparseVector]:
        states = outputs[TOKEN_STATES]
        mask = attention(outputs, batch)
        results = []
        for row in rows:
            real = states[row][mask[row] > 0]
            weights = np.log1p(np.maximum(self.mlm.logits(real), 0)).max(axis=0)
            if self.log_twice:
                weights = np.log1p(weights)
            results.append(SparseVector.from_dense(weights))
        return results


@dataclass(frozen=True)
class VocabularyWeightsHead:
    """A row of weights over the vocabulary that the backend computed (a
    SparseStaticEmbedding's IDF lookup) -> its nonzero entries."""

    output: Literal["sparse"] = "sparse"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[SparseVector]:
        return [SparseVector.from_dense(outputs[EMBEDDINGS][row]) for row in rows]


@dataclass(frozen=True)
class LexicalWeightsHead:
    """BGE-M3's sparse head: relu(states @ w + b) per token, the max per token id."""

    weight: np.ndarray  # [1, hidden]
    bias: np.ndarray  # [1]
    dropped_ids: frozenset[int]  # [CLS], </s>, padding, unknown
    output: Literal["sparse"] = "sparse"

    def split(
        self, outputs: dict[str, np.ndarray], batch: TokenBatch, rows: Sequence[int]
    ) -> list[SparseVector]:
        states = outputs[TOKEN_STATES]
        # A backend may return states and mask wider than the batch (Neuron's buckets):
        # only the batch's own columns have token ids.
        width = batch.input_ids.shape[1]
        mask = attention(outputs, batch)[:, :width]
        results = []
        for row in rows:
            real = mask[row] > 0
            ids = batch.input_ids[row, : mask.shape[1]][real]
            weights = np.maximum(states[row, :width][real] @ self.weight[0] + self.bias[0], 0)
            keep = ~np.isin(ids, list(self.dropped_ids)) & (weights > 0)
            ids, weights = ids[keep], weights[keep].astype(np.float32)
            if ids.size == 0:
                results.append(SparseVector(np.zeros(0, np.int64), np.zeros(0, np.float32)))
                continue
            order = np.lexsort((-weights, ids))  # by id, the largest weight first
            ids, weights = ids[order], weights[order]
            first = np.concatenate(([True], ids[1:] != ids[:-1]))
            results.append(SparseVector(ids[first].astype(np.int64), weights[first]))
        return results
