"""Models on demand (``ember.engine.residency``) with real models: three tiny models with
a small vocabulary (they load in tens of milliseconds), loaded on first use, evicted least
recently used, within --max-loaded and --memory-budget.

Nothing here depends on the host's speed: memory is compared with its own start, the
budget is probed after every request, and loads and evictions are counted."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ember.api.app import create_app
from ember.api.keys import hash_key
from ember.config import settings_from_env
from ember.engine.array import EngineArray
from ember.engine.memory import resident_bytes
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from tests.support import run_python

VOCAB = 2000  # MiniLM's first 2000 tokens: specials, characters and the commonest words
NAMES = ("embedder", "reranker", "classifier")


def _small_vocab(path: Path) -> Path:
    """``path``'s tokenizer cut to the first VOCAB tokens (the model was built for VOCAB)."""
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = {token: i for token, i in vocab.items() if i < VOCAB}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    lines = (path / "vocab.txt").read_text().splitlines()[:VOCAB]
    (path / "vocab.txt").write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tests.fixtures.tiny_models as tiny

    config = tiny._config
    root = tmp_path_factory.mktemp("on-demand")
    builders = (tiny.build_tiny_embedder, tiny.build_tiny_reranker, tiny.build_tiny_classifier)
    try:
        tiny._config = lambda **extra: config(**{**extra, "vocab_size": VOCAB})  # type: ignore[assignment]
        for name, build in zip(NAMES, builders, strict=True):
            _small_vocab(build(root / name))
    finally:
        tiny._config = config  # type: ignore[assignment]
    return root


# Every model here: the exact path on one forward thread, a small warm-up batch.
SERVING = dict(backend="onnx", dtype="float32", device="cpu", max_batch_tokens="1024")


def _array(models_dir: Path, **options: object) -> EngineArray:
    settings = settings_from_env(
        models_dir=str(models_dir), forward_workers=1, **SERVING, **options
    )
    return EngineArray.from_settings(settings)


async def _call(engines: EngineArray, name: str, keep_alive: float | None = None) -> None:
    """One request to ``name`` through the route's path: loaded on demand, then served."""
    engine = engines.get(name)
    async with engines.serving(engine, keep_alive) as engine:
        if name == "embedder":
            result = await engine.embed(EmbedRequest(["a short text"]))
        elif name == "reranker":
            result = await engine.rerank(RerankRequest("a query", ["one", "two"]))
        else:
            _, result = await engine.classify(ClassifyRequest(["a short text"]))
    assert result.output is not None


async def _cycles(models_dir: Path) -> dict[str, object]:
    """30 warm-up calls, then 200 more, the three models in turn with one loaded at a time:
    the resident bytes before and after the 200, and the loads counted."""
    engines = _array(models_dir, max_loaded=1)
    await engines.start()
    try:
        for i in range(30):  # a start: every library imported, every artifact built
            await _call(engines, NAMES[i % 3])
        start = resident_bytes()
        for i in range(200):
            await _call(engines, NAMES[i % 3])
        end = resident_bytes()
    finally:
        await engines.stop()
    loads = {n: int(engines.metrics.model_loads.labels(n, "ok")._value.get()) for n in NAMES}
    return {"start": start, "end": end, "loads": loads}


def test_200_loads_and_unloads_leave_memory_where_it_started(models_dir: Path) -> None:
    """Measured in a process of its own: in the suite's process, whatever earlier tests left
    (models, threads, freed arenas) moves the resident bytes by more than 3%."""
    lines = run_python("-m", "tests.integration.test_models_on_demand", str(models_dir))
    found = json.loads(lines[-1])
    start, end = found["start"], found["end"]
    assert sum(found["loads"].values()) == 230  # every call loaded its model
    assert end <= start * 1.03, f"{start} -> {end} bytes after 200 cycles"


