"""A sentence-transformers CrossEncoder's saved ``activation_fn``: what its relevance score
is of the logit. ``CrossEncoder.predict`` applies it, so a reranker saved with Identity
scores raw logits there, and must here too (a sigmoid over them would reorder nothing but
change every ``relevance_score`` a client thresholds on).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from ember.errors import ConfigError
from ember.models.spec import ScoreActivation
from ember.models.st_files import read_json

log = logging.getLogger(__name__)

# Whose scale a rerank answers in: "saved" is CrossEncoder.predict's (the files'
# activation_fn; vLLM's /score, Ember's own embedded API), "probability" is the rerank
# dialects' (Cohere documents relevance_score in [0, 1]; TEI and Infinity answer
# sigmoid(logit) unless raw_scores), whatever activation the files name.
RerankScale = Literal["saved", "probability"]

_ACTIVATIONS: dict[str, ScoreActivation] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.Identity": "none",
}


def saved_activation(root: Path, config: dict, trust_remote_code: bool) -> ScoreActivation:
    """The activation sentence-transformers 6.2 loads for a one-label CrossEncoder:
    config_sentence_transformers.json's ``activation_fn``, else config.json's
    ``sentence_transformers.activation_fn``, else the pre-4.0
    ``sbert_ce_default_activation_function``, else Sigmoid. A path outside torch is
    ignored by sentence-transformers without trust_remote_code, as here; a torch one Ember
    does not apply is refused at start rather than served with another score."""
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    hf = config.get("sentence_transformers") or {}
    legacy = config.get("sbert_ce_default_activation_function")
    for path in (st_cfg.get("activation_fn"), hf.get("activation_fn"), legacy):
        if not path:
            continue
        path = str(path)
        if path in _ACTIVATIONS:
            return _ACTIVATIONS[path]
        if path.startswith("torch.") or trust_remote_code:
            raise ConfigError(
                f"{root}: activation_fn {path}; Ember applies Sigmoid or Identity to a "
                "reranker's score (as CrossEncoder.predict does with those)"
            )
        log.warning(
            "%s: activation_fn %s is not trusted without --trust-remote-code; "
            "sentence-transformers then uses its default, as Ember does",
            root,
            path,
        )
    return "sigmoid"


def served_activation(saved: ScoreActivation, backbone: str, scale: RerankScale) -> ScoreActivation:
    """The activation a rerank answers with. A one-label sequence classifier (a
    cross-encoder such as ms-marco-MiniLM, saved with Identity) is a probability on the
    Cohere, TEI and Infinity routes; an LLM reranker's saved activation is its score on
    every route (its probability, or the logit difference it was saved to give)."""
    if scale == "probability" and backbone == "sequence-classifier":
        return "sigmoid"
    return saved
