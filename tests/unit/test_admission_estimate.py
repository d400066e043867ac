"""Admission as a pure decision over the queue, the measured rates and the deadline: every
time here is a number passed in (a fake clock), every rate one observed from those times or
set, so nothing depends on how fast the host runs."""

from __future__ import annotations

from ember.engine.admission import (
    FIT_SHARE,
    Batching,
    TextCost,
    Throughput,
    decide,
    fitting,
)

BATCH = Batching(size=32, tokens=8192)  # the defaults


def _rate(
    inputs_per_s: float | None = None,
    tokens_per_s: float | None = None,
    tokens_per_worker: float | None = None,
) -> Throughput:
    """Rates as measured (set, not observed): one worker unless said."""
    return Throughput(
        per_second=inputs_per_s,
        cost_per_second=tokens_per_s,
        cost_per_worker=tokens_per_worker or tokens_per_s,
    )


def test_one_batch_measures_one_worker_not_the_worker_count() -> None:
    rate = Throughput()
    assert rate.wait(10) is None and rate.batch_seconds(10) is None  # nothing measured
    rate.observe(inputs=32, started=0.0, ended=0.5)  # alone: 64/s, whatever the workers
    assert rate.per_second == 64 and rate.per_worker == 64
    rate.observe(inputs=0, started=1.0, ended=1.0)  # nothing ran: unchanged
    assert rate.wait(128) == 2.0 and rate.batch_seconds(32) == 0.5


def test_parallel_workers_count_as_far_as_they_overlapped() -> None:
    """Two batches of 32 side by side in 0.5 s: 128 inputs/s of wall time, 64 per worker.
    The second ends inside the time the first already covered, so it adds inputs only."""
    rate = Throughput()
    rate.observe(inputs=32, started=10.0, ended=10.5, cost=3200, representative=True)
    rate.observe(inputs=32, started=10.0, ended=10.5, cost=3200, representative=True)
    assert rate.per_second == 128 and rate.cost_per_second == 12800
    assert rate.per_worker == 64 and rate.cost_per_worker == 6400


def test_slower_concurrent_batches_lower_the_rate_the_host_gives() -> None:
    """A busy host: two workers that overlap but each take twice as long as one alone
    give the rate of one, not two (the old ``rate * workers`` said 128/s here)."""
    rate = Throughput()
    rate.observe(inputs=32, started=0.0, ended=0.5)  # warm-up, alone: 64/s
    for step in range(40):
        t = 1.0 + step
        rate.observe(inputs=32, started=t, ended=t + 1.0)
        rate.observe(inputs=32, started=t, ended=t + 1.0)
    assert abs(rate.per_second - 64) < 0.5 and abs(rate.per_worker - 32) < 0.5


def test_only_representative_batches_price_a_token() -> None:
    """A one-query batch is mostly a forward's fixed cost: a stream of them leaves the
    token rate that large batches were measured at, and before any there is none."""
    rate = Throughput()
    rate.observe(inputs=1, started=0.0, ended=0.002, cost=8)  # 4,000 tokens/s, if counted
    assert rate.cost_per_second is None and rate.cost_seconds([100.0], BATCH) is None
    rate.observe(inputs=32, started=1.0, ended=1.125, cost=4096, representative=True)
    assert rate.cost_per_second == 32768 == rate.cost_per_worker
    for step in range(50):
        rate.observe(inputs=1, started=2.0 + step, ended=2.002 + step, cost=8)
    assert rate.cost_per_second == 32768 == rate.cost_per_worker
    assert rate.cost_seconds([4096.0] * 8, BATCH) == 1.0


def test_characters_per_token_from_what_was_not_cut() -> None:
    cost = TextCost()
    assert cost.estimate([400], max_length=256) is None  # nothing measured: unknown
    # 400 characters made 100 tokens; the 5,000-character text was cut at 256: left out
    cost.observe(chars=[400, 5000], tokens=[100, 256], max_length=256)
    assert cost.chars_per_token == 4.0
    # each estimate is capped at the max length, and an empty text still costs a token
    assert cost.estimate([40, 401, 100_000, 0], max_length=256) == [10, 101, 256, 1]
    cost.observe(chars=[100] * 10, tokens=[50] * 10, max_length=256)  # 2 chars a token
    assert 2.0 < cost.chars_per_token < 4.0  # decayed: the newer request weighs more


def test_a_cold_server_admits_any_size_with_nothing_queued() -> None:
    """No representative batch measured yet: a request's own size is not judged."""
    assert (
        decide(0, 2048, 1.0, Throughput(), max_queued=4096, batch=BATCH, costs=[256.0] * 2048)
        is None
    )
    assert (
        decide(0, 2048, 1.0, _rate(inputs_per_s=10.0), max_queued=4096, batch=BATCH, costs=None)
        is None
    )


