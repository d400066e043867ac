"""llm-cross-encoder: a ``CrossEncoder`` over a causal LM (a text-generation Transformer,
then LogitScore of "yes" against "no", Sigmoid, a chat template and a default prompt),
written by sentence-transformers' own ``save_pretrained``; reference:
``CrossEncoder.predict`` (its sigmoid, and the raw logit difference)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.llm_rerankers import build_st_causal_cross_encoders

FAMILY = "llm-cross-encoder"
EXAMPLE = 'a `CrossEncoder("Qwen/Qwen3-0.6B")` saved by sentence-transformers 6.2'


def build(root: Path) -> Path:
    return build_st_causal_cross_encoders(root)["yes-no"]


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
