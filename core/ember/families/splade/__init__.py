"""A SPLADE SparseEncoder: token states -> MLM head -> log(1 + relu) -> max over tokens,
one weight per vocabulary id."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy
from ember.models.spec import Facts, SparseActivation

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


@dataclass(frozen=True)
class SpladeFacts(Facts):
    """The family's facts: SpladePooling's activation, relu or OpenSearch's log1p_relu
    (log1p applied twice)."""

    activation: SparseActivation = "relu"


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    from ember.models.pipeline import resolve_pipeline

    model = resolve_pipeline(files, family)
    return replace(model, facts=SpladeFacts(files.modules.sparse_activation))


def heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.build import load_mlm_head
    from ember.heads.sparse import SpladeHead

    assert isinstance(model.facts, SpladeFacts)
    log_twice = model.facts.activation == "log1p_relu"
    return {"sparse": SpladeHead(load_mlm_head(model), log_twice=log_twice)}


def detect(files: ModelFiles) -> bool:
    return files.modules.start is None and files.modules.mlm and files.task == "embed"


SPLADE = Family(
    name="splade",
    title="SPLADE",
    backbone="encoder",
    outputs=("sparse",),
    detect=detect,
    resolve=resolve,
    heads=heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="a sentence-transformers `SparseEncoder` (`MLMTransformer` + `SpladePooling`)",
    example="naver/splade-v3",
    exportable=False,
    routable=True,
)
