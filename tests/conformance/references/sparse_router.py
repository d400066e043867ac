"""sparse-router: opensearch-neural-sparse-encoding-doc-v3-distill's layout (a SparseEncoder
Router: an IDF lookup for queries, DistilBERT's MLM head with SpladePooling for documents),
written by ``SparseEncoder.save``; reference: ``encode_query`` and ``encode_document``."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.static_models import build_inference_free_sparse

FAMILY = "sparse-router"
EXAMPLE = "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill"


def build(root: Path) -> Path:
    return build_inference_free_sparse(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    texts = list(kit.TEXTS)
    out = []
    for side, encode in (("query", model.encode_query), ("document", model.encode_document)):
        want = encode(texts, convert_to_tensor=True).to_dense().numpy()
        out.append(kit.embed(texts, want, kit.sparse, label=side, input_type=f"search_{side}"))
        out.append(kit.embed_sparse(texts, want, label=side, prompt_name=side))
    return out
