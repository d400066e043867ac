"""A sequence classifier with one label, served as a reranker: its logit per (query,
document) pair, sigmoid unless ``raw_scores``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.families.base import Family, lazy, plain

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


def logits_heads(model: ResolvedModel) -> dict[Output, Head]:
    """The network's own head computed the logits; the head only splits them by input."""
    from ember.heads.dense import LogitsHead

    return {"logits": LogitsHead()}


CROSS_ENCODER = Family(
    name="cross-encoder",
    title="cross-encoder",
    backbone="sequence-classifier",
    outputs=("logits",),
    detect=plain("rerank"),
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=logits_heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="`*ForSequenceClassification`, one label",
    example="cross-encoder/ms-marco-MiniLM-L6-v2",
    scoring="cross-encoder",
    task="rerank",
)
