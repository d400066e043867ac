"""A SPLADE SparseEncoder: token states -> MLM head -> log(1 + relu) -> max over tokens,
one weight per vocabulary id."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


def heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.build import load_mlm_head
    from ember.heads.sparse import SpladeHead

    log_twice = model.sparse_activation == "log1p_relu"
    return {"sparse": SpladeHead(load_mlm_head(model), log_twice=log_twice)}


def detect(files: ModelFiles) -> bool:
    return files.modules.start is None and files.modules.mlm and files.task == "embed"


SPLADE = Family(
    name="splade",
    title="SPLADE",
    backbone="encoder",
    outputs=("sparse",),
    detect=detect,
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="a sentence-transformers `SparseEncoder` (`MLMTransformer` + `SpladePooling`)",
    example="naver/splade-v3",
    exportable=False,
    routable=True,
)
