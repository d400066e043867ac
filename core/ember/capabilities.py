"""The capability table: per kind of model, its backbone, its outputs and what it serves.

One row per kind replaces the task switches that every layer once had: the resolver
detects the kind, backends load the row's backbone, the engine builds the row's
processor and heads, and the API asks the row whether a route is served. A new kind of
model is one row here (plus its heads and, for a new input kind, its processor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ember.errors import BadRequest

# What the network of a model computes, and so what a backend loads and returns:
# an encoder's token states, a sequence classifier's logits (ember.backends.base), a
# dual encoder's projected embedding per input (CLIP, SigLIP, CLAP: one tower per
# modality), a retrieval VLM's projected token vectors (ColPali, ColQwen2), a static
# table of one vector or weight per token id and no network (StaticEmbedding,
# SparseStaticEmbedding: ember.backends.static_backend), or a sentence-transformers Router,
# whose routes each have their own (ember.backends.router). A causal LM returns the
# logits of a few vocabulary rows at each input's last position (an LLM reranker's
# answer tokens: ember.backends.torch_causal).
Backbone = Literal[
    "encoder",
    "sequence-classifier",
    "dual-encoder",
    "retrieval-vlm",
    "static",
    "router",
    "causal-lm",
]

# Backbones of media models: loaded by their own classes; torch serves them all, onnx CLIP
# and SigLIP (ember.backends.registry: media_kinds).
MEDIA_BACKBONES: tuple[Backbone, ...] = ("dual-encoder", "retrieval-vlm")

# What a request's inputs hold (Infinity's ``modality``).
Modality = Literal["text", "image", "audio"]
MODALITIES: tuple[Modality, ...] = ("text", "image", "audio")

# What one input can come back as:
#   dense   one vector (pooled)            /v1/embeddings, /embed, /v2/embed
#   multi   one vector per token (ColBERT)  /v1/embeddings, /embed_all, MaxSim rerank
#   sparse  {index: weight} over the vocab  /v1/embeddings, /embed_sparse
#   logits  the classifier's raw logits      /rerank (cross-encoder), /classify
Output = Literal["dense", "multi", "sparse", "logits"]

# Capability names as /v1/models lists them (Infinity's names where it has one).
Capability = Literal[
    "embed", "embed_sparse", "embed_multi", "image_embed", "audio_embed", "rerank", "classify"
]

# How a model scores (query, document) pairs for /rerank: a classifier's logit, MaxSim,
# or an LLM's answer-token logits at the end of its prompt template.
Scoring = Literal["cross-encoder", "maxsim", "llm"]


@dataclass(frozen=True)
class ModelKind:
    name: str
    backbone: Backbone
    outputs: tuple[Output, ...]  # the heads it has, its default embedding first
    scoring: Scoring | None = None
    classifies: bool = False
    task: str = "embed"  # the coarse task of --task and /info (embed, rerank, classify)
    processor: str = "text"  # ember.processors.build_processor
    # Whether `ember export` can write it: an export holds the network and the files of a
    # dense, rerank or classify model, not the heads (projections, MLM head) beside it.
    exportable: bool = True
    # What its inputs may hold; every kind reads text, media models images or audio too.
    modalities: tuple[Modality, ...] = ("text",)
    # Whether a rerank request may carry an ``instruction`` (an LLM reranker's prompt).
    instructed: bool = False

    @property
    def embedding(self) -> Output | None:
        """What /v1/embeddings returns: the model's first embedding output."""
        return next((o for o in self.outputs if o != "logits"), None)

    @property
    def capabilities(self) -> list[Capability]:
        caps: list[Capability] = []
        if self.embedding is not None:  # /v1/embeddings serves it (Infinity lists any)
            caps.append("embed")
        if "sparse" in self.outputs:
            caps.append("embed_sparse")
        if "multi" in self.outputs:
            caps.append("embed_multi")
        if "image" in self.modalities:
            caps.append("image_embed")
        if "audio" in self.modalities:
            caps.append("audio_embed")
        if self.scoring is not None:
            caps.append("rerank")
        if self.classifies:
            caps.append("classify")
        return caps

    def does(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def serves(self) -> str:
        """What this kind serves, in words, for error messages."""
        words = {"dense": "dense embeddings", "sparse": "sparse embeddings"}
        parts = [words.get(o, "multi-vector embeddings") for o in self.outputs if o != "logits"]
        if len(self.modalities) > 1:
            parts = [
                f"{p} of {' and '.join(MODALITY_NOUNS[m] for m in self.modalities)}" for p in parts
            ]
        if self.scoring is not None:
            parts.append(f"reranking ({self.scoring})")
        if self.classifies:
            parts.append("classification")
        return ", ".join(parts)

    def require_output(self, output: Output, model_name: str) -> None:
        if output not in self.outputs:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) has no {OUTPUT_NOUNS[output]} head; "
                f"it serves {self.serves()}",
                param="model",
            )

    def require_modality(
        self, modality: Modality, model_name: str, param: str = "modality"
    ) -> None:
        if modality not in self.modalities:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not take {modality} input; it "
                f"serves {self.serves()}",
                param=param,
            )

    def require_scoring(self, model_name: str) -> Scoring:
        if self.scoring is None:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not rerank; it serves {self.serves()}",
                param="model",
            )
        return self.scoring

    def require_instruction(self, model_name: str) -> None:
        if not self.instructed:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) takes no instruction; `instruction` is "
                "for LLM rerankers",
                param="instruction",
            )

    def require_classify(self, model_name: str) -> None:
        if not self.classifies:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not classify; it serves {self.serves()}",
                param="model",
            )


