"""colbert: a PyLate ColBERT checkpoint (``[Q] ``/``[D] `` prefixes, query expansion, a
bias-free projection, the punctuation skiplist), byte-compatible with PyLate 1.6's save,
and for ct2 the same with the expansion attended;
reference: sentence-transformers' ``MultiVectorEncoder`` (which loads PyLate checkpoints;
PyLate itself pins an older sentence-transformers), queries and documents, MaxSim."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.references import maxsim, st_multi_vector_encode
from tests.fixtures.retrieval_models import build_tiny_colbert

FAMILY = "colbert"
EXAMPLE = "lightonai/GTE-ModernColBERT-v1"


def build(root: Path) -> Path:
    return build_tiny_colbert(root / "model")


def build_attended(root: Path) -> Path:
    """The example with ``attend_to_expansion_tokens: true``: what ct2 runs (the row's
    condition); sentence-transformers' MultiVectorEncoder reads the key as PyLate does."""
    return build_tiny_colbert(root / "model", attend_to_expansion_tokens=True)


# backend -> a variant meeting the row's condition for it (ColBERT's ct2: query expansion
# attended or off), served and matched there instead of the example.
VARIANTS = {"ct2": build_attended}


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.TEXTS)
    documents = st_multi_vector_encode(path, texts, is_query=False)
    queries = st_multi_vector_encode(path, texts, is_query=True)
    (query,) = st_multi_vector_encode(path, [kit.QUERY], is_query=True)
    docs = st_multi_vector_encode(path, list(kit.DOCUMENTS), is_query=False)
    return [
        kit.embed(texts, documents, kit.multi_vectors, label="document"),
        kit.embed(texts, queries, kit.multi_vectors, label="query", input_type="search_query"),
        kit.embed_multi(texts, queries, label="query", prompt_name="query"),
        kit.rerank(kit.QUERY, kit.DOCUMENTS, [maxsim(query, d) for d in docs]),
    ]
