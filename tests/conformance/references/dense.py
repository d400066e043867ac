"""dense: a Transformer, mean Pooling and Normalize, as all-MiniLM-L6-v2 is, written by
``SentenceTransformer.save``; reference: ``SentenceTransformer.encode``."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.tiny_models import build_tiny_embedder

FAMILY = "dense"
EXAMPLE = "sentence-transformers/all-MiniLM-L6-v2"


def build(root: Path) -> Path:
    from sentence_transformers import SentenceTransformer

    raw = build_tiny_embedder(root / "raw", pooling="mean")
    model = SentenceTransformer(str(raw), device="cpu")
    model.save(str(root / "model"), create_model_card=False)
    return root / "model"


def probes(path: Path) -> list[kit.Probe]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return [kit.embed(kit.TEXTS, model.encode(list(kit.TEXTS)))]
