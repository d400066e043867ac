"""How a classifier's logits become label scores: decided from config.json alone, as
transformers' text-classification pipeline decides (``postprocess`` in
``pipelines/text_classification.py``), then applied in one place for every backend."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import ConfigError
from ember.models.facts import classifier_activation, detect_task
from ember.outputs import label_scores

SEQ = {"architectures": ["RobertaForSequenceClassification"]}


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "activation"),
    [
        ("multi_label_classification", 28, "sigmoid"),
        ("single_label_classification", 3, "softmax"),
        (None, 3, "softmax"),
        ("regression", 3, "none"),
        ("regression", 1, "none"),
        (None, 1, "sigmoid"),  # --task classify on a one-label model
        ("multi_label_classification", 1, "sigmoid"),
    ],
)
def test_activation_follows_the_pipeline(
    problem_type: str | None, num_labels: int, activation: str
) -> None:
    config = {**SEQ, "problem_type": problem_type}
    assert classifier_activation(config, num_labels) == activation


def test_an_unknown_problem_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="problem_type 'multi_label'.*regression"):
        classifier_activation({**SEQ, "problem_type": "multi_label"}, 3)


def test_one_label_stays_a_reranker_and_labels_come_in_id_order() -> None:
    assert detect_task({**SEQ, "num_labels": 1, "problem_type": "regression"})[0] == "rerank"
    shuffled = {**SEQ, "id2label": {"2": "c", "0": "a", "1": "b"}}
    task, count, id2label = detect_task(shuffled)
    assert (task, count, list(id2label.items())) == ("classify", 3, [(0, "a"), (1, "b"), (2, "c")])


def test_label_scores_apply_the_models_activation() -> None:
    logits = np.array([[2.0, -1.0, 0.5]])
    labels = {0: "a", 1: "b", 2: "c"}
    sig = label_scores(logits, labels, activation="sigmoid")[0]
    assert [e["label"] for e in sig] == ["a", "c", "b"]
    np.testing.assert_allclose([e["score"] for e in sig], 1 / (1 + np.exp(-np.array([2, 0.5, -1]))))
    none = label_scores(logits, labels, activation="none")[0]
    assert [e["score"] for e in none] == [2.0, 0.5, -1.0]
    soft = label_scores(logits, labels)[0]
    assert sum(e["score"] for e in soft) == pytest.approx(1.0)
    raw = label_scores(logits, labels, raw=True, activation="sigmoid")[0]
    assert [e["score"] for e in raw] == [2.0, 0.5, -1.0]
