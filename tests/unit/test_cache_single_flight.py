"""Identical concurrent cache misses compute once (ember.engine.cache's flights): waiters take
the leader's result; a leader that fails or is cancelled leaves them to compute the input
themselves, never hanging and never handed its error; a cancelled waiter leaves the leader
alone; the flights table stays bounded and empties.

The stand-in compute waits on a gate the test opens once every request has claimed its
keys, so which call leads and which wait is decided by the test, not by timing."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from ember.engine.cache import EmbeddingCache, embed_through
from ember.engine.result import Result
from ember.errors import BadRequest
from ember.metrics import Metrics
from tests.unit.test_embedding_cache import OPTIONS, Recording, metric, row

N = 8
SETTLE = 200  # event-loop turns allowed for the requests to reach their awaits


class Gated(Recording):
    """``Recording`` whose calls wait for ``gate`` to open; the first ``failures`` calls
    then raise an error about their request (as an input error names its position)."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.failures = failures
        self.started = 0

    async def __call__(self, items: list) -> Result:
        self.started += 1
        await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise BadRequest("input 3: the leader's own request was refused")
        return await super().__call__(items)


def through(cache: EmbeddingCache, items: list, compute: Recording) -> asyncio.Task[Result]:
    return asyncio.ensure_future(embed_through(cache, "m", "m:id", items, OPTIONS, compute))


async def settle(condition) -> None:
    """Turn the event loop until ``condition()`` holds (bounded in turns, not in time)."""
    for _ in range(SETTLE):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the requests never reached the state the test waits for")


def counts(metrics: Metrics) -> tuple[float, float, float]:
    """(hits, misses, merged) counted for model m."""
    return tuple(  # type: ignore[return-value]
        metric(metrics, f'ember_cache_{kind}_total{{model="m"}}')
        for kind in ("hits", "misses", "merged")
    )


async def test_identical_concurrent_misses_compute_once_and_answer_the_same() -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 1 << 20, metrics), Gated()
    tasks = [through(cache, ["same text", f"own {i}"], compute) for i in range(N)]
    await settle(lambda: counts(metrics)[2] == N - 1)
    assert cache.flights == 1 + N  # "same text" once, each "own i" once
    compute.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    # the leader ran both of its inputs; each other request only its own one
    assert sorted(map(tuple, compute.calls)) == sorted(
        [("same text", "own 0"), *[(f"own {i}",) for i in range(1, N)]]
    )
    shared = {r.outputs[0].tobytes() for r in results}
    assert len(shared) == 1 and {r.input_tokens[0] for r in results} == {9}
    for i, result in enumerate(results):  # in order, each with its own second input
        own = f"own {i}"
        assert np.array_equal(result.outputs[1], row(len(own)) + np.float32(ord("o")))
        assert result.input_tokens[1] == len(own) and result.prompt_tokens == 9 + len(own)
    assert counts(metrics) == (0, 1 + N, N - 1)
    assert cache.flights == 0 and len(cache) == 1 + N
    again = await through(cache, ["same text"], compute)  # stored by the leader: a hit
    assert again.outputs[0].tobytes() in shared and counts(metrics)[0] == 1


async def test_the_same_input_twice_in_one_request_is_computed_once() -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 1 << 20, metrics), Recording()
    result = await through(cache, ["twice", "other", "twice"], compute)
    assert compute.calls == [["twice", "other"]]
    assert result.outputs[0].tobytes() == result.outputs[2].tobytes()
    assert result.input_tokens == [5, 5, 5] and result.prompt_tokens == 15
    assert counts(metrics) == (0, 2, 1) and cache.flights == 0


