"""The family registry: every kind of model Ember serves, one module each, listed once.

Detection asks the families in this order and the first whose files match serves the
model: the modules that are no transformer first (a Router, a table), then media models
by config.json, LLM rerankers, the encoder families with extra heads, and last the plain
ones by task (an encoder embeds; a sequence classifier with one label reranks, with
several classifies). Adding a family is one module here plus its tests
(docs/architecture.md, "Add a family").
"""

from __future__ import annotations

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles
from ember.families.bge_m3 import BGE_M3
from ember.families.classifier import CLASSIFIER
from ember.families.colbert import COLBERT
from ember.families.cross_encoder import CROSS_ENCODER
from ember.families.llm_reranker import LLM_RERANKER
from ember.families.logit_score import LLM_CROSS_ENCODER
from ember.families.router import ROUTERS
from ember.families.splade import SPLADE
from ember.families.static import SPARSE_STATIC, STATIC
from ember.families.text_encoder import DENSE
from ember.families.towers import TOWERS
from ember.families.vlm import VLMS
from ember.models.spec import Task

__all__ = ["FAMILIES", "Family", "ModelFiles", "by_name", "detect", "for_task"]

FAMILIES: tuple[Family, ...] = (
    *ROUTERS,
    STATIC,
    SPARSE_STATIC,
    *TOWERS,
    *VLMS,
    LLM_CROSS_ENCODER,
    LLM_RERANKER,
    BGE_M3,
    SPLADE,
    COLBERT,
    CROSS_ENCODER,
    CLASSIFIER,
    DENSE,
)
_BY_NAME = {family.name: family for family in FAMILIES}
assert len(_BY_NAME) == len(FAMILIES), "two families share a name"


def detect(files: ModelFiles) -> Family:
    """The family whose files these are."""
    for family in FAMILIES:
        if family.detect(files):
            return family
    model_type = files.config.get("model_type") or "?"
    media = ", ".join(f.title for f in FAMILIES if len(f.modalities) > 1)
    raise ConfigError(
        f"{model_type} has a vision or audio tower Ember does not serve yet; it serves {media}"
    )


def by_name(name: str) -> Family:
    return _BY_NAME[name]


def for_task(task: Task) -> Family:
    """The plain family of a coarse task (a model built in code without one)."""
    return next(f for f in (DENSE, CROSS_ENCODER, CLASSIFIER) if f.task == task)
