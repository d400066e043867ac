"""Typed outputs: what an engine call answers, one type per output kind, each owning its
own finishing (normalising, Matryoshka ``dimensions``, activation, MaxSim, cosine).

Heads return one row per input (a ``Row``); the engine collects a request's rows into
its type (``output_type(kind).from_rows``) and finishes it there; the dialects encode the
finished value. Nothing outside this module compares an output kind's name: it asks the
type (``embeds``, ``sized``, ``base64``) or dispatches on it. The values keep numpy arrays
inside (one [n, d] array for dense vectors), so no per-vector objects are made on the
hot path.

The ground floor: imports numpy and Ember's vocabulary (chunk spans included) and errors
only.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

import numpy as np

from ember.capabilities import Capability, Output
from ember.chunking import Span
from ember.errors import BadRequest

# What turns a classifier's logits into label scores (transformers' text-classification
# pipeline: softmax over labels, sigmoid per label, or the raw values of a regression).
Activation = Literal["softmax", "sigmoid", "none"]


@dataclass(frozen=True)
class SparseVector:
    indices: np.ndarray  # int64, ascending
    values: np.ndarray  # float32, all > 0

    @classmethod
    def from_dense(cls, weights: np.ndarray) -> SparseVector:
        (idx,) = np.nonzero(weights > 0)
        return cls(idx.astype(np.int64), weights[idx].astype(np.float32))

    def as_dict(self) -> dict[str, np.ndarray]:
        """The JSON shape every dialect answers it in (orjson writes the arrays)."""
        return {"indices": self.indices, "values": self.values}


# One input's value as a head returns it: a vector [d], a multi-vector [k, d], a sparse
# vector, or a row of logits [labels].
Row: TypeAlias = "np.ndarray | SparseVector"


# ---- the arithmetic the types finish with ----------------------------------------------------
def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.clip(norms, 1e-12, None)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


ACTIVATIONS: dict[Activation, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": lambda x: x.astype(np.float64),
}


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 encoding: little-endian float32 bytes (a [k, d] array flattened)."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def check_dimensions(
    dimensions: int, hidden: int, *, param: str = "dimensions", model: str = "this model"
) -> None:
    """Matryoshka's range: 1 to the model's width; ``param`` names the dialect's field."""
    if not 1 <= dimensions <= hidden:
        raise BadRequest(
            f"{param} must be between 1 and {hidden} for {model}, got {dimensions}",
            param=param,
        )


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """PyLate's MaxSim: for each query vector its best dot product with a document
    vector, summed (a raw sum, not divided by the number of query vectors)."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((query.astype(np.float64) @ document.T.astype(np.float64)).max(axis=1).sum())


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


# ---- the types -----------------------------------------------------------------------------
class OutputValue:
    """What every output type says about itself, so callers never name a kind."""

    __slots__ = ()
    kind: ClassVar[Output]
    embeds: ClassVar[bool] = True  # an embedding (/v1/embeddings), not logits
    sized: ClassVar[bool] = False  # takes Matryoshka ``dimensions`` (one vector per input)
    base64: ClassVar[bool] = True  # has an OpenAI base64 encoding
    capability: ClassVar[Capability] = "embed"  # what a route asks a model for, to get it
    words: ClassVar[str] = "scores"  # what it is, in error messages

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> OutputValue:
        raise NotImplementedError

    @property
    def payload(self) -> Any:
        """The plain value (an array or a list of them) the embedded API hands out."""
        raise NotImplementedError

    def finished(
        self, *, normalize: bool | None, dimensions: int | None, hidden: int
    ) -> OutputValue:
        """The value as a client gets it; only dense vectors are normalised and cut."""
        return self

    @classmethod
    def check_dimensions(
        cls, dimensions: int, hidden: int, model: str, param: str = "dimensions"
    ) -> None:
        """Refuse ``dimensions`` before any compute: only dense vectors take it; ``param``
        names the dialect's field."""
        raise BadRequest(
            f"{param} applies to dense embeddings; model {model!r} returns "
            f"{cls.kind} embeddings here",
            param=param,
        )


