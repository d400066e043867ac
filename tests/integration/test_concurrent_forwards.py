"""Several forward workers run batches at the same time and still give the same vectors."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np

from ember.backends import load_backend
from ember.backends.base import BackendDefaults
from ember.config import settings_from_env
from ember.engine import EmbedRequest, EngineArray
from ember.models.spec import ResolvedModel


async def test_two_workers_overlap_and_match_one(minilm_path: Path) -> None:
    active, peak, lock = [0], [0], threading.Lock()

    class Tracking(BackendDefaults):
        def __init__(self, model: ResolvedModel) -> None:
            self.inner = load_backend(model)
            self.info = self.inner.info
            self.parallel_forwards = self.inner.parallel_forwards

        def forward(self, batch):  # type: ignore[no-untyped-def]
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                time.sleep(0.05)  # long enough for the other worker to start
                return self.inner.forward(batch)
            finally:
                with lock:
                    active[0] -= 1

        def close(self) -> None:
            self.inner.close()

    texts = [f"sentence number {i} about retrieval" for i in range(64)]
    settings = settings_from_env(  # float32: batch-invariant to 1e-5 on any CPU kind
        model_id=str(minilm_path),
        device="cpu",
        dtype="float32",
        forward_workers=2,
        max_batch_size="8",
    )
    engines = EngineArray(settings.model_specs(), backend_loader=Tracking)
    await engines.start()
    try:
        engine = engines.get(None)
        assert engine.batcher.workers == 2
        peak[0] = 0
        results = await asyncio.gather(
            *(engine.embed(EmbedRequest(texts[i : i + 8])) for i in range(0, 64, 8))
        )
        assert peak[0] == 2
        together = np.concatenate([r.outputs for r in results])
        alone = np.concatenate([(await engine.embed(EmbedRequest([t]))).outputs for t in texts[:8]])
        np.testing.assert_allclose(together[:8], alone, atol=1e-5)
    finally:
        await engines.stop()
