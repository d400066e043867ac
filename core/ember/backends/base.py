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

from ember.batch import Batch, Outputs
from ember.models.spec import ResolvedModel


@dataclass(frozen=True)
class PaddingBudget:
    """Padding a batch may carry: ``tokens``, or ``fraction`` of its padded cost if more.
    ``packed``: the backend runs a batch's real tokens as one stream (no padding at all),
    so a batch costs the sum of its items' costs, not count x the longest."""

    tokens: int
    fraction: float
    packed: bool = False

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
