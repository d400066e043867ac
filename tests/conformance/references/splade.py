"""splade: a SPLADE SparseEncoder (BertForMaskedLM, SpladePooling max), as naver/splade-v3
is, written by ``SparseEncoder.save``; reference: ``SparseEncoder.encode``."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures.references import splade_encode
from tests.fixtures.retrieval_models import build_tiny_splade

FAMILY = "splade"
EXAMPLE = "naver/splade-v3"


def build(root: Path) -> Path:
    return build_tiny_splade(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    want = splade_encode(path, kit.TEXTS)
    return [kit.embed(kit.TEXTS, want, kit.sparse), kit.embed_sparse(kit.TEXTS, want)]
