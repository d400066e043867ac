"""A sequence classifier with several labels: label scores by config.json's
``problem_type`` (softmax, a sigmoid per label, or a regression's raw values)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy, plain
from ember.families.cross_encoder import logits_heads
from ember.models.spec import Activation, Facts

if TYPE_CHECKING:
    from ember.models.spec import ResolvedModel


@dataclass(frozen=True)
class ClassifierFacts(Facts):
    """The family's facts: what turns its logits into label scores, from config.json's
    ``problem_type`` (transformers' text-classification pipeline's)."""

    activation: Activation

    @property
    def label_activation(self) -> Activation:
        return self.activation


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    from ember.models.facts import classifier_activation
    from ember.models.pipeline import resolve_pipeline

    model = resolve_pipeline(files, family)
    activation = classifier_activation(files.config, model.num_labels)
    return replace(model, facts=ClassifierFacts(activation))


CLASSIFIER = Family(
    name="classifier",
    title="classifier",
    backbone="sequence-classifier",
    outputs=("logits",),
    detect=plain("classify"),
    resolve=resolve,
    heads=logits_heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="`*ForSequenceClassification`, several labels (`problem_type` single-label, "
    "multi-label or regression)",
    example="SamLowe/roberta-base-go_emotions",
    classifies=True,
    task="classify",
)