OUTPUT_NOUNS: dict[Output, str] = {
    "dense": "dense-embedding",
    "multi": "multi-vector",
    "sparse": "sparse",
    "logits": "classification",
}

MODALITY_NOUNS: dict[Modality, str] = {"text": "text", "image": "images", "audio": "audio"}
TEXT_IMAGE: tuple[Modality, ...] = ("text", "image")
TEXT_AUDIO: tuple[Modality, ...] = ("text", "audio")
# What every media kind shares: the model's own processor, and no `ember export`.
MEDIA: dict[str, Any] = {"processor": "media", "exportable": False}

KINDS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        # A sentence-transformers (or plain) encoder with a pooling config.
        ModelKind("dense", "encoder", ("dense",)),
        # A PyLate ColBERT: token states -> Dense projection -> normalised vectors.
        ModelKind(
            "colbert",
            "encoder",
            ("multi",),
            scoring="maxsim",
            processor="colbert-text",
            exportable=False,
        ),
        # A SPLADE SparseEncoder: token states -> MLM head -> log(1 + relu) -> max.
        ModelKind("splade", "encoder", ("sparse",), exportable=False),
        # sentence-transformers StaticEmbedding (static-retrieval-mrl-en-v1, model2vec): the
        # mean of a vector per token id, its tokenizer without special tokens.
        ModelKind("static", "static", ("dense",), processor="static-text", exportable=False),
        # SparseStaticEmbedding: a weight per token id present (the IDF query side of the
        # OpenSearch inference-free sparse models).
        ModelKind(
            "sparse-static", "static", ("sparse",), processor="static-text", exportable=False
        ),
        # A sentence-transformers Router: queries and documents through routes of their own
        # (a StaticEmbedding or IDF query side, a transformer document side), picked by
        # input_type / prompt_name as ColBERT's sides are.
        ModelKind("router", "router", ("dense",), processor="router", exportable=False),
        ModelKind("sparse-router", "router", ("sparse",), processor="router", exportable=False),
        # BGE-M3: dense (CLS), sparse (sparse_linear) and ColBERT (colbert_linear) heads
        # over one forward; it reranks by MaxSim on its ColBERT vectors.
        ModelKind(
            "bge-m3", "encoder", ("dense", "sparse", "multi"), scoring="maxsim", exportable=False
        ),
        # CLIP and SigLIP: a text and an image tower into one space; CLAP: text and audio.
        # SigLIP's text is padded to its max length, as its processor documents
        # (ember.processors.media).
        *(
            ModelKind(name, "dual-encoder", ("dense",), **MEDIA, modalities=modalities)
            for name, modalities in (
                ("clip", TEXT_IMAGE),
                ("siglip", TEXT_IMAGE),
                ("clap", TEXT_AUDIO),
            )
        ),
        # ColPali and ColQwen2: page images and text queries as projected, normalised token
        # vectors; a text query reranks page images by MaxSim.
        *(
            ModelKind(name, "retrieval-vlm", ("multi",), "maxsim", **MEDIA, modalities=TEXT_IMAGE)
            for name in ("colpali", "colqwen2")
        ),
        ModelKind(
            "cross-encoder", "sequence-classifier", ("logits",), "cross-encoder", task="rerank"
        ),
        ModelKind(
            "classifier", "sequence-classifier", ("logits",), classifies=True, task="classify"
        ),
        # An LLM reranker (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma): its
        # prompt template around each pair, scored by its answer tokens' logits
        # (ember.models.llm_rerankers); the template lives in Ember, so no `ember export`.
        ModelKind(
            "llm-reranker",
            "causal-lm",
            ("logits",),
            "llm",
            task="rerank",
            processor="llm-rerank",
            exportable=False,
            instructed=True,
        ),
    )
}


def kind_for_task(task: str) -> ModelKind:
    """The plain kind for a coarse task (``--task``, or a model built without a kind)."""
    return KINDS[{"embed": "dense", "rerank": "cross-encoder", "classify": "classifier"}[task]]
