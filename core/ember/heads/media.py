"""Heads of media models, whose networks project and pool inside: a dual encoder's tower
output is the embedding, a retrieval VLM's token vectors are the multi-vector output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ember.batch import ATTENTION, EMBEDDINGS, TOKEN_STATES, Batch
from ember.heads.base import select


@dataclass(frozen=True)
class TowerHead:
    """CLIP, SigLIP, CLAP: each row's projected tower output (normalised per request)."""

    output: Literal["dense"] = "dense"

    def split(
        self, outputs: dict[str, np.ndarray], batch: Batch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        return list(select(outputs[EMBEDDINGS], rows))


@dataclass(frozen=True)
class TokenVectorsHead:
    """ColPali, ColQwen2: a row's vectors at the positions it attends to, i.e. what the
    model returns for the input alone (prefix and image tokens included, padding never)."""

    output: Literal["multi"] = "multi"

    def split(
        self, outputs: dict[str, np.ndarray], batch: Batch, rows: Sequence[int]
    ) -> list[np.ndarray]:
        states, mask = outputs[TOKEN_STATES], outputs[ATTENTION]
        return [states[r][mask[r] != 0] for r in rows]  # boolean indexing copies
