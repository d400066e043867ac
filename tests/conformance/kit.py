"""What the conformance kit checks a served family with: a fixed input set, the ``Probe``
a reference module returns for each request, and one comparison per output type.

A probe is one HTTP request to a real `ember serve` (the body without ``model``: the kit
adds the family's served name), what the answer is read as, what the reference library
computed for it, and how the two must agree. Its ``capability`` is the registry
capability it exercises: the kit checks that a family's probes cover every capability
its row claims, so a row that gains one needs a reference for it.

Tolerances are the suite's (COMMON quality bar, and the existing family tests):
dense and multi-vector rows cosine >= 0.9999 in fp32; scores and sparse weights within
1e-4, relative to the reference's size once that passes 1 (MaxSim sums, SPLADE weights).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_COSINE = 0.9999
TOLERANCE = 1e-4

# The fixed input set: punctuated, a question, a sentence, unicode with emoji, one with
# surrounding whitespace, and one far past every max length (cut by each model's rule).
TEXTS = (
    "Hello, world!",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "ünïcödé tëxt wïth äccents and an emoji 🙂",
    "   leading and trailing whitespace   ",
    "The quick brown fox jumps over the lazy dog. " * 60,
)
SHORT_TEXTS = TEXTS[:5]  # for towers whose reference library does not cut a long text
QUERY = "what is the capital of france?"
DOCUMENTS = TEXTS[1:]


@dataclass(frozen=True)
class Probe:
    """One request and the reference answer it must match."""

    capability: str  # the registry's name for what it checks (ember.capabilities)
    route: str
    body: Mapping[str, Any]
    read: Callable[[Any], Any]  # the answer's JSON -> what ``compare`` takes
    want: Any
    compare: Callable[[Any, Any], str]  # raises AssertionError; returns the figure
    label: str = field(default="")

    def describe(self) -> str:
        return f"{self.capability} {self.route} {self.label}".strip()


# -------------------------------------------------------------------- comparisons


def _rows(value: Any) -> np.ndarray:
    return np.atleast_2d(np.asarray(value, dtype=np.float64))


def cosine_rows(got: Any, want: Any) -> str:
    """Every row's cosine >= MIN_COSINE (a zero row must be zero on both sides)."""
    g, w = _rows(got), _rows(want)
    assert g.shape == w.shape, f"shape {g.shape}, reference {w.shape}"
    gn, wn = np.linalg.norm(g, axis=1), np.linalg.norm(w, axis=1)
    empty = wn < 1e-12
    assert (gn[empty] < 1e-6).all(), f"rows {np.nonzero(empty)[0].tolist()} should be zero"
    cos = np.where(empty, 1.0, (g * w).sum(1) / np.where(empty, 1.0, gn * wn))
    worst = int(cos.argmin())
    assert cos[worst] >= MIN_COSINE, f"row {worst}: cosine {cos[worst]:.6f} < {MIN_COSINE}"
    return f"worst cosine {cos[worst]:.6f}"


def multi_vectors(got: Sequence[Any], want: Sequence[Any]) -> str:
    """Per input, the same number of vectors, each at cosine >= MIN_COSINE."""
    assert len(got) == len(want), f"{len(got)} inputs answered, reference {len(want)}"
    figures = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        try:
            figures.append(float(cosine_rows(g, w).rsplit(" ", 1)[1]))
        except AssertionError as error:
            raise AssertionError(f"input {i}: {error}") from None
    return f"worst cosine {min(figures):.6f}"


def _within(got: np.ndarray, want: np.ndarray) -> float:
    """The largest |got - want| over the allowed error (TOLERANCE, relative past 1)."""
    allowed = TOLERANCE * max(1.0, float(np.abs(want).max(initial=0.0)))
    return float(np.abs(got - want).max(initial=0.0)) / allowed


def scores(got: Any, want: Any) -> str:
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"shape {g.shape}, reference {w.shape}"
    ratio = _within(g, w)
    delta = float(np.abs(g - w).max(initial=0.0))
    assert ratio <= 1.0, f"max |Δ| {delta:.3g} (scores {g.round(6)}, reference {w.round(6)})"
    return f"max |Δ| {delta:.2g}"


def sparse_pairs(rows: Any) -> list[tuple[list[int], np.ndarray]]:
    """(indices ascending, values) per input from a dense ``[n, vocab]`` array, a list of
    ``{str(id): weight}`` (FlagEmbedding's lexical weights) or (indices, values) pairs."""
    out = []
    for row in rows:
        if isinstance(row, dict):
            items = sorted((int(k), float(v)) for k, v in row.items() if float(v) != 0.0)
            out.append(([i for i, _ in items], np.array([v for _, v in items])))
        elif isinstance(row, tuple):
            order = np.argsort(row[0], kind="stable")
            indices = np.asarray(row[0])[order]
            out.append((indices.tolist(), np.asarray(row[1], dtype=np.float64)[order]))
        else:
            dense = np.asarray(row, dtype=np.float64)
            indices = np.nonzero(dense)[0]
            out.append((indices.tolist(), dense[indices]))
    return out


