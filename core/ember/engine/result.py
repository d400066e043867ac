"""What an engine call hands back: its outputs, the tokens it counted and where its time
went (the API's usage fields and TEI-style timing headers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """Seconds per stage for one request; exposed as TEI-style response headers."""

    tokenize: float = 0.0
    queue: float = 0.0
    forward: float = 0.0


@dataclass
class Result:
    """What an engine call returns: per-input outputs plus accounting.

    ``outputs`` is float32 [n, d] for dense embeddings and scores, a list of [k_i, d]
    arrays for multi-vector embeddings, a list of ``SparseVector`` for sparse ones.
    """

    outputs: Any
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)
    # Tokens per input, in order, where the call counted them (the embedding cache keeps
    # each input's count with its row, so a hit's ``usage`` is the miss's).
    input_tokens: list[int] = field(default_factory=list)
