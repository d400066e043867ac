"""A sentence-transformers Transformer + Pooling (+ Dense, Normalize) model, or a plain
encoder with ``--pooling``: one pooled vector per text. The default family of an encoder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.families.base import Family, lazy, plain

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


def heads(model: ResolvedModel) -> dict[Output, Head]:
    """Pooling (its modes, with or without the prompt), then the Dense layers."""
    from ember.heads.build import projection
    from ember.heads.dense import DenseHead

    projections = tuple(projection(layer) for layer in model.dense_layers)
    return {"dense": DenseHead(model.poolings, model.include_prompt, projections)}


DENSE = Family(
    name="dense",
    title="text embedding",
    backbone="encoder",
    outputs=("dense",),
    detect=plain("embed"),
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="a Transformer + Pooling model (the default for an encoder; T5's encoder "
    "alone, as in GTR and sentence-T5; EmbeddingGemma's Gemma3; `--pooling` where it has no "
    "pooling config)",
    example="sentence-transformers/all-MiniLM-L6-v2",
    st_pipeline=True,
    routable=True,
)
