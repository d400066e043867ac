"""The family registry: every kind of model Ember serves, one package each, listed once.

Detection asks the families in this order and the first whose files match serves the
model: the modules that are no transformer first (a Router, a table), then media models
by config.json, LLM rerankers, the encoder families with extra heads, and last the plain
ones by task (an encoder embeds; a sequence classifier with one label reranks, with
several classifies). Adding a family is its package here, its row below and its tests
(docs/architecture.md, "Add a family"). ``ember.families.resolve`` turns a model's files
into a ``ResolvedModel`` through this registry.
"""

from __future__ import annotations

import copyreg

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles
from ember.families.bge_m3 import BGE_M3
from ember.families.classifier import CLASSIFIER
from ember.families.colbert import COLBERT
from ember.families.cross_encoder import CROSS_ENCODER
from ember.families.llm_cross_encoder import LLM_CROSS_ENCODER
from ember.families.llm_reranker import LLM_RERANKER
from ember.families.router import ROUTERS
from ember.families.splade import SPLADE
from ember.families.static import SPARSE_STATIC, STATIC
from ember.families.text_encoder import DENSE
from ember.families.towers import TOWERS
from ember.families.vlm import VLMS
from ember.models.spec import Task

__all__ = [
    "FAMILIES",
    "INSTRUCTIONS",
    "SCORE_MODULES",
    "Family",
    "ModelFiles",
    "by_name",
    "detect",
    "for_task",
]

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
# What a request's ``instruction`` is, in each instructed family's words (--help, API docs).
INSTRUCTIONS = ", ".join(f.instruction for f in FAMILIES if f.instruction is not None)
# The sentence-transformers modules families read their score from, by type name, with
# what each family calls such a model (ember.models.st_files reads them with these).
SCORE_MODULES: dict[str, str] = {
    f.score_module[0]: f.score_module[1] for f in FAMILIES if f.score_module is not None
}


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


def _pickled(family: Family) -> tuple[object, tuple[str]]:
    """A row pickles by name (its hooks are functions): a model crosses to an isolated
    build child (ember.backends.isolated) as the same registry row."""
    return by_name, (family.name,)


copyreg.pickle(Family, _pickled)


def for_task(task: Task) -> Family:
    """The plain family of a coarse task (a model built in code without one)."""
    return next(f for f in (DENSE, CROSS_ENCODER, CLASSIFIER) if f.task == task)