def test_a_request_that_alone_misses_its_deadline_is_told_how_many_fit() -> None:
    """The issue's case, on paper: 2,048 texts of 256 tokens on an idle server measured at
    10,000 tokens/s, 60 s deadline: 52 s of work, past the 48 s (0.8) it may use, whatever
    is queued. It is told how many fit in half the deadline: 1,171 (30 s x 10,000 / 256)."""
    rate = _rate(inputs_per_s=40.0, tokens_per_s=10_000.0)
    costs = [256.0] * 2048
    refused = decide(0, 2048, 60.0, rate, max_queued=4096, batch=BATCH, costs=costs)
    assert refused is not None and refused.status == 429
    assert "2048 inputs would take about 52.4s" in refused.reason
    assert "about 1171 of them fit" in refused.reason
    assert "requests of at most 1171 inputs" in refused.reason
    assert fitting(costs, 60.0 * FIT_SHARE, rate, BATCH) == 1171
    # The same request split as told is admitted on the idle server, and so is one of 47 s.
    assert decide(0, 1171, 60.0, rate, max_queued=4096, batch=BATCH, costs=costs[:1171]) is None
    assert decide(0, 1875, 60.0, rate, max_queued=4096, batch=BATCH, costs=costs[:1875]) is None
    # Short texts: 2,048 of 12 tokens are 2.5 s of work, admitted.
    assert decide(0, 2048, 60.0, rate, max_queued=4096, batch=BATCH, costs=[12.0] * 2048) is None


def test_a_request_of_one_batch_runs_at_one_workers_rate() -> None:
    """Two workers give 10,000 tokens/s together, 5,000 each. A request that fills one
    batch (32 x 256 tokens) runs on one worker: 1.6 s, not 0.8 s; past a 2 s deadline's
    1.6 s share. Half of 2 s at 5,000 tokens/s fits 19 of its inputs."""
    rate = _rate(tokens_per_s=10_000.0, tokens_per_worker=5_000.0)
    costs = [256.0] * 32
    assert rate.cost_seconds(costs, BATCH) == 8192 / 5000
    refused = decide(0, 32, 2.0, rate, max_queued=64, batch=BATCH, costs=costs)
    assert refused is not None and "about 19 of them fit" in refused.reason
    assert decide(0, 32, 2.1, rate, max_queued=64, batch=BATCH, costs=costs) is None
    # Many batches spread over both workers: the workers' rate together prices them.
    assert rate.cost_seconds([256.0] * 320, BATCH) == 320 * 256 / 10_000


def test_the_fitting_count_follows_each_inputs_cost() -> None:
    rate = _rate(tokens_per_s=100.0)
    assert fitting([100.0, 200.0, 300.0, 10.0], 3.0, rate, BATCH) == 2  # 300 tokens in 3 s
    assert fitting([400.0], 3.0, rate, BATCH) == 0
    refused = decide(0, 1, 2.0, rate, max_queued=64, batch=BATCH, costs=[400.0])
    assert refused is not None and "about 0 of them fit" in refused.reason


def test_more_inputs_than_the_queue_holds_is_413_not_429() -> None:
    """No wait makes room for a request larger than the queue: retrying cannot help."""
    refused = decide(0, 65, None, Throughput(), max_queued=64, batch=BATCH)
    assert refused is not None and refused.status == 413
    assert "65 inputs" in refused.reason and "--max-queue-size" in refused.reason
    full = decide(
        10, 60, None, Throughput(), max_queued=64, batch=BATCH
    )  # fits once the queue drains
    assert full is not None and full.status == 429 and "10 inputs are queued" in full.reason


def test_refuses_only_what_cannot_meet_its_deadline_behind_the_queue() -> None:
    rate = _rate(inputs_per_s=100.0)  # no token rate: its own inputs by count, as before
    assert decide(50, 25, 1.0, rate, max_queued=4096, batch=BATCH) is None  # 0.75 s
    # 0.82 s: inside the deadline, not inside the share of it the measured rate may use
    assert decide(50, 32, 1.0, rate, max_queued=4096, batch=BATCH) is not None
    refused = decide(90, 32, 1.0, rate, max_queued=4096, batch=BATCH)  # 1.22 s
    assert refused is not None and refused.status == 429
    assert "90 inputs are queued ahead" in refused.reason and "1.2s" in refused.reason
    # Nothing ahead and no token rate: a large request is admitted as before.
    assert decide(0, 4000, 1.0, rate, max_queued=4096, batch=BATCH) is None
    assert (
        decide(90, 32, 1.0, Throughput(), max_queued=4096, batch=BATCH) is None
    )  # nothing measured
    assert decide(90, 32, None, rate, max_queued=4096, batch=BATCH) is None  # no deadline (jobs)
    # With a token rate, its own part is priced by its tokens: 0.5 s ahead + 0.1 s own
    priced = _rate(inputs_per_s=100.0, tokens_per_s=1000.0)
    assert decide(50, 32, 1.0, priced, max_queued=4096, batch=BATCH, costs=[3.0] * 32) is None
    assert decide(50, 32, 1.0, priced, max_queued=4096, batch=BATCH, costs=[10.0] * 32) is not None
