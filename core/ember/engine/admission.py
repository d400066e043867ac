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
    """Inputs answered per second by all forward workers (an EWMA over batches)."""

    per_second: float | None = None
    weight: float = 0.2  # of the newest batch

    def observe(self, inputs: int, seconds: float, workers: int) -> None:
        """One batch of ``inputs`` took ``seconds`` on one of ``workers`` parallel workers."""
        if inputs <= 0 or seconds <= 0:
            return
        rate = inputs / seconds * workers
        old = self.per_second
        self.per_second = rate if old is None else old + self.weight * (rate - old)

    def batch_seconds(self, inputs: int, workers: int) -> float | None:
        """Seconds one worker takes for a batch of ``inputs``; None before a measurement."""
        if self.per_second is None:
            return None
        return inputs * workers / self.per_second

    def wait(self, inputs: int) -> float | None:
        """Seconds to answer ``inputs`` at the measured rate; None before any measurement."""
        if self.per_second is None:
            return None
        return inputs / self.per_second


def refusal(queued: int, count: int, budget_s: float, throughput: Throughput) -> str | None:
    """Why a request of ``count`` inputs behind ``queued`` ones cannot meet a deadline
    ``budget_s`` away, or None to admit it. With nothing queued it is always admitted:
    its own size is the client's choice, and a retry would not help."""
    if queued <= 0:
        return None
    wait = throughput.wait(queued + count)
    if wait is None or wait <= budget_s:
        return None
    return (
        f"{queued} inputs are queued ahead, about {wait:.1f}s of work at the measured "
        f"{throughput.per_second:.0f} inputs/s, past this request's {budget_s:g}s deadline"
    )
