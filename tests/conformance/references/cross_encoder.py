"""cross-encoder: a one-label BERT sequence classifier, as ms-marco-MiniLM-L6-v2 is, written
by transformers' ``save_pretrained``; reference: sentence-transformers'
``CrossEncoder.predict`` (its sigmoid, and the raw logits)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.tiny_models import build_tiny_reranker

FAMILY = "cross-encoder"
EXAMPLE = "cross-encoder/ms-marco-MiniLM-L6-v2"


def build(root: Path) -> Path:
    return build_tiny_reranker(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(path), device="cpu")
    pairs = [(kit.QUERY, d) for d in kit.DOCUMENTS]
    raw = model.predict(pairs, activation_fn=torch.nn.Identity())
    return [
        kit.rerank(kit.QUERY, kit.DOCUMENTS, model.predict(pairs)),
        kit.rerank(kit.QUERY, kit.DOCUMENTS, raw, label="raw", raw_scores=True),
    ]
