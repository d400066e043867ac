"""ct2 on a decoder (Qwen3-Embedding, e5-mistral layouts): a one-line refusal at start that
names the family and the backend to use, before any conversion; and ``--backend auto``
never picks ct2 for one.

CTranslate2 converts a decoder, but into a Generator, which its Encoder then refuses with
"cannot be used as a sequence encoder": the server used to exit with that traceback after
a full conversion.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.backends import ct2_backend
from ember.backends.choice import choose_backend
from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from tests.fixtures.tiny_models import build_tiny_decoder_embedder
from tests.support import refused_start


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {f: build_tiny_decoder_embedder(root / f, f) for f in ("qwen3", "mistral")}


def test_serve_refuses_a_decoder_in_one_line(decoders: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    errors = refused_start(
        ["--model-id", str(decoders["qwen3"]), "--served-model-name", "qwen3-embedding"]
        + ["--backend", "ct2", "--cache-dir", str(cache)]
    )
    assert errors == [
        "ember: error: model 'qwen3-embedding' is a decoder, Qwen3Model (qwen3): ct2 runs "
        "encoders (bert, distilbert, roberta, xlm-roberta, camembert); use --backend torch "
        "or onnx"
    ]
    assert not any(cache.rglob("model.bin"))  # refused before converting anything


def test_mistral_is_refused_and_export_too(decoders: dict[str, Path], tmp_path: Path) -> None:
    model = resolve_model(ModelSpec(str(decoders["mistral"]), backend="ct2"))
    with pytest.raises(ConfigError, match=r"decoder, MistralModel \(mistral\): ct2 runs enc"):
        ct2_backend.load(model)
    with pytest.raises(ConfigError, match="use --backend torch or onnx"):
        ct2_backend.export(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options",
    [{}, {"device": "cpu"}, {"dtype": "int8"}, {"dtype": "bfloat16"}, {"device": "cuda"}],
)
def test_auto_never_picks_ct2_for_a_decoder(decoders: dict[str, Path], options: dict) -> None:
    for path in decoders.values():
        model = resolve_model(ModelSpec(str(path), **options))
        for accelerator in (None, "cuda"):
            assert choose_backend(model, accelerator).backend in ("torch", "onnx")