@dataclass(frozen=True, slots=True)
class DenseVectors(OutputValue):
    """One vector per input: float32 [n, d]."""

    vectors: np.ndarray
    kind: ClassVar[Output] = "dense"
    sized: ClassVar[bool] = True
    words: ClassVar[str] = "dense embeddings"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> DenseVectors:
        return cls(np.stack(rows))

    @property
    def payload(self) -> np.ndarray:
        return self.vectors

    def finished(
        self, *, normalize: bool | None, dimensions: int | None, hidden: int
    ) -> DenseVectors:
        """Float32, cut to ``dimensions`` (Matryoshka), then normalised if asked."""
        out = self.vectors.astype(np.float32, copy=False)
        if dimensions is not None:
            check_dimensions(dimensions, hidden)
            out = out[..., :dimensions]
        return DenseVectors(l2_normalize(out) if normalize else np.ascontiguousarray(out))

    @classmethod
    def check_dimensions(
        cls, dimensions: int, hidden: int, model: str, param: str = "dimensions"
    ) -> None:
        check_dimensions(dimensions, hidden, param=param)

    def cosine(self, left: Sequence[int], right: Sequence[int]) -> Scores:
        """The cosine of each (left[i], right[i]) pair of rows."""
        a, b = self.vectors[list(left)], self.vectors[list(right)]
        dots = np.einsum("ij,ij->i", a, b).astype(np.float64)
        norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
        return Scores(dots / np.clip(norms.astype(np.float64), 1e-12, None))

    def base64_rows(self) -> list[str]:
        return [to_base64(row) for row in self.vectors]


@dataclass(frozen=True, slots=True)
class MultiVectors(OutputValue):
    """One vector per token position of each input: a float32 [k_i, d] array each."""

    vectors: list[np.ndarray]
    kind: ClassVar[Output] = "multi"
    capability: ClassVar[Capability] = "embed_multi"
    words: ClassVar[str] = "multi-vector embeddings"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> MultiVectors:
        return cls(list(rows))

    @property
    def payload(self) -> list[np.ndarray]:
        return self.vectors

    def maxsim(self) -> Scores:
        """The first input (the query) scored against each of the others by MaxSim."""
        query = self.vectors[0]
        return Scores(np.array([maxsim(query, d) for d in self.vectors[1:]], dtype=np.float64))

    def base64_rows(self) -> list[str]:
        return [to_base64(v) for v in self.vectors]  # each [k, d] array flattened


@dataclass(frozen=True, slots=True)
class SparseVectors(OutputValue):
    """A weight per vocabulary id of each input, zeros dropped."""

    vectors: list[SparseVector]
    kind: ClassVar[Output] = "sparse"
    base64: ClassVar[bool] = False
    capability: ClassVar[Capability] = "embed_sparse"
    words: ClassVar[str] = "sparse embeddings"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> SparseVectors:
        return cls(list(rows))

    @property
    def payload(self) -> list[SparseVector]:
        return self.vectors


@dataclass(frozen=True, slots=True)
class Scores(OutputValue):
    """One score per input (a pair's relevance, a cosine): float64 [n]."""

    values: np.ndarray
    kind: ClassVar[Output] = "logits"
    embeds: ClassVar[bool] = False
    base64: ClassVar[bool] = False
    capability: ClassVar[Capability] = "rerank"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> Scores:
        return cls(np.stack(rows).astype(np.float64))

    @property
    def payload(self) -> np.ndarray:
        return self.values

    def best_first(self, top_n: int | None = None) -> np.ndarray:
        """Indices by descending score (ties keep input order), cut to ``top_n`` if given."""
        return np.argsort(-self.values, kind="stable")[:top_n]


@dataclass(frozen=True, slots=True)
class ChunkedScores(Scores):
    """Long-document reranking (``ember.engine.long_rerank``): each document's score is its
    best chunk's; ``best`` is that chunk's index among the document's chunks and ``spans``
    where it lies in the document."""

    best: Sequence[int] = ()
    spans: Sequence[Span] = ()


