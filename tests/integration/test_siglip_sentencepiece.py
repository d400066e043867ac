"""A SigLIP checkpoint as the hub ships it: its tokenizer is a SentencePiece model
(``spiece.model``), which transformers reads only with sentencepiece and protobuf, the
media extra's. Ember must load that tokenizer and embed text as transformers does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_tiny_siglip_sentencepiece

TEXTS = ["A photo of a Cat!", "two dogs playing in the snow", "the", "mixed CASE, punctuation..."]


def test_a_sentencepiece_siglip_embeds_text_as_transformers(tmp_path: Path) -> None:
    from ember.engine import SyncEngineArray

    path = build_tiny_siglip_sentencepiece(tmp_path / "siglip")
    assert (path / "spiece.model").is_file() and not (path / "tokenizer.json").exists()
    want = ref.siglip_text(path, TEXTS)
    with SyncEngineArray(model_id=str(path), backend="torch", device="cpu") as ember:
        (engine,) = ember.engines.engines
        tokenizer = engine.processor.tokenizer  # type: ignore[union-attr]
        assert type(tokenizer).__name__ == "SiglipTokenizer"
        assert tokenizer("A photo")["input_ids"][-1] == 1  # </s> appended, T5's id
        got = ember.embed(TEXTS)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)  # served normalised
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.9999, cos
