"""router: ``Router.for_query_document`` (a static query side, a MiniLM-shaped document
side, Normalize after, a prompt per side), written by ``SentenceTransformer.save``;
reference: ``encode_query``, ``encode_document`` and ``encode`` (the default route)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.static_models import build_query_document_router

FAMILY = "router"
EXAMPLE = "a `Router.for_query_document(...)` save (static query side, MiniLM documents)"


def build(root: Path) -> Path:
    return build_query_document_router(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    texts = list(kit.TEXTS)
    return [
        kit.embed(texts, model.encode_query(texts), label="query", input_type="search_query"),
        kit.embed(
            texts, model.encode_document(texts), label="document", input_type="search_document"
        ),
        kit.embed(texts, model.encode(texts), label="default route"),
    ]
