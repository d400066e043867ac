"""colpali: a ColPaliForRetrieval over a tiny PaliGemma, saved with its processor as
vidore/colpali-v1.3-hf is; reference: transformers' ``ColPaliForRetrieval`` on ``process_queries`` /
``process_images`` of each input alone (tests/fixtures/media_references.py), and MaxSim
of a text query over page images."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_colpali

FAMILY = "colpali"
EXAMPLE = "vidore/colpali-v1.3-hf"


def build(root: Path) -> Path:
    return build_tiny_colpali(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.SHORT_TEXTS)
    uris, decoded = kit.images()
    queries = ref.colpali_queries(path, texts)
    pages = ref.colpali_images(path, decoded)
    (query,) = ref.colpali_queries(path, [kit.QUERY])
    return [
        kit.embed(texts, queries, kit.multi_vectors),
        kit.embed_multi(texts, queries),
        kit.embed(uris, pages, kit.multi_vectors, modality="image"),
        kit.rerank(kit.QUERY, uris, [ref.maxsim(query, p) for p in pages], modality="image"),
    ]
