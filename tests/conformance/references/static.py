"""static: a lone StaticEmbedding in the 3.x folder layout of
static-retrieval-mrl-en-v1, written by ``SentenceTransformer.save``; reference:
``SentenceTransformer.encode``, and its ``truncate_dim`` for a Matryoshka width."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.static_models import MATRYOSHKA, build_static_retrieval_like

FAMILY = "static"
EXAMPLE = "sentence-transformers/static-retrieval-mrl-en-v1"


def build(root: Path) -> Path:
    return build_static_retrieval_like(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    texts = list(kit.TEXTS)
    return [
        kit.embed(texts, model.encode(texts)),
        kit.embed(
            texts,
            model.encode(texts, truncate_dim=MATRYOSHKA),
            label=f"dimensions {MATRYOSHKA}",
            dimensions=MATRYOSHKA,
        ),
    ]