@pytest.mark.parametrize("ending", ["fails", "is cancelled"])
async def test_when_the_leader_fails_its_waiters_compute_themselves(ending: str) -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 1 << 20, metrics), Gated(failures=int(ending == "fails"))
    leader = through(cache, ["contested"], compute)
    await settle(lambda: compute.started == 1)
    waiters = [through(cache, ["contested"], compute) for _ in range(3)]
    await settle(lambda: counts(metrics)[2] == 3)
    if ending == "fails":
        compute.gate.set()
    else:
        leader.cancel()
    with pytest.raises(BadRequest if ending == "fails" else asyncio.CancelledError):
        await leader
    await settle(lambda: compute.started == 4)  # each waiter now computes on its own
    compute.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*waiters), 30)  # none hangs, none fails
    assert len({r.outputs.tobytes() for r in results}) == 1
    assert len(compute.calls) == 3  # the waiters' own runs (the leader's never finished)
    assert counts(metrics) == (0, 1 + 3, 3)  # a waiter that computes is a miss too
    assert cache.flights == 0 and len(cache) == 1


async def test_a_cancelled_waiter_leaves_the_leader_and_the_others_alone() -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 1 << 20, metrics), Gated()
    leader = through(cache, ["kept"], compute)
    await settle(lambda: compute.started == 1)
    quitter, stayer = through(cache, ["kept"], compute), through(cache, ["kept"], compute)
    await settle(lambda: counts(metrics)[2] == 2)
    quitter.cancel()
    await settle(quitter.done)
    compute.gate.set()
    first, second = await asyncio.wait_for(asyncio.gather(leader, stayer), 30)
    assert quitter.cancelled() and compute.started == 1
    assert first.outputs.tobytes() == second.outputs.tobytes()
    assert cache.flights == 0


async def test_the_flights_table_is_bounded_and_empties() -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(2, 1 << 20, metrics), Gated()
    wide = through(cache, ["a", "b", "c", "d"], compute)  # room for two flights
    await settle(lambda: compute.started == 1)
    assert cache.flights == 2
    late = through(cache, ["a", "c"], compute)  # waits on a; c has no flight: computed
    await settle(lambda: compute.started == 2)
    assert counts(metrics) == (0, 5, 1)
    compute.gate.set()
    await asyncio.wait_for(asyncio.gather(wide, late), 30)
    assert ["c"] in compute.calls and len(compute.calls) == 2 and cache.flights == 0
    failing = Gated(failures=50)
    failing.gate.set()
    for i in range(50):  # failed leaders leave nothing behind
        with pytest.raises(BadRequest):
            await through(cache, [f"bad {i}"], failing)
    assert cache.flights == 0


def test_a_waiter_on_another_event_loop_gets_the_leaders_result() -> None:
    """Engines sharing one cache may run on different loops (threads): a flight lands in
    the waiter's loop."""
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 1 << 20, metrics), Recording()
    started, release = threading.Event(), threading.Event()

    async def slow(items: list) -> Result:
        started.set()
        await asyncio.to_thread(release.wait, 30)
        return await compute(items)

    answers: dict[str, Result] = {}

    def lead() -> None:
        answers["leader"] = asyncio.run(embed_through(cache, "m", "m:id", ["x"], OPTIONS, slow))

    thread = threading.Thread(target=lead)
    thread.start()
    try:
        assert started.wait(30)

        async def wait_there() -> Result:
            waiter = through(cache, ["x"], compute)
            await settle(lambda: counts(metrics)[2] == 1)
            release.set()
            return await asyncio.wait_for(waiter, 30)

        answers["waiter"] = asyncio.run(wait_there())
    finally:
        release.set()
        thread.join(30)
    assert compute.calls == [["x"]]
    assert answers["waiter"].outputs.tobytes() == answers["leader"].outputs.tobytes()


async def test_waiters_get_a_result_too_large_to_keep() -> None:
    metrics = Metrics()
    cache, compute = EmbeddingCache(100, 64, metrics), Gated()  # no entry fits in 64 bytes
    leader = through(cache, ["big"], compute)
    await settle(lambda: compute.started == 1)
    waiter = through(cache, ["big"], compute)
    await settle(lambda: counts(metrics)[2] == 1)
    compute.gate.set()
    first, second = await asyncio.wait_for(asyncio.gather(leader, waiter), 30)
    assert first.outputs.tobytes() == second.outputs.tobytes() and len(compute.calls) == 1
    assert len(cache) == 0 and cache.flights == 0
