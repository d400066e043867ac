"""Overload gives 429, a failing batch fails only its own requests, and cancelled
requests never reach the backend — with the real MiniLM behind a wrapper that can be
slowed down or made to fail."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from ember.api.app import create_app
from ember.backends import load_backend
from ember.backends.base import BackendDefaults
from ember.batch import Outputs, TokenBatch
from ember.config import settings_from_env
from ember.engine import EmbedRequest, EngineArray
from ember.errors import BackendFailure, Overloaded, PayloadTooLarge
from ember.logs import REQUEST_ID
from ember.models.spec import ResolvedModel

POISON = "zebra"  # a text whose batch the wrapper fails
T = TypeVar("T")


class InstrumentedBackend(BackendDefaults):
    """The real backend, plus a delay, a poison pill and a record of what ran."""

    def __init__(self, model: ResolvedModel, delay: float) -> None:
        self.inner = load_backend(model)
        self.info = self.inner.info
        self.padding = self.inner.padding
        self.delay = delay
        self.seen: list[list[int]] = []
        self.poison_id: int | None = None
        self.lock = threading.Lock()

    def forward(self, batch: TokenBatch) -> Outputs:
        rows = [
            list(r[m.astype(bool)])
            for r, m in zip(batch.input_ids, batch.attention_mask, strict=True)
        ]
        with self.lock:
            self.seen.extend(rows)
        time.sleep(self.delay)
        if self.poison_id is not None and any(self.poison_id in r for r in rows):
            raise RuntimeError("injected failure")
        return self.inner.forward(batch)

    def close(self) -> None:
        self.inner.close()


def _engines(minilm_path: Path, delay: float, **options: str) -> tuple[EngineArray, list]:
    made: list[InstrumentedBackend] = []

    def loader(model: ResolvedModel) -> InstrumentedBackend:
        made.append(InstrumentedBackend(model, delay))
        return made[-1]

    # One forward worker: "queued behind a busy backend" is then deterministic.
    settings = settings_from_env(
        model_id=str(minilm_path), device="cpu", forward_workers=1, **options
    )
    return EngineArray(settings.model_specs(), backend_loader=loader), made


async def test_tiny_queue_answers_429_at_once(minilm_path: Path) -> None:
    engines, _ = _engines(minilm_path, delay=0.5, max_queue_size="2", max_batch_size="1")
    await engines.start()
    app = create_app(settings_from_env(model_id=str(minilm_path)), engines)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def post(text: str) -> httpx.Response:
                return await client.post("/v1/embeddings", json={"input": [text]})

            started = time.perf_counter()
            responses = await asyncio.gather(*(post(f"text {i}") for i in range(6)))
            codes = sorted(r.status_code for r in responses)
            refused = [r for r in responses if r.status_code == 429]
            assert codes.count(200) >= 2 and refused, codes
            body = refused[0].json()["error"]
            assert body["type"] == "rate_limit_error" and "queued" in body["message"]
            assert refused[0].headers["retry-after"] == "1"
            assert time.perf_counter() - started < 30  # refused, not hung
            assert (await post("after the burst")).status_code == 200
    finally:
        await engines.stop()


async def _as_request(request_id: str, call: Awaitable[T]) -> T:
    """``call`` as the HTTP edge runs it: in a task whose request id is set."""
    REQUEST_ID.set(request_id)  # gather's task has its own copy of the context
    return await call


async def test_failing_batch_fails_only_its_requests(
    minilm_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engines, made = _engines(minilm_path, delay=0.05, max_batch_size="1")
    await engines.start()
    engine = engines.get(None)
    backend = made[0]
    backend.poison_id = engine.processor.encode([POISON])[0].ids[1]
    try:
        results = await asyncio.gather(
            _as_request("fine-1", engine.embed(EmbedRequest(["fine one"]))),
            _as_request("poisoned", engine.embed(EmbedRequest([POISON]))),
            _as_request("fine-2", engine.embed(EmbedRequest(["fine two"]))),
            return_exceptions=True,
        )
        assert isinstance(results[1], BackendFailure) and "injected" in results[1].message
        assert not isinstance(results[0], Exception) and not isinstance(results[2], Exception)
        # The batch's log line names the request it failed, and only that one.
        failed = [r.getMessage() for r in caplog.records if "forward pass failed" in r.msg]
        assert len(failed) == 1 and failed[0].endswith("(requests poisoned)"), failed
        again = await engine.embed(EmbedRequest(["the engine still works"]))
        assert again.outputs.shape == (1, 384)
    finally:
        await engines.stop()


async def test_cancelled_request_never_reaches_backend(minilm_path: Path) -> None:
    engines, made = _engines(minilm_path, delay=0.6, max_batch_size="1")
    await engines.start()
    engine = engines.get(None)
    backend = made[0]
    marker = engine.processor.encode(["giraffe"])[0].ids[1]
    try:
        backend.seen.clear()
        first = asyncio.create_task(engine.embed(EmbedRequest(["occupies the backend"])))
        await asyncio.sleep(0.2)  # first batch is now in the forward pass
        doomed = asyncio.create_task(engine.embed(EmbedRequest(["giraffe"])))
        await asyncio.sleep(0.05)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        await first
        await engine.embed(EmbedRequest(["after"]))  # the batcher has moved past the cancelled item
        assert all(marker not in row for row in backend.seen)
        assert len(backend.seen) == 2
    finally:
        await engines.stop()


async def test_request_timeout_drops_queued_items(minilm_path: Path) -> None:
    engines, made = _engines(minilm_path, delay=0.8, max_batch_size="1")
    await engines.start()
    for engine in engines:  # after warm-up, which itself waits longer than this
        engine.spec = replace(engine.spec, request_timeout=0.3)
        # Admission believes the queue is fast (as after a slowdown it has not measured
        # yet), so the request is queued and expires there.
        engine.batcher.throughput.per_second = 1000.0
        engine.batcher.throughput.per_worker = 1000.0  # nor is a batch doomed before it runs
    engine = engines.get(None)
    marker = engine.processor.encode(["giraffe"])[0].ids[1]
    try:
        made[0].seen.clear()
        blocker = asyncio.create_task(engine.embed(EmbedRequest(["blocker"])))
        await asyncio.sleep(0.1)
        from ember.errors import RequestTimeout

        with pytest.raises(RequestTimeout):
            await engine.embed(EmbedRequest(["giraffe"]))
        await asyncio.gather(blocker, return_exceptions=True)  # it times out too
        await asyncio.sleep(1.0)  # let the forward thread drain
        assert all(marker not in row for row in made[0].seen)
        assert len(made[0].seen) == 1
    finally:
        await engines.stop()


async def test_overloaded_is_raised_by_the_batcher(minilm_path: Path) -> None:
    """A request larger than the queue can never fit: 413. One that fits an empty queue
    but not the one there is now: 429."""
    engines, _ = _engines(minilm_path, delay=0.3, max_queue_size="3")
    await engines.start()
    engine = engines.get(None)
    try:
        with pytest.raises(PayloadTooLarge):
            await engine.embed(EmbedRequest(["a", "b", "c", "d"]))
        queued = asyncio.create_task(engine.embed(EmbedRequest(["a", "b"])))
        await asyncio.sleep(0)  # admitted: 2 of 3 taken
        with pytest.raises(Overloaded):
            await engine.embed(EmbedRequest(["c", "d"]))
        await queued
    finally:
        await engines.stop()
