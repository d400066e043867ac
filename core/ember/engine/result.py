"""What an engine call hands back: its outputs, the tokens it counted and where its time
went (the API's usage fields and TEI-style timing headers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.outputs import OutputValue


@dataclass
class Timings:
    """Seconds per stage for one request; exposed as TEI-style response headers, and
    recorded after the fact as the request's trace spans (``ember.tracing``): the stages
    follow one another from ``started``, with the batch the request's inputs ran in."""

    tokenize: float = 0.0
    queue: float = 0.0
    forward: float = 0.0
    started: float = 0.0  # time.perf_counter() the engine call began; 0: nothing measured
    model: str | None = None  # the served name of the model that ran
    tokens: int = 0  # the request's own tokens
    batch_size: int = 0  # inputs in the largest batch its inputs ran in
    batch_tokens: int = 0  # that batch's padded cost (count x longest)
    truncated: int = 0  # inputs cut to the model's length (the x-ember-truncated header)


@dataclass
class Result:
    """What an engine call returns: its typed, finished output plus accounting.

    ``output`` is ``DenseVectors``, ``MultiVectors``, ``SparseVectors`` or ``Scores``
    (``ember.outputs``); ``outputs`` is its plain payload as the embedded API hands it
    out: float32 [n, d] for dense embeddings, float64 [n] for scores, a list of [k_i, d]
    arrays for multi-vector embeddings, a list of ``SparseVector`` for sparse ones.
    """

    output: OutputValue | None
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)
    # Tokens per input, in order, where the call counted them (the embedding cache keeps
    # each input's count with its row, so a hit's ``usage`` is the miss's).
    input_tokens: list[int] = field(default_factory=list)

    @property
    def outputs(self) -> Any:
        return None if self.output is None else self.output.payload
