"""Priority lanes (``ember.lanes``, ``ember.engine.shares``): the claims and a key's
ceiling, lane order, the weighted shares and their aging, the bulk batch cap, and a split
request keeping its lane in every batch. Nothing here reads a clock: the shares count
tokens, and the batcher's order is fixed by when work is queued, not by how fast it runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ember.api.keys import hash_key, read_keys_file
from ember.api.middleware import lane_rule
from ember.engine.batcher import PADDING_CPU, Batcher, WorkItem, take_lane_batch
from ember.engine.shares import LanePolicy, Shares
from ember.errors import BadRequest, ConfigError
from ember.lanes import (
    LANE,
    RULE,
    Lane,
    LaneRule,
    bulk_by_default,
    claimed,
    current,
    from_priority,
    parse,
    serve,
)
from ember.metrics import Metrics

Q, D, B = Lane.INTERACTIVE, Lane.DEFAULT, Lane.BULK  # Q: the interactive (query) lane


@dataclass(frozen=True)
class Job:
    """A schedulable input: its cost, and which request it belongs to."""

    cost: int
    request: str
    key: None = None


def test_claims_read_vllm_priority_openai_tiers_and_the_header() -> None:
    assert [from_priority(p) for p in (-5, -1, 0, 1, 10)] == [Q, Q, D, B, B]
    assert [claimed(None, t) for t in ("priority", "default", "auto", "flex")] == [Q, D, D, B]
    assert claimed(-1, "flex") == B  # service_tier first
    assert claimed(None, None) is None
    words = ("interactive", " BULK ", "default", "priority", "flex", "-3", "0", "7")
    assert [parse(w, "X-Ember-Priority") for w in words] == [Q, B, D, Q, B, Q, D, B]
    with pytest.raises(BadRequest, match="X-Ember-Priority 'urgent' is not a lane"):
        parse("urgent", "X-Ember-Priority")


def test_a_keys_ceiling_caps_what_its_requests_claim(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[[keys]]\nname = "indexer"\nhash = "{hash_key("sk-bulk")}"\n'
        'priority = "bulk"\npriority_ceiling = "bulk"\n'
        f'[[keys]]\nname = "app"\nhash = "{hash_key("sk-app")}"\npriority = "interactive"\n'
        f'[[keys]]\nname = "batchy"\nhash = "{hash_key("sk-d")}"\npriority_ceiling = "default"\n'
    )
    bulk, app, batchy = (entry.lanes for entry in read_keys_file(path))
    assert [bulk.served(c) for c in (None, Q, D, B)] == [B, B, B, B]  # cannot claim sooner
    assert [app.served(c) for c in (None, Q, D, B)] == [Q, Q, D, B]  # may claim later
    assert [batchy.served(c) for c in (None, Q, D, B)] == [D, D, D, B]
    path.write_text(
        f'[[keys]]\nname = "odd"\nhash = "{hash_key("k")}"\n'
        'priority = "interactive"\npriority_ceiling = "bulk"\n'
    )
    with pytest.raises(ConfigError, match="sooner than priority_ceiling"):
        read_keys_file(path)


def test_the_header_is_the_default_under_the_keys_ceiling(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[[keys]]\nname = "k"\nhash = "{hash_key("k")}"\npriority_ceiling = "default"\n'
    )
    (entry,) = read_keys_file(path)

    class Key:  # what lane_rule reads of a key in force
        def __init__(self) -> None:
            self.entry = entry

    scope = {"headers": [(b"x-ember-priority", b"interactive")]}
    assert lane_rule(scope, None) == LaneRule(default=Q)
    assert lane_rule(scope, Key()).served(None) == D  # the header claims, the key caps it
    assert lane_rule({"headers": [(b"x-ember-priority", b"flex")]}, Key()).served(None) == B
    assert lane_rule({"headers": []}, None) == LaneRule()
    with pytest.raises(BadRequest):
        lane_rule({"headers": [(b"x-ember-priority", b"soon")]}, None)


def test_the_served_lane_rides_the_request_context_and_jobs_default_to_bulk() -> None:
    async def request(rule: LaneRule | None, claim: Lane | None) -> Lane:
        if rule is not None:
            RULE.set(rule)
        serve(claim)
        return current()

    async def main() -> None:
        assert current() == D  # outside any request: the default lane
        assert await asyncio.create_task(request(None, Q)) == Q
        assert await asyncio.create_task(request(LaneRule(ceiling=B), Q)) == B
        assert LANE.get() is None and current() == D  # each request's own context

        @bulk_by_default
        async def job(claim: Lane | None) -> Lane:
            return await asyncio.create_task(request(None, claim))

        assert await job(None) == B
        assert await job(Q) == Q  # a line that claims a lane keeps it
        assert current() == D

    asyncio.run(main())


def test_a_light_interactive_lane_goes_first_and_an_idle_lane_banks_no_credit() -> None:
    shares = Shares()
    for _ in range(50):  # bulk alone for a while
        assert shares.pick({B}) == B
        shares.charge(B, 2048)
    for _ in range(20):  # one query at a time, between bulk batches: it always goes first
        assert shares.pick({Q, B}) == Q
        shares.charge(Q, 16)
        assert shares.pick({B}) == B
        shares.charge(B, 2048)
    # the default lane, idle all along, comes back level with bulk (no burst of credit),
    # then gets its weight's share, 3 batches to bulk's 1
    order = []
    for _ in range(40):
        lane = shares.pick({D, B})
        shares.charge(lane, 2048)
        order.append(lane)
    assert order[0] == D  # a tie: the sooner lane
    assert order.count(D) == 30 and order.count(B) == 10
    assert all(order[k : k + 4].count(B) == 1 for k in range(0, 40, 4))  # interleaved


@pytest.mark.parametrize(
    ("weights", "bulk_share"), [((9.0, 3.0, 1.0), 0.1), ((4.0, 2.0, 1.0), 0.2)]
)
def test_bulk_keeps_its_weighted_share_under_an_interactive_flood(
    weights: tuple[float, float, float], bulk_share: float
) -> None:
    shares = Shares(LanePolicy(weights))
    tokens = {Q: 0.0, B: 0.0}
    for _ in range(5000):  # both lanes always waiting
        lane = shares.pick({Q, B})
        cost = 256 if lane == Q else 2048  # queries in small batches, bulk in capped ones
        shares.charge(lane, cost)
        tokens[lane] += cost
    assert tokens[B] / (tokens[Q] + tokens[B]) == pytest.approx(bulk_share, rel=0.05)


def test_aging_a_lanes_past_use_stops_counting_against_it() -> None:
    policy = LanePolicy(horizon_tokens=10_000)
    heavy, fresh = Shares(policy), Shares(LanePolicy(horizon_tokens=1e18))  # fresh: no aging
    for shares in (heavy, fresh):
        for _ in range(100):  # the default lane was busy
            shares.pick({D})
            shares.charge(D, 1000)
        for _ in range(100):  # then bulk alone, long after
            shares.pick({B})
            shares.charge(B, 100)
    # Aged: the default lane's old use has faded; it comes back level and goes first.
    assert heavy.pick({D, B}) == D
    # Without aging it would still owe for what it used long ago: bulk first.
    assert fresh.pick({D, B}) == B


def _work(loop: asyncio.AbstractEventLoop, jobs: list[tuple[int, Lane]]) -> list[WorkItem]:
    return [
        WorkItem(Job(cost, f"r{k}"), loop.create_future(), lane=lane)
        for k, (cost, lane) in enumerate(jobs)
    ]


def test_a_batch_holds_one_lane_and_bulk_batches_are_capped() -> None:
    loop = asyncio.new_event_loop()
    try:
        items = _work(loop, [(100, B)] * 6 + [(100, D)] * 3 + [(10, Q)])
        shares = Shares(LanePolicy(bulk_batch_tokens=250))
        lane, batch, rest = take_lane_batch(items, shares, 8192, 32, PADDING_CPU)
        assert lane == Q and batch == items[9:] and rest == items[:9]
        lane, batch, rest = take_lane_batch(rest, shares, 8192, 32, PADDING_CPU)
        assert lane == D and batch == items[6:9]  # the default lane: not capped
        lane, batch, rest = take_lane_batch(rest, shares, 8192, 32, PADDING_CPU)
        assert lane == B and batch == items[:2] and rest == items[2:6]  # 2 x 100 <= 250
        assert shares.policy.batch_tokens(B, 200) == 200  # never above --max-batch-tokens
    finally:
        loop.close()


def test_a_split_request_keeps_its_lane_in_every_batch_and_queries_cut_in() -> None:
    """A bulk request of 6 inputs runs 2 a batch; while its first batch runs, a query and a
    default-lane request arrive. Nothing is pre-empted: the query runs next, then the lanes
    share by weight (the default lane starts level with bulk, which has just run a batch,
    then 3 : 1), and every bulk batch holds bulk inputs only."""
    ran: list[list[str]] = []
    started, release = threading.Event(), threading.Event()

    def run(batch: Sequence[Job]) -> list[int]:
        ran.append([job.request for job in batch])
        if len(ran) == 1:
            started.set()
            release.wait(10)
        return [0] * len(batch)

    async def main() -> Metrics:
        metrics = Metrics()
        batcher = Batcher(
            run,
            name="m",
            max_batch_tokens=8192,
            max_batch_size=2,
            max_queue_size=100,
            metrics=metrics,
            lanes=LanePolicy(bulk_batch_tokens=4096),
        )
        batcher.start()
        try:
            bulk = batcher.submit([Job(64, "bulk")] * 6, lane=B)
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            query = batcher.submit([Job(8, "query")], lane=Q)
            default = batcher.submit([Job(64, "default")] * 6)  # no lane claimed
            release.set()
            await asyncio.gather(*bulk, *query, *default)
        finally:
            await batcher.stop()
        return metrics

    metrics = asyncio.run(main())
    assert ran[0] == ["bulk", "bulk"] and ran[1] == ["query"]
    assert all(len(set(batch)) == 1 for batch in ran)  # one request's lane per batch
    rest = [batch[0] for batch in ran[2:]]
    assert rest == ["default", "bulk", "default", "default", "bulk"]
    tokens = {
        lane: metrics.registry.get_sample_value(
            "ember_lane_tokens_total", {"model": "m", "lane": lane}
        )
        for lane in ("interactive", "default", "bulk")
    }
    assert tokens == {"interactive": 8, "default": 6 * 64, "bulk": 6 * 64}
    waited = metrics.registry.get_sample_value(
        "ember_lane_wait_seconds_count", {"model": "m", "lane": "bulk"}
    )
    assert waited == 6
    queued = metrics.registry.get_sample_value(
        "ember_lane_queued_tokens", {"model": "m", "lane": "bulk"}
    )
    assert queued == 0
