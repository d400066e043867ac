"""Facts several families read from a transformers config: the task its architecture
has, a classifier's activation, the max length."""

from __future__ import annotations

from pathlib import Path

from ember.errors import ConfigError
from ember.models.spec import Activation, Task
from ember.models.st_files import read_json


def detect_task(config: dict) -> tuple[Task, int, dict[int, str]]:
    """Embedding unless the architecture is a sequence classifier (1 label: reranker).
    Labels come in id order, whatever order config.json lists them in."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    labels = ((int(k), str(v)) for k, v in (config.get("id2label") or {}).items())
    id2label = dict(sorted(labels))
    if arch.endswith("ForSequenceClassification"):
        num_labels = int(config.get("num_labels") or len(id2label) or 2)
        if num_labels == 1:
            return "rerank", 1, id2label
        return "classify", num_labels, id2label or {i: f"LABEL_{i}" for i in range(num_labels)}
    return "embed", 0, {}


_PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


def classifier_activation(config: dict, num_labels: int) -> Activation:
    """How label scores come from logits, as transformers' text-classification pipeline
    decides: a multi-label model scores each label on its own (sigmoid), a regression
    gives its values as they are, any other one several labels share (softmax)."""
    problem = config.get("problem_type")
    if problem is not None and problem not in _PROBLEM_TYPES:
        raise ConfigError(
            f"config.json problem_type {problem!r} is not one of {', '.join(_PROBLEM_TYPES)}"
        )
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def max_length(root: Path, hf_dir: Path, config: dict) -> int:
    st = read_json(root / "sentence_bert_config.json") or {}
    if st.get("max_seq_length"):
        return int(st["max_seq_length"])
    positions = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2  # RoBERTa's position ids start after the padding index
    tok = read_json(hf_dir / "tokenizer_config.json") or {}
    declared = tok.get("model_max_length")
    if isinstance(declared, (int, float)) and 0 < declared < positions:
        return int(declared)
    return positions