def sparse(got: Any, want: Any) -> str:
    """Per input, the reference's nonzero ids exactly and their weights within tolerance."""
    g, w = sparse_pairs(got), sparse_pairs(want)
    assert len(g) == len(w), f"{len(g)} inputs answered, reference {len(w)}"
    worst = 0.0
    for i, ((gi, gv), (wi, wv)) in enumerate(zip(g, w, strict=True)):
        if gi != wi:
            extra, missing = sorted(set(gi) - set(wi)), sorted(set(wi) - set(gi))
            raise AssertionError(f"input {i}: ids differ: extra {extra[:8]}, missing {missing[:8]}")
        ratio = _within(gv, wv)
        assert ratio <= 1.0, f"input {i}: max |Δ| {np.abs(gv - wv).max():.3g}"
        worst = max(worst, float(np.abs(gv - wv).max(initial=0.0)))
    return f"max |Δ| {worst:.2g}"


def labels(got: Sequence[Mapping[str, float]], want: Sequence[Mapping[str, float]]) -> str:
    """Per input, the same labels with scores within tolerance."""
    assert len(got) == len(want), f"{len(got)} inputs answered, reference {len(want)}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w), f"input {i}: labels {sorted(g)}, reference {sorted(w)}"
        names = sorted(w)
        figure = scores([g[n] for n in names], [w[n] for n in names])
        worst = max(worst, float(figure.rsplit(" ", 1)[1]))
    return f"max |Δ| {worst:.2g}"


# -------------------------------------------------------------------- probes by route


def _data(answer: Any) -> list[Any]:
    return [row["embedding"] for row in answer["data"]]


def _openai_sparse(answer: Any) -> list[tuple[list[int], list[float]]]:
    return [(e["indices"], e["values"]) for e in _data(answer)]


def _tei_sparse(answer: Any) -> list[tuple[list[int], list[float]]]:
    return [([e["index"] for e in row], [e["value"] for e in row]) for row in answer]


def _by_index(answer: Any) -> np.ndarray:
    results = answer["results"]
    out = np.full(len(results), np.nan)
    for item in results:
        out[item["index"]] = item["relevance_score"]
    return out


def _label_scores(answer: Any) -> list[dict[str, float]]:
    return [{e["label"]: e["score"] for e in row} for row in answer["data"]]


def embed(
    inputs: Sequence[Any],
    want: Any,
    compare: Callable[[Any, Any], str] = cosine_rows,
    label: str = "",
    **body: Any,
) -> Probe:
    """``/v1/embeddings``: dense rows (``cosine_rows``), multi-vectors (``multi_vectors``)
    or, with ``compare=sparse``, OpenAI-shaped sparse embeddings. ``modality`` image or
    audio in ``body`` makes it the image_embed or audio_embed probe."""
    modality = body.get("modality", "text")
    capability = {"image": "image_embed", "audio": "audio_embed"}.get(modality, "embed")
    read = _openai_sparse if compare is sparse else _data
    request = {"input": list(inputs), **body}
    return Probe(capability, "/v1/embeddings", request, read, want, compare, label)


def embed_sparse(texts: Sequence[str], want: Any, label: str = "", **body: Any) -> Probe:
    """TEI's ``/embed_sparse``."""
    request = {"inputs": list(texts), **body}
    return Probe("embed_sparse", "/embed_sparse", request, _tei_sparse, want, sparse, label)


def embed_multi(texts: Sequence[str], want: Any, label: str = "", **body: Any) -> Probe:
    """TEI's ``/embed_all``: every token's vector."""
    request = {"inputs": list(texts), **body}
    return Probe("embed_multi", "/embed_all", request, list, want, multi_vectors, label)


def rerank(query: str, documents: Sequence[Any], want: Any, label: str = "", **body: Any) -> Probe:
    """Cohere's ``/v1/rerank``: each document's relevance_score, in input order."""
    request = {"query": query, "documents": list(documents), **body}
    return Probe("rerank", "/v1/rerank", request, _by_index, want, scores, label)


def classify(texts: Sequence[str], want: Sequence[Mapping[str, float]], **body: Any) -> Probe:
    """Infinity's ``/classify``: every label's score per text."""
    request = {"input": list(texts), **body}
    return Probe("classify", "/classify", request, _label_scores, want, labels)


# -------------------------------------------------------------------- media inputs

# (sample image, format): landscape, portrait, greyscale and RGBA (converted to RGB).
IMAGES = (("gradient_wide", "PNG"), ("shapes_tall", "JPEG"), ("grey", "WEBP"), ("rgba", "PNG"))
CLIPS = ("tone_440", "chirp", "short_tone")  # mono at 48 kHz, under CLAP's 10 s window


def images() -> tuple[list[str], list[Any]]:
    """The images as data URIs (what is sent) and as a user of the reference library opens
    them: ``PIL.Image.open``, EXIF orientation applied, in the file's own mode (the
    processor converts to RGB; transformers composites an RGBA image over white)."""
    from PIL import Image, ImageOps

    from tests.fixtures import media_samples as media

    samples = media.sample_images()
    data = [media.encode_image(samples[name], fmt) for name, fmt in IMAGES]
    uris = [media.data_uri(d, media.MIME[fmt]) for d, (_, fmt) in zip(data, IMAGES, strict=True)]
    opened = [ImageOps.exif_transpose(Image.open(io.BytesIO(d))) for d in data]
    return uris, opened


def clips() -> tuple[list[str], list[np.ndarray]]:
    """The audio clips as WAV data URIs and as the server should decode them."""
    from tests.fixtures import media_samples as media

    samples = media.sample_clips()
    data = [media.wav_bytes(samples[name], media.CLAP_RATE) for name in CLIPS]
    return [media.data_uri(d, "audio/wav") for d in data], [media.decode_clip(d) for d in data]