@dataclass(frozen=True, slots=True)
class Logits(OutputValue):
    """A classifier's (or a reranker's) logits, one row per input: [n, labels]. Finished
    into ``Scores`` (rerank) or ``Labels`` (classify)."""

    values: np.ndarray
    kind: ClassVar[Output] = "logits"
    embeds: ClassVar[bool] = False
    base64: ClassVar[bool] = False
    capability: ClassVar[Capability] = "classify"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> Logits:
        return cls(np.stack(rows))

    @property
    def payload(self) -> np.ndarray:
        return self.values

    def scores(self, *, raw: bool) -> Scores:
        """One score per (query, document): the single logit, through a sigmoid unless raw."""
        column = self.values[:, 0] if self.values.ndim == 2 else self.values
        return Scores(column.astype(np.float64) if raw else sigmoid(column))

    def labels(self, id2label: dict[int, str], *, raw: bool, activation: Activation) -> Labels:
        return Labels(label_scores(self.values, id2label, raw=raw, activation=activation))


@dataclass(frozen=True, slots=True)
class Labels(OutputValue):
    """Per input, every label with its score, best first: ``[{"label", "score"}]``."""

    rows: list[list[dict]]
    kind: ClassVar[Output] = "logits"
    embeds: ClassVar[bool] = False
    base64: ClassVar[bool] = False
    capability: ClassVar[Capability] = "classify"

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> Labels:
        return cls(list(rows))

    @property
    def payload(self) -> list[list[dict]]:
        return self.rows

    def applied(self, function: Activation | None, top_k: int | None = None) -> Labels:
        """Each row's scores (raw logits) through ``function`` (None: as they are), cut to
        ``top_k``; every activation is monotonic, so the order holds."""
        out = []
        for row in self.rows:
            if function is not None:
                scores = ACTIVATIONS[function](np.array([item["score"] for item in row]))
                row = [{**item, "score": float(p)} for item, p in zip(row, scores, strict=True)]
            out.append(row[:top_k])
        return Labels(out)


@dataclass(frozen=True, slots=True)
class ChunkedVectors(OutputValue):
    """Long documents (``ember.chunking``): per input, its chunks' vectors [k_i, d] with
    where each lies (``spans``, and ``texts`` when asked), and the document's vector
    (``documents`` [n, d]: the chunks' aggregate; None when none was asked). Finished as
    they are made: each chunk as the model finishes a vector, the aggregate again."""

    documents: np.ndarray | None
    chunks: list[np.ndarray]
    spans: list[list[Span]]
    texts: list[list[str]] | None = None
    kind: ClassVar[Output] = "dense"
    sized: ClassVar[bool] = True
    words: ClassVar[str] = "dense embeddings"

    @property
    def payload(self) -> np.ndarray | list[np.ndarray]:
        return self.documents if self.documents is not None else self.chunks


# What each output kind a head declares is collected into.
OUTPUT_TYPES: dict[Output, type[OutputValue]] = {
    "dense": DenseVectors,
    "multi": MultiVectors,
    "sparse": SparseVectors,
    "logits": Logits,
}

# The kinds a corpus job or /v1/embeddings can return, in the vocabulary's order.
EMBEDDING_KINDS: tuple[Output, ...] = tuple(k for k, t in OUTPUT_TYPES.items() if t.embeds)


def output_type(kind: Output) -> type[OutputValue]:
    return OUTPUT_TYPES[kind]


def embeds(kind: Output | None) -> bool:
    """Whether ``kind`` is an embedding (not None, not logits)."""
    return kind is not None and OUTPUT_TYPES[kind].embeds


def is_dense(kind: Output | None) -> bool:
    return kind is not None and OUTPUT_TYPES[kind] is DenseVectors


def has(kinds: Iterable[Output], wanted: type[OutputValue]) -> bool:
    """Whether any of ``kinds`` collects into ``wanted``."""
    return any(OUTPUT_TYPES[k] is wanted for k in kinds)
