"""A sequence classifier with one label, served as a reranker: its logit per (query,
document) pair, through the CrossEncoder's saved ``activation_fn`` (sigmoid unless it says
Identity) unless ``raw_scores``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy, plain
from ember.models.spec import Facts, ScoreActivation

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


@dataclass(frozen=True)
class CrossEncoderFacts(Facts):
    """The family's facts: the activation_fn its CrossEncoder was saved with."""

    activation: ScoreActivation

    @property
    def rerank_activation(self) -> ScoreActivation:
        return self.activation


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """The pipeline's model, with the score activation CrossEncoder.predict applies."""
    from ember.models.pipeline import resolve_pipeline
    from ember.models.score_activation import saved_activation

    model = resolve_pipeline(files, family)
    if model.task != "rerank":  # --task classify or embed on a one-label classifier
        return model
    activation = saved_activation(files.root, files.config, files.spec.trust_remote_code)
    return replace(model, facts=CrossEncoderFacts(activation))


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
    resolve=resolve,
    heads=logits_heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="`*ForSequenceClassification`, one label",
    example="cross-encoder/ms-marco-MiniLM-L6-v2",
    scoring="cross-encoder",
    task="rerank",
)
