"""Admission by estimated wait: a pure decision over queued inputs and measured rate."""

from __future__ import annotations

from ember.engine.admission import Throughput, refusal


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
    rate.observe(inputs=32, started=10.0, ended=10.5)
    rate.observe(inputs=32, started=10.0, ended=10.5)
    assert rate.per_second == 128
    assert rate.per_worker == 64


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


def test_refuses_only_what_cannot_meet_its_deadline() -> None:
    rate = Throughput(per_second=100.0)  # set, as a measured figure
    assert refusal(queued=50, count=25, budget_s=1.0, throughput=rate) is None  # 0.75 s
    # 0.82 s: inside the deadline, not inside the share of it the measured rate may use
    assert refusal(queued=50, count=32, budget_s=1.0, throughput=rate) is not None
    why = refusal(queued=90, count=32, budget_s=1.0, throughput=rate)  # 1.22 s
    assert why is not None and "90 inputs are queued" in why and "1.2s" in why
    # Nothing ahead: a large request is the client's own choice, admitted.
    assert refusal(queued=0, count=5000, budget_s=1.0, throughput=rate) is None
    assert refusal(queued=90, count=32, budget_s=1.0, throughput=Throughput()) is None
