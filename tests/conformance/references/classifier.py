"""classifier: a multi-label RoBERTa, as SamLowe/roberta-base-go_emotions is
(``problem_type: multi_label_classification``), written by transformers'
``save_pretrained``; reference: transformers' ``pipeline("text-classification",
top_k=None)`` (a sigmoid per label)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.tiny_models import build_tiny_multilabel_classifier

FAMILY = "classifier"
EXAMPLE = "SamLowe/roberta-base-go_emotions"
MAX_LENGTH = 128  # RoBERTa's positions end 2 short of max_position_embeddings (130)


def build(root: Path) -> Path:
    return build_tiny_multilabel_classifier(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    from transformers import pipeline

    pipe = pipeline("text-classification", model=str(path), top_k=None, device="cpu")
    answers = pipe(list(kit.TEXTS), truncation=True, max_length=MAX_LENGTH)
    want = [{e["label"]: e["score"] for e in row} for row in answers]
    return [kit.classify(kit.TEXTS, want)]