def _write_catalogue(models_dir: Path, path: Path) -> Path:
    """The embedder pinned and eager, the reranker and classifier lazy."""
    path.write_text(
        f'[models.embedder]\nmodel_id = "{models_dir / "embedder"}"\npin = true\n'
        'load = "eager"\n'
        f'[models.reranker]\nmodel_id = "{models_dir / "reranker"}"\n'
        f'[models.classifier]\nmodel_id = "{models_dir / "classifier"}"\n'
    )
    return path


MODEL_BYTES = 1_000_000  # what the counting meter says each loaded model holds


def test_evictions_under_load_fail_nothing_keep_the_budget_and_the_pin(
    models_dir: Path, tmp_path: Path
) -> None:
    """Six clients, 120 requests in a seeded random order over three models, a budget two
    models fit in (the memory meter counts models: each holds MODEL_BYTES): every request
    answers, the budget holds at every turn of the loop, the pinned embedder never goes."""
    import random

    catalogue = _write_catalogue(models_dir, tmp_path / "models.toml")
    budget = int(2.5 * MODEL_BYTES)

    async def run() -> tuple[list[str], int]:
        engines = EngineArray.from_settings(
            settings_from_env(
                models_file=str(catalogue), memory_budget=str(budget), forward_workers=1, **SERVING
            )
        )
        residency = engines.residency
        residency.meter = lambda: MODEL_BYTES * sum(s.engine.ready for s in residency.slots)
        await engines.start()
        broken: list[str] = []
        done = asyncio.Event()

        async def probe() -> None:
            pinned = residency.named("embedder")
            while not done.is_set():
                if residency.resident_total() > budget:
                    broken.append(f"{residency.resident_total()} bytes resident")
                if pinned is None or pinned.status != "loaded":
                    broken.append("the pinned embedder is not loaded")
                await asyncio.sleep(0)

        rng = random.Random(7)
        order = [rng.choice(NAMES) for _ in range(120)]

        async def client(k: int) -> None:
            for name in order[k::6]:
                await _call(engines, name)

        watcher = asyncio.ensure_future(probe())
        try:
            await asyncio.gather(*(client(k) for k in range(6)))
        finally:
            done.set()
            await watcher
            await engines.stop()
        evictions = engines.metrics.model_evictions
        assert evictions.labels("embedder", "room")._value.get() == 0
        return broken, int(sum(evictions.labels(n, "room")._value.get() for n in NAMES))

    broken, evicted = asyncio.run(run())
    assert broken == []
    assert evicted > 0  # the budget made room more than once: the test saw evictions


def test_first_request_loads_once_and_keep_alive_zero_unloads(models_dir: Path) -> None:
    """Five requests at once to an unloaded model: one load, every request answered after
    it, ``load_seconds`` set; a request with ``keep_alive`` 0 unloads it when it ends."""

    async def run() -> None:
        engines = _array(models_dir)
        await engines.start()
        slot = engines.residency.named("reranker")
        assert slot is not None and slot.status == "unloaded" and slot.load_seconds is None
        try:
            await asyncio.gather(*(_call(engines, "reranker") for _ in range(5)))
            assert slot.status == "loaded" and slot.load_seconds and slot.load_seconds > 0
            assert slot.memory_bytes > 0 and slot.last_used is not None
            loads = engines.metrics.model_loads.labels("reranker", "ok")._value.get()
            assert loads == 1
            await _call(engines, "reranker", keep_alive=0)
            for _ in range(1000):  # the unload runs as its own task, after the request
                if slot.status == "unloaded":
                    break
                await asyncio.sleep(0.01)
            assert slot.status == "unloaded" and slot.memory_bytes == 0
        finally:
            await engines.stop()

    asyncio.run(run())


@pytest.fixture(scope="module")
def client(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("cat")
    catalogue = _write_catalogue(models_dir, folder / "models.toml")
    keys = folder / "keys.toml"
    keys.write_text(
        f'[[keys]]\nname = "ops"\nhash = "{hash_key(ADMIN)}"\nadmin = true\n'
        f'[[keys]]\nname = "app"\nhash = "{hash_key(USER)}"\n'
    )
    settings = settings_from_env(
        api_keys_file=str(keys),
        models_file=str(catalogue),
        max_loaded=2,
        **SERVING,
    )
    headers = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app(settings), headers=headers) as test_client:
        for _ in range(1000):  # the pinned embedder loads in the background
            if test_client.get("/ready").status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.01))
        yield test_client


