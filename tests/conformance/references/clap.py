"""clap: an unfused ClapModel saved with its processor in laion/clap-htsat-unfused's layout;
reference: transformers' ``get_text_features`` / ``get_audio_features`` on the clips as
decoded at 48 kHz (tests/fixtures/media_references.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance import kit
from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_clap

FAMILY = "clap"
EXAMPLE = "laion/clap-htsat-unfused"


def build(root: Path) -> Path:
    return build_tiny_clap(root / "model")


def probes(path: Path) -> list[kit.Probe]:
    texts = list(kit.SHORT_TEXTS)
    uris, decoded = kit.clips()
    return [
        kit.embed(texts, ref.clap_text(path, texts)),
        kit.embed(uris, ref.clap_audio(path, decoded), modality="audio"),
    ]
