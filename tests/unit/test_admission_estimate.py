"""Admission by estimated wait: a pure decision over queued inputs and measured rate."""

from __future__ import annotations

from ember.engine.admission import Throughput, refusal


def test_throughput_is_an_average_over_batches_and_workers() -> None:
    rate = Throughput()
    assert rate.wait(10) is None  # nothing measured: nothing refused
    rate.observe(inputs=32, seconds=0.5, workers=2)  # 64/s on one worker, 128/s on two
    assert rate.per_second == 128
    rate.observe(inputs=16, seconds=0.5, workers=2)  # a 64/s batch moves it a fifth
    assert abs(rate.per_second - (128 + 0.2 * (64 - 128))) < 1e-9
    rate.observe(inputs=0, seconds=0.0, workers=2)  # nothing ran: unchanged
    assert abs(rate.wait(230.4) - 2.0) < 1e-9


def test_refuses_only_what_cannot_meet_its_deadline() -> None:
    rate = Throughput(per_second=100.0)
    assert refusal(queued=50, count=32, budget_s=1.0, throughput=rate) is None  # 0.82 s
    why = refusal(queued=90, count=32, budget_s=1.0, throughput=rate)  # 1.22 s
    assert why is not None and "90 inputs are queued" in why and "1.2s" in why
    # Nothing ahead: a large request is the client's own choice, admitted.
    assert refusal(queued=0, count=5000, budget_s=1.0, throughput=rate) is None
    assert refusal(queued=90, count=32, budget_s=1.0, throughput=Throughput()) is None
