"""The one small protocol every backend implements.

A backend turns a padded batch of token ids into numbers: pooled sentence
embeddings for embedding models, logits for rerankers and classifiers. It never
sees HTTP, requests or per-request options; everything after the forward pass
(normalisation, Matryoshka truncation, sigmoid/softmax, output dtypes) lives in
``ember.heads`` so every backend shares it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ember.models.spec import ResolvedModel

# Named outputs of a forward pass:
#   TOKEN_STATES  float32 [batch, seq, hidden]  encoders (the last hidden state)
#   LOGITS        float32 [batch, labels]       sequence classifiers (the model's own head)
#   ATTENTION     int64 [batch, seq]             optional: the mask the states were computed
#                                                with, when a backend reshaped the batch
#   EMBEDDINGS    float32 [batch, dim]           dual encoders: a tower's projected output
TOKEN_STATES = "token_states"
LOGITS = "logits"
ATTENTION = "attention_mask"
EMBEDDINGS = "embeddings"
Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class TokenBatch:
    """A padded batch, right-padded, as numpy int64 arrays of shape [batch, seq].

    ``lengths`` is each row's own length (positions the processor produced for it). It
    equals ``attention_mask.sum(1)`` except where a processor masks positions it still
    wants outputs for (ColBERT's query expansion). ``keep`` is, per row, the positions a
    multi-vector output keeps when not all of them (ColBERT's document skiplist).
    ``pool_from`` is, per row, the positions before it a dense head leaves out of pooling
    (a prompt's, for a Pooling with ``include_prompt: false``). ``route`` is the
    sentence-transformers Router route every row of the batch takes (None: no Router).
    Backends read only the three arrays (a Router's, the route).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray | None = None
    keep: tuple[tuple[int, ...] | None, ...] | None = None
    pool_from: np.ndarray | None = None
    route: str | None = None

    def row_lengths(self) -> np.ndarray:
        if self.lengths is not None:
            return self.lengths
        return self.attention_mask.sum(axis=1)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass(frozen=True)
class FeatureBatch:
    """A batch of one modality for a media model: the arrays its processor produced
    (``input_ids``/``pixel_values``/``input_features``...), token arrays right-padded."""

    modality: str
    arrays: dict[str, np.ndarray]

    @property
    def shape(self) -> tuple[int, ...]:
        first = next(iter(self.arrays.values()))
        return tuple(int(n) for n in first.shape)


Batch = TokenBatch | FeatureBatch


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

    ``forward`` is called from up to ``parallel_forwards`` worker threads at once: CPU
    backends run one single-threaded forward per core rather than one forward on a
    multi-threaded pool (see ``ember.cpu.cpu_forward_plan``). ``padding`` is how much
    padding a batch may carry before smaller batches are cheaper; None follows
    ``info.device`` (``ember.engine.batcher.padding_budget_for``). ``max_batch_size`` and
    ``max_length`` are set by backends compiled for static shapes (Neuron), else None.
    """

    info: BackendInfo
    parallel_forwards: int
    padding: PaddingBudget | None
    max_batch_size: int | None
    max_length: int | None
    # Whether positions masked from attention inside a row still get token states (they
    # do with an attention mask; not where a backend takes lengths and drops padding).
    masked_positions: bool

    def forward(self, batch: Batch) -> Outputs:
        """``TOKEN_STATES`` for an encoder backbone, ``LOGITS`` for a sequence classifier,
        ``EMBEDDINGS`` for a dual encoder's tower (a ``FeatureBatch``)."""
        ...

    def close(self) -> None:
        """Free device memory; the backend is not used afterwards."""
        ...


class BackendDefaults:
    """The protocol's optional attributes at their defaults: backends inherit this and
    set only what differs."""

    parallel_forwards: int = 1
    padding: PaddingBudget | None = None
    max_batch_size: int | None = None
    max_length: int | None = None
    masked_positions: bool = True


class BackendFactory(Protocol):
    def __call__(self, model: ResolvedModel) -> Backend: ...
