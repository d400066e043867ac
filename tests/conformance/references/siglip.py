"""siglip: a SiglipModel saved with its processor in google/siglip-base-patch16-224's
layout; reference: transformers' ``get_text_features`` (texts padded to 64 as its card
says) / ``get_image_features`` (tests/fixtures/media_references.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_siglip

FAMILY = "siglip"
EXAMPLE = "google/siglip-base-patch16-224"


def build(root: Path) -> Path:
    return build_tiny_siglip(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.TEXTS)  # the reference cuts at 64 tokens, as the processor does
    uris, decoded = kit.images()
    return [
        kit.embed(texts, ref.siglip_text(path, texts)),
        kit.embed(uris, ref.siglip_images(path, decoded), modality="image"),
    ]
