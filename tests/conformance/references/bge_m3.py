"""bge-m3: the files of BAAI/bge-m3 (an XLM-R encoder in pytorch_model.bin,
colbert_linear.pt, sparse_linear.pt, the sentence-transformers dense path); reference:
FlagEmbedding 1.4.2's ``BGEM3FlagModel.encode`` step by step
(``tests.fixtures.references.bge_m3_encode``: FlagEmbedding does not import on
transformers 5), its three outputs, and MaxSim over its ColBERT vectors. ``max_length``
is the model's 8192, as the model card calls ``encode`` (FlagEmbedding's own default is
512; the input past 512 tokens tells the two apart)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.references import bge_m3_encode, maxsim
from tests.fixtures.retrieval_models import BGE_M3_MAX_LENGTH, build_tiny_bge_m3

FAMILY = "bge-m3"
EXAMPLE = "BAAI/bge-m3"


def build(root: Path) -> Path:
    return build_tiny_bge_m3(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    want = bge_m3_encode(path, kit.TEXTS, BGE_M3_MAX_LENGTH)
    query = bge_m3_encode(path, [kit.QUERY], BGE_M3_MAX_LENGTH)["colbert_vecs"][0]
    docs = bge_m3_encode(path, kit.DOCUMENTS, BGE_M3_MAX_LENGTH)["colbert_vecs"]
    return [
        kit.embed(kit.TEXTS, want["dense_vecs"]),
        kit.embed_sparse(kit.TEXTS, want["lexical_weights"]),
        kit.embed_multi(kit.TEXTS, want["colbert_vecs"]),
        kit.rerank(kit.QUERY, kit.DOCUMENTS, [maxsim(query, d) for d in docs]),
    ]
