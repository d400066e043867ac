"""A sequence classifier with several labels: label scores by config.json's
``problem_type`` (softmax, a sigmoid per label, or a regression's raw values)."""

from __future__ import annotations

from ember.families.base import Family, lazy, plain
from ember.families.cross_encoder import logits_heads

CLASSIFIER = Family(
    name="classifier",
    title="classifier",
    backbone="sequence-classifier",
    outputs=("logits",),
    detect=plain("classify"),
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=logits_heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="`*ForSequenceClassification`, several labels (`problem_type` single-label, "
    "multi-label or regression)",
    example="SamLowe/roberta-base-go_emotions",
    classifies=True,
    task="classify",
)
