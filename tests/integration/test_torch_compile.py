"""`--torch-compile`: the compiled model gives the eager model's vectors and builds every
graph while loading, so no request waits for a recompilation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember.engine import SyncEngineArray
from tests.fixtures.tiny_models import build_tiny_embedder
from tests.texts import mixed_texts


@pytest.mark.slow
def test_compiled_matches_eager_and_never_recompiles_while_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    path = build_tiny_embedder(tmp_path / "embedder", pooling="mean")
    texts = mixed_texts(40)
    with SyncEngineArray(model_id=str(path), backend="torch", device="cpu") as eager:
        reference = eager.embed(texts)
        single_reference = eager.embed(texts[:1])
    with SyncEngineArray(model_id=str(path), device="cpu", torch_compile=True) as compiled:
        assert compiled.engines.get(None).backend.info.details["compiled"] == "true"
        # Serving must only reuse graphs built while loading: padded and unpadded batches
        # of many sizes, and a batch of one.
        monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
        graphs = counters["stats"]["unique_graphs"]
        ours = compiled.embed(texts)
        single = compiled.embed(texts[:1])
        assert counters["stats"]["unique_graphs"] == graphs > 0
    cosine = (ours * reference).sum(1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert float(cosine.min()) >= 0.9999
    np.testing.assert_allclose(single, single_reference, atol=1e-4)
