"""After the forward pass: normalisation, Matryoshka, output encodings, scores."""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np

from ember.errors import BadRequest
from ember.models.spec import Activation


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.clip(norms, 1e-12, None)


def truncate_dimensions(x: np.ndarray, dimensions: int | None, hidden: int) -> np.ndarray:
    """Matryoshka: keep the first ``dimensions`` values (caller re-normalises)."""
    if dimensions is None:
        return x
    if not 1 <= dimensions <= hidden:
        raise BadRequest(
            f"dimensions must be between 1 and {hidden} for this model, got {dimensions}",
            param="dimensions",
        )
    return x[..., :dimensions]


def embedding_output(
    pooled: np.ndarray, *, normalize: bool, dimensions: int | None, hidden: int
) -> np.ndarray:
    """Pooled vectors -> what the client gets, as float32 [n, dims]."""
    out = truncate_dimensions(pooled.astype(np.float32, copy=False), dimensions, hidden)
    return l2_normalize(out) if normalize else np.ascontiguousarray(out)


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 encoding: little-endian float32 bytes."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def rerank_scores(logits: np.ndarray, *, raw: bool) -> np.ndarray:
    """One score per (query, document): the single logit, through a sigmoid unless raw."""
    column = logits[:, 0] if logits.ndim == 2 else logits
    return column.astype(np.float64) if raw else sigmoid(column)


ACTIVATIONS: dict[Activation, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": lambda x: x.astype(np.float64),
}


def label_scores(
    logits: np.ndarray,
    id2label: dict[int, str],
    *,
    raw: bool = False,
    activation: Activation = "softmax",
) -> list:
    """Per text: all labels with scores, best first (ties in id order). ``activation`` is
    the model's (softmax, sigmoid per label for a multi-label model, none for a
    regression); ``raw`` gives the logits."""
    probs = ACTIVATIONS["none" if raw else activation](logits)
    result = []
    for row in probs:
        order = np.argsort(-row, kind="stable")
        result.append(
            [
                {"label": id2label.get(int(i), f"LABEL_{int(i)}"), "score": float(row[i])}
                for i in order
            ]
        )
    return result