ADMIN, USER = "admin-key-on-demand", "user-key-on-demand"


def _cards(client: TestClient) -> dict[str, dict]:
    return {card["id"]: card for card in client.get("/v1/models").json()["data"]}


def test_models_list_and_the_admin_routes(client: TestClient) -> None:
    assert client.get("/ready").status_code == 200  # the pinned model only
    cards = _cards(client)
    assert cards["embedder"]["status"] == "loaded" and cards["embedder"]["pinned"] is True
    assert cards["reranker"]["status"] == "unloaded" and cards["reranker"]["memory_bytes"] == 0
    assert cards["reranker"]["last_used"] is None and cards["reranker"]["load_seconds"] is None

    user = {"Authorization": f"Bearer {USER}"}
    assert client.post("/models/load", json={"model": "reranker"}, headers=user).status_code == 403
    loaded = client.post("/models/load", json={"model": "reranker"})
    assert loaded.json() == {"success": True, "model": "reranker", "status": "loaded"}
    card = _cards(client)["reranker"]
    assert card["memory_bytes"] > 0 and card["load_seconds"] > 0 and card["kind"]

    # a request to a lazy model loads it (max_loaded 2: the reranker makes room)
    answer = client.post("/classify", json={"model": "classifier", "input": ["fine"]})
    assert answer.status_code == 200, answer.text
    cards = _cards(client)
    assert cards["classifier"]["status"] == "loaded"
    assert cards["reranker"]["status"] == "unloaded"

    unloaded = client.post("/models/unload", json={"model": "classifier"})
    assert unloaded.json()["status"] == "unloaded"
    assert client.post("/models/unload", json={"model": "embedder"}).status_code == 400
    assert client.post("/models/load", json={"model": "nope"}).status_code == 400
    bad = client.post(
        "/v1/embeddings", json={"model": "embedder", "input": "x", "keep_alive": "5y"}
    )
    assert bad.status_code == 422
    metrics = client.get("/metrics").text
    assert 'ember_model_loads_total{model="classifier",outcome="ok"} 1.0' in metrics
    assert 'ember_model_evictions_total{model="reranker",reason="room"} 1.0' in metrics


def test_the_python_api_loads_a_catalogue_model_on_its_first_call(models_dir: Path) -> None:
    from ember.engine import SyncEngineArray

    with SyncEngineArray(models_dir=str(models_dir), **SERVING) as ember:
        assert ember.engines.residency.named("reranker").status == "unloaded"  # type: ignore[union-attr]
        scores = ember.rerank("a query", ["one", "two"], model="reranker")
        assert len(scores) == 2
        assert ember.engines.residency.named("reranker").status == "loaded"  # type: ignore[union-attr]


def test_a_load_drains_a_model_that_is_never_idle(models_dir: Path) -> None:
    """``--max-loaded 1``, three clients keep the embedder busy back to back; a reranker
    request still loads (the embedder drains: its new requests wait, then load it again)
    and answers while the embedder's clients have requests to go. Nothing fails."""

    async def run() -> tuple[int, int]:
        engines = _array(models_dir, max_loaded=1)
        await engines.start()
        done = {"embedder": 0}
        started = asyncio.Event()

        async def busy() -> None:
            for _ in range(40):
                await _call(engines, "embedder")
                done["embedder"] += 1
                if done["embedder"] == 5:
                    started.set()

        async def rerank() -> int:
            await started.wait()
            await _call(engines, "reranker")
            return done["embedder"]

        try:
            *_, at = await asyncio.gather(busy(), busy(), busy(), rerank())
        finally:
            await engines.stop()
        return at, done["embedder"]

    at, total = asyncio.run(run())
    assert total == 120 and at < total


if __name__ == "__main__":  # the 200-cycle measurement, in a process of its own
    print(json.dumps(asyncio.run(_cycles(Path(sys.argv[1])))))
