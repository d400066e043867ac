"""The words model families are described in: backbones, modalities, outputs, scoring
and the capability names /v1/models lists.

The families themselves (what each is, how it is detected, its heads, processor and
backends) are ``ember.families``; this module is the vocabulary they and every other
layer share, and names no family.
"""

from __future__ import annotations

from typing import Literal

# What the network of a model computes, and so what a backend loads and returns:
# an encoder's token states, a sequence classifier's logits (ember.batch: Outputs), a
# dual encoder's projected embedding per input (CLIP, SigLIP, CLAP: one tower per
# modality), a retrieval VLM's projected token vectors (ColPali, ColQwen2), a static
# table of one vector or weight per token id and no network (StaticEmbedding,
# SparseStaticEmbedding: ember.backends.static_backend), or a sentence-transformers Router's
# routes, each with its own (the Router family's backend). A causal LM returns the
# logits of a few vocabulary rows at each input's last position (an LLM reranker's
# answer tokens: ember.backends.torch_causal).
Backbone = Literal[
    "encoder",
    "sequence-classifier",
    "dual-encoder",
    "retrieval-vlm",
    "token-table",
    "routes",
    "causal-lm",
]

# Backbones of media models: loaded by their own classes (each family's MediaFacts).
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


OUTPUT_NOUNS: dict[Output, str] = {
    "dense": "dense-embedding",
    "multi": "multi-vector",
    "sparse": "sparse",
    "logits": "classification",
}

MODALITY_NOUNS: dict[Modality, str] = {"text": "text", "image": "images", "audio": "audio"}
