"""colqwen2: a ColQwen2ForRetrieval over a tiny Qwen2-VL, saved with its processor as
vidore/colqwen2-v1.0-hf is; reference: transformers' ``ColQwen2ForRetrieval`` on
``process_queries`` / ``process_images`` of each input alone
(tests/fixtures/media_references.py), and MaxSim
of a text query over page images."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_colqwen2

FAMILY = "colqwen2"
EXAMPLE = "vidore/colqwen2-v1.0-hf"


def build(root: Path) -> Path:
    return build_tiny_colqwen2(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.SHORT_TEXTS)
    uris, decoded = kit.images()
    queries = ref.colqwen2_queries(path, texts)
    pages = ref.colqwen2_images(path, decoded)
    (query,) = ref.colqwen2_queries(path, [kit.QUERY])
    return [
        kit.embed(texts, queries, kit.multi_vectors),
        kit.embed_multi(texts, queries),
        kit.embed(uris, pages, kit.multi_vectors, modality="image"),
        kit.rerank(kit.QUERY, uris, [ref.maxsim(query, p) for p in pages], modality="image"),
    ]
