"""How long the queue ahead of a new request will take, from measured throughput.

A request whose inputs would not be answered before its deadline is refused on arrival
(429), rather than queued to time out later (504) after taking its turn from requests
that could have been served: under a flood with a short timeout, admitting by the count
of queued inputs alone completed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Throughput:
    """What the forward workers have been measured to do, as two rates.

    ``per_second``: inputs answered per second of wall time while any forward ran (decayed
    sums of inputs over the union of the forward intervals). Parallel workers count only
    as far as they were seen to overlap and still finish sooner: on a host whose other
    core is busy, two workers do little more than one, where one batch's rate times the
    worker count (the estimate before) assumed they did twice as much. ``per_worker``:
    inputs per second within one forward, for how long one more batch will take.
    """

    per_second: float | None = None
    per_worker: float | None = None
    weight: float = 0.2  # of the newest batch
    _inputs: float = 0.0
    _busy: float = 0.0
    _covered_until: float = float("-inf")

    def observe(self, inputs: int, started: float, ended: float) -> None:
        """One batch of ``inputs`` ran on one worker from ``started`` to ``ended``
        (``time.perf_counter``); batches may overlap and end in any order."""
        seconds = ended - started
        if inputs <= 0 or seconds <= 0:
            return
        busy = max(0.0, ended - max(started, self._covered_until))
        self._covered_until = max(self._covered_until, ended)
        # Older time fades as new time is covered; a batch inside time already covered
        # (a parallel worker's) adds its inputs to that stretch without fading it.
        keep = 1.0 - self.weight if busy > 0 else 1.0
        self._inputs = self._inputs * keep + inputs
        self._busy = self._busy * keep + busy
        if self._busy > 0:
            self.per_second = self._inputs / self._busy
        rate = inputs / seconds
        old = self.per_worker
        self.per_worker = rate if old is None else old + self.weight * (rate - old)

    def batch_seconds(self, inputs: int) -> float | None:
        """Seconds one worker takes for a batch of ``inputs``; None before a measurement."""
        if self.per_worker is None:
            return None
        return inputs / self.per_worker

    def wait(self, inputs: int) -> float | None:
        """Seconds to answer ``inputs`` at the measured rate; None before any measurement."""
        if self.per_second is None:
            return None
        return inputs / self.per_second


# Admit what the measured rate finishes within this share of the deadline. The rest covers
# what the rate does not measure (tokenising, serialising, the loop) and its noise: on a
# host busy with other work, the same 16-text request took 0.72-1.05 s run to run, and
# with the whole budget 2 of 6 admitted requests of a flood still expired.
BUDGET_SHARE = 0.8


def refusal(queued: int, count: int, budget_s: float, throughput: Throughput) -> str | None:
    """Why a request of ``count`` inputs behind ``queued`` ones cannot meet a deadline
    ``budget_s`` away, or None to admit it. With nothing queued it is always admitted:
    its own size is the client's choice, and a retry would not help."""
    if queued <= 0:
        return None
    wait = throughput.wait(queued + count)
    if wait is None or wait <= budget_s * BUDGET_SHARE:
        return None
    return (
        f"{queued} inputs are queued ahead, about {wait:.1f}s of work at the measured "
        f"{throughput.per_second:.0f} inputs/s, past what this request's {budget_s:g}s "
        "deadline leaves for it"
    )
