"""clip: a CLIPModel saved with its processor in openai/clip-vit-base-patch32's layout;
reference: transformers' ``get_text_features`` / ``get_image_features`` on the same
decoded images (tests/fixtures/media_references.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_clip

FAMILY = "clip"
EXAMPLE = "openai/clip-vit-base-patch32"


def build(root: Path) -> Path:
    return build_tiny_clip(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.SHORT_TEXTS)
    uris, decoded = kit.images()
    return [
        kit.embed(texts, ref.clip_text(path, texts)),
        kit.embed(uris, ref.clip_images(path, decoded), modality="image"),
    ]
