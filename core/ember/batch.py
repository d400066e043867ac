"""The values that flow between the layers: one input's features (``Tokens`` for text,
``Features`` for media), a batch of them (``TokenBatch``, ``FeatureBatch``) and a forward
pass's named ``Outputs``. The ground floor: processors make them, the batcher schedules
them, backends and heads read them; it imports nothing of Ember's but the vocabulary."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, TypedDict

import numpy as np

from ember.capabilities import Modality

# Named outputs of a forward pass:
#   TOKEN_STATES  float32 [batch, seq, hidden]  encoders (the last hidden state)
#   LOGITS        float32 [batch, labels]       sequence classifiers (the model's own head)
#   ATTENTION     int64 [batch, seq]             optional: the mask the states were computed
#                                                with, when a backend reshaped the batch
#   EMBEDDINGS    float32 [batch, dim]           dual encoders: a tower's projected output
TOKEN_STATES: Final = "token_states"
LOGITS: Final = "logits"
ATTENTION: Final = "attention_mask"
EMBEDDINGS: Final = "embeddings"


class Outputs(TypedDict, total=False):
    """A forward pass's named outputs (the constants above are their keys)."""

    token_states: np.ndarray
    logits: np.ndarray
    attention_mask: np.ndarray
    embeddings: np.ndarray


@dataclass(frozen=True)
class TokenBatch:
    """A padded batch, right-padded, as numpy int64 arrays of shape [batch, seq].

    ``lengths`` is each row's own length (positions the processor produced for it). It
    equals ``attention_mask.sum(1)`` except where a processor masks positions it still
    wants outputs for (ColBERT's query expansion). ``keep`` is, per row, the positions a
    multi-vector output keeps when not all of them (ColBERT's document skiplist).
    ``pool_from`` is, per row, the positions before it a dense head leaves out of pooling
    (a prompt's, for a Pooling with ``include_prompt: false``); ``reduce`` the pooling a
    backend may apply itself (below). ``part`` is the part every
    row of the batch takes of a model made of parts (``Facts.parts``: a Router's route; None:
    the model is one network), and ``adapter`` the LoRA task adapter (a remote-code model's
    ``adapter_mask``; None: none). Backends read only the three arrays (one of parts, the
    part).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray | None = None
    keep: tuple[tuple[int, ...] | None, ...] | None = None
    pool_from: np.ndarray | None = None
    part: str | None = None
    adapter: int | None = None  # the LoRA task adapter every row takes (None: the base)
    # The one pooling ("cls", "mean", "last", "max") every row's head applies over all its
    # attended tokens, when that is so; a backend may then return TOKEN_STATES already
    # pooled, as [rows, 1, hidden] with an ATTENTION of ones [rows, 1], which the head pools
    # into itself (a GPU sends back one vector per row instead of every token's).
    reduce: str | None = None
    # Late chunking: per row, the position spans whose states its head pools apart
    # (``Tokens.spans``); None: no row has any.
    spans: tuple[tuple[tuple[int, int], ...] | None, ...] | None = None

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

    modality: Modality
    arrays: dict[str, np.ndarray]

    @property
    def shape(self) -> tuple[int, ...]:
        first = next(iter(self.arrays.values()))
        return tuple(int(n) for n in first.shape)


Batch = TokenBatch | FeatureBatch


@dataclass(frozen=True)
class Tokens:
    """One text's ids, ready to batch; ``truncated_from`` is the length before truncation
    (of the part of a very long text that was tokenised, ``ember.processors.cut``).

    ``attention`` is the attention mask when not all ones (ColBERT's query expansion);
    ``keep`` the positions a multi-vector output keeps when not all (ColBERT's document
    skiplist); ``pool_from`` the leading positions pooling leaves out (the prompt, where
    the model pools without it). ``part`` is the part of a model made of parts that encodes
    it (a Router's route). ``cost``
    is what the batcher schedules by: the padded positions it takes.
    """

    ids: list[int]
    type_ids: list[int]
    truncated_from: int | None = None
    attention: list[int] | None = None
    keep: tuple[int, ...] | None = None
    pool_from: int = 0
    part: str | None = None
    adapter: int | None = None  # a LoRA task adapter's id (jina-embeddings-v3's tasks)
    # Late chunking: position spans [a, b) whose states a dense head pools apart, one
    # partial pool each, instead of pooling the whole input.
    spans: tuple[tuple[int, int], ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def cost(self) -> int:
        return len(self.ids)

    @property
    def key(self) -> Hashable:
        """Texts of any length share a batch (padding makes the shapes agree), of one part
        and one task adapter only (each is its own network)."""
        return self.part if self.adapter is None else (self.part, self.adapter)


@dataclass(frozen=True, slots=True)
class Features:
    """One input's model features (arrays with a leading axis of one item, except arrays
    that are concatenated whole), with the batcher's ``cost`` and shape ``key``."""

    modality: Modality
    arrays: dict[str, np.ndarray]
    cost: int
    key: Hashable

    def __len__(self) -> int:
        """Usage: tokens for text and for VLM pages, patches or frames for media."""
        return self.cost
