"""The first model's load begun before the server's event loop runs (``ember serve``):
``EngineArray.begin_first_load`` starts it on a thread of its own, the app's start takes
it over (one load, not two), a stop before that closes what it built, and with a
``--memory-budget`` nothing begins early. Real tiny models; no timing is asserted."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ember.backends import load_backend
from ember.backends.base import Backend
from ember.config import settings_from_env
from ember.engine.array import EngineArray
from ember.engine.requests import ClassifyRequest, EmbedRequest
from ember.models.spec import ResolvedModel
from tests.support import run_python

SERVING = dict(backend="onnx", dtype="float32", device="cpu", max_batch_tokens="1024")


class Loads:
    """A backend loader that records each load (the model, its thread, whether an event
    loop ran there) and each close of what it built."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, str, bool]] = []
        self.closed: list[str] = []
        self.done = threading.Event()

    def __call__(self, model: ResolvedModel) -> Backend:
        try:
            asyncio.get_running_loop()
            in_loop = True
        except RuntimeError:
            in_loop = False
        backend = load_backend(model)
        close: Callable[[], None] = backend.close

        def closing() -> None:
            self.closed.append(model.served_name)
            close()

        backend.close = closing  # type: ignore[method-assign]
        self.loads.append((model.served_name, threading.current_thread().name, in_loop))
        self.done.set()
        return backend


def _array(embedder: Path, classifier: Path, loads: Loads, **options: object) -> EngineArray:
    settings = settings_from_env(
        model_id=f"{embedder};{classifier}",
        served_model_name="embedder;classifier",
        forward_workers=1,
        **SERVING,
        **options,
    )
    served = settings.catalogue()
    return EngineArray(
        [spec for spec, _ in served],
        backend_loader=loads,
        residences=[residence for _, residence in served],
        residency_limits=settings.residency_limits(),
    )


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_models import build_tiny_embedder

    return build_tiny_embedder(tmp_path_factory.mktemp("early-embedder"), pooling="mean")


def test_the_first_model_loads_before_the_loop_and_the_start_takes_it_over(
    embedder: Path, tiny_classifier_path: Path
) -> None:
    loads = Loads()
    engines = _array(embedder, tiny_classifier_path, loads)
    meters: list[int] = []  # the memory meter's readings: 1, 4, 9, 16 (thousand bytes)
    engines.residency.meter = lambda: meters.append(len(meters) + 1) or meters[-1] ** 2 * 1000
    engines.begin_first_load()
    assert loads.done.wait(120), "the early load never ran"
    # the first model only, on its load thread, with no event loop anywhere yet
    assert [(name, early) for name, _, early in loads.loads] == [("embedder", False)]
    assert loads.loads[0][1].startswith("load-")

    async def serve() -> None:
        await engines.start()
        try:
            embedded = await engines.get("embedder").embed(EmbedRequest(["an early load"]))
            assert embedded.output is not None
            _, classified = await engines.get("classifier").classify(ClassifyRequest(["x"]))
            assert classified.output is not None
        finally:
            await engines.stop()

    asyncio.run(serve())
    # taken over, not loaded again; the second model loaded by the start as before
    assert [name for name, _, _ in loads.loads] == ["embedder", "classifier"]
    # the early load measured from its own beginning (readings 1 -> 4), the next as before
    # (9 -> 16): the meter read once each side of each load, nothing more
    first, second = engines.residency.named("embedder"), engines.residency.named("classifier")
    assert first is not None and second is not None and first.load_seconds
    assert (first.measured_bytes, second.measured_bytes, len(meters)) == (3000, 7000, 4)
    assert sorted(loads.closed) == ["classifier", "embedder"]  # the stop closed both


def test_a_stop_before_the_start_closes_what_the_early_load_built(
    embedder: Path, tiny_classifier_path: Path
) -> None:
    loads = Loads()
    engines = _array(embedder, tiny_classifier_path, loads)
    engines.begin_first_load()
    asyncio.run(engines.stop())  # the server failed to start: the load is never taken over
    assert loads.done.wait(120)
    deadline = time.monotonic() + 60
    while not loads.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loads.closed == ["embedder"]


def test_with_a_memory_budget_nothing_loads_early(
    embedder: Path, tiny_classifier_path: Path
) -> None:
    loads = Loads()
    engines = _array(embedder, tiny_classifier_path, loads, memory_budget="4GB")
    engines.begin_first_load()
    assert all(engine.load_began is None for engine in engines.engines)

    async def start() -> None:
        await engines.start()
        await engines.stop()

    asyncio.run(start())
    assert [(name, early) for name, _, early in loads.loads] == [
        ("embedder", False),
        ("classifier", False),
    ]  # both by the start, in order (on load threads: no loop there either)


# Built and served as `ember serve` builds it (pydantic.v1 marked absent first) or as the
# platform adapters do: the answers (a bad input's error body too) and the schema printed.
APP = """
import json, sys, time
from fastapi.testclient import TestClient
if sys.argv[2] == "serve":
    from ember.cli import _without_pydantic_v1
    _without_pydantic_v1()
from ember.api.app import create_app
from ember.config import settings_from_env
with TestClient(create_app(settings_from_env(model_id=sys.argv[1], **{SERVING}))) as client:
    for _ in range(600):
        if client.get("/ready").status_code == 200:
            break
        time.sleep(0.1)
    answer = client.post("/v1/embeddings", json={{"input": ["a"], "model": "m"}})
    bad = client.post("/v1/embeddings", json={{"input": 3}})
    schema = client.get("/openapi.json")
print(json.dumps([answer.status_code, bad.status_code, bad.json(), schema.json()]))
print(sys.modules.get("pydantic.v1", "absent"))
"""


def _app_run(model: Path, how: str) -> list[str]:
    return run_python("-c", APP.format(SERVING=SERVING), str(model), how)[-2:]


def test_the_server_answers_the_same_without_pydantic_v1(embedder: Path) -> None:
    """FastAPI's routes, validation errors and OpenAPI schema with ``pydantic.v1`` absent
    (``ember serve`` marks it so: importing it was 0.1 s of a start) as with it."""
    served, served_v1 = _app_run(embedder, "serve")
    built, _ = _app_run(embedder, "adapter")
    assert served_v1 == "None"  # never imported: marked absent, and FastAPI took that
    assert served == built
    assert json.loads(served)[:2] == [200, 422]
