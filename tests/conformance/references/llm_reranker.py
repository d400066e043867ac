"""llm-reranker: Qwen3-Reranker-0.6B's layout (Qwen3ForCausalLM, its chat specials, "yes"
and "no" as single tokens), written by transformers' ``save_pretrained``; reference: the
model card's ``format_instruction``/``process_inputs``/``compute_logits`` on transformers'
full-vocabulary logits (tests/fixtures/llm_rerankers.py), scores and raw logit
differences."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.llm_rerankers import build_tiny_qwen3_reranker, reference_scores

FAMILY = "llm-reranker"
EXAMPLE = "Qwen/Qwen3-Reranker-0.6B"


def build(root: Path) -> Path:
    return build_tiny_qwen3_reranker(root)


def probes(path: Path) -> list[kit.Probe]:
    scores, raw = reference_scores(path, "qwen3", kit.QUERY, list(kit.DOCUMENTS))
    return [
        kit.rerank(kit.QUERY, kit.DOCUMENTS, scores),
        kit.rerank(kit.QUERY, kit.DOCUMENTS, raw, label="raw", raw_scores=True),
    ]
