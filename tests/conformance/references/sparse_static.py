"""sparse-static: a SparseEncoder that is one SparseStaticEmbedding (an IDF weight per
token), the query route of opensearch-neural-sparse-encoding-doc-v3-distill, written by
``SparseEncoder.save``; reference: ``SparseEncoder.encode``."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.static_models import build_idf_only

FAMILY = "sparse-static"
EXAMPLE = "opensearch-neural-sparse-encoding-doc-v3-distill's query route"


def build(root: Path) -> Path:
    return build_idf_only(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    want = model.encode(list(kit.TEXTS), convert_to_tensor=True).to_dense().numpy()
    return [kit.embed(kit.TEXTS, want, kit.sparse), kit.embed_sparse(kit.TEXTS, want)]
