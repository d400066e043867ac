"""Retrieval VLMs, ColPali and ColQwen2: page images and text queries as projected,
normalised token vectors; a text query reranks page images by MaxSim. The shared media
processor (``ember.processors.media``) runs their text through the family's query path
(``queries.py``: the processor's prompt, cut before it is tokenised)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.families.base import Family, MediaFacts, ModelFiles, lazy
from ember.families.towers import MEDIA, TEXT_IMAGE

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


def token_vector_heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.media import TokenVectorsHead

    return {"multi": TokenVectorsHead()}


def architecture_is(architecture: str, model_type: str) -> Any:
    def detect(files: ModelFiles) -> bool:
        config = files.config
        return architecture in (config.get("architectures") or []) or (
            config.get("model_type") == model_type
        )

    return detect


# Texts through ``process_queries`` and images through ``process_images``.
QUERIES = lazy("ember.families.vlm.queries", "QueryPrompt")

_VLM: dict[str, Any] = {
    **MEDIA,
    "backbone": "retrieval-vlm",
    "outputs": ("multi",),
    "heads": token_vector_heads,
    "scoring": "maxsim",
    "modalities": TEXT_IMAGE,
    "backends": ("torch",),
}

COLPALI = Family(
    name="colpali",
    title="ColPali",
    detect=architecture_is("ColPaliForRetrieval", "colpali"),
    detected_by="`ColPaliForRetrieval`",
    example="vidore/colpali-v1.3-hf",
    media=MediaFacts("ColPaliForRetrieval", "ColPaliProcessor", queries=QUERIES),
    **_VLM,
)
COLQWEN2 = Family(
    name="colqwen2",
    title="ColQwen2",
    detect=architecture_is("ColQwen2ForRetrieval", "colqwen2"),
    detected_by="`ColQwen2ForRetrieval`",
    example="vidore/colqwen2-v1.0-hf",
    media=MediaFacts(
        "ColQwen2ForRetrieval", "ColQwen2Processor", queries=QUERIES, flat_patches=True
    ),
    **_VLM,
)
VLMS = (COLPALI, COLQWEN2)
