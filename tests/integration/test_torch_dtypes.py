"""The torch backend's reduced-precision paths, each with its stated tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ember.engine import SyncEngineArray
from tests.texts import mixed_texts

TEXTS = mixed_texts(50)


def _worst_cosine(ours: np.ndarray, ref: np.ndarray) -> float:
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu").encode(TEXTS, batch_size=16)


def test_bfloat16_on_cpu_within_tolerance(minilm_path: Path, reference: np.ndarray) -> None:
    """bf16 weights and activations: stated tolerance cosine >= 0.999 per text."""
    # Small batches keep warm-up cheap: CPUs without AVX512-BF16 emulate bf16 slowly.
    with SyncEngineArray(
        model_id=str(minilm_path), device="cpu", dtype="bfloat16", max_batch_tokens="1024"
    ) as ember:
        assert ember.engines.get(None).backend.info.dtype == "bfloat16"
        ours = ember.embed(TEXTS)
    assert _worst_cosine(ours, reference) >= 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_half_precision(minilm_path: Path, reference: np.ndarray, dtype: str) -> None:
    with SyncEngineArray(model_id=str(minilm_path), device="cuda", dtype=dtype) as ember:
        ours = ember.embed(TEXTS)
    assert _worst_cosine(ours, reference) >= 0.999
