"""Whether a request can be answered before its deadline, decided as it arrives.

A request whose inputs would not be answered before its deadline is refused on arrival
(429), rather than queued to time out later (504) after taking its turn from requests
that could have been served: under a flood with a short timeout, admitting by the count
of queued inputs alone completed nothing. That holds for a request alone too: 2,048 long
texts on an idle CPU server were admitted and answered 504 after a minute of work. So a
request's own cost is estimated before any tokenising, from its inputs' character lengths
(``TextCost``) and the rate full batches were measured at (``Throughput``), and a request
that alone cannot finish is told how many of its inputs would (``decide``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Admit what the measured rate finishes within this share of the deadline. The rest covers
# what the rate does not measure (tokenising, serialising, the loop) and its noise: on a
# host busy with other work, the same 16-text request took 0.72-1.05 s run to run, and
# with the whole budget 2 of 6 admitted requests of a flood still expired.
BUDGET_SHARE = 0.8
# A request refused for its own size is told how many of its inputs the measured rate
# answers within this share of its deadline: on a 2-core host shared with other work the
# token rate moved 1.5x between one request and the next, and a client that splits as told
# should see its parts finish, not time out.
FIT_SHARE = 0.5


@dataclass
class UnionRate:
    """Work per second of wall time while any observed interval ran: decayed sums of work
    over the union of the intervals. Parallel workers count only as far as they were seen
    to overlap and still finish sooner."""

    weight: float = 0.2  # of the newest interval
    per_second: float | None = None
    _work: float = 0.0
    _busy: float = 0.0
    _covered_until: float = float("-inf")

    def observe(self, work: float, started: float, ended: float) -> None:
        busy = max(0.0, ended - max(started, self._covered_until))
        self._covered_until = max(self._covered_until, ended)
        # Older time fades as new time is covered; an interval inside time already covered
        # (a parallel worker's) adds its work to that stretch without fading it.
        keep = 1.0 - self.weight if busy > 0 else 1.0
        self._work = self._work * keep + work
        self._busy = self._busy * keep + busy
        if self._busy > 0:
            self.per_second = self._work / self._busy


@dataclass
class Throughput:
    """What the forward workers have been measured to do.

    ``per_second``: inputs answered per second of wall time while any forward ran. On a
    host whose other core is busy, two workers do little more than one, where one batch's
    rate times the worker count (the estimate before) assumed they did twice as much.
    ``per_worker``: inputs per second within one forward, for how long one more batch will
    take. ``cost_per_second``: cost (tokens; patches or frames) per second of wall time,
    from representative batches only: a one-query batch is mostly a forward's fixed cost,
    and a rate taken from such batches priced a 1,000-text request several times too high.
    ``cost_per_worker``: the same within one forward, for a request of one batch, which
    runs on one worker however many there are.
    """

    per_second: float | None = None
    per_worker: float | None = None
    cost_per_second: float | None = None
    cost_per_worker: float | None = None
    weight: float = 0.2  # of the newest batch
    _inputs: UnionRate = field(default_factory=UnionRate)
    _cost: UnionRate = field(default_factory=UnionRate)

    def observe(
        self,
        inputs: int,
        started: float,
        ended: float,
        *,
        cost: float = 0.0,
        representative: bool = False,
    ) -> None:
        """One batch of ``inputs`` (their real ``cost``) ran on one worker from ``started``
        to ``ended`` (``time.perf_counter``); batches may overlap and end in any order.
        ``representative``: large enough that its fixed cost is small beside its work."""
        seconds = ended - started
        if inputs <= 0 or seconds <= 0:
            return
        self._inputs.weight = self._cost.weight = self.weight
        self._inputs.observe(inputs, started, ended)
        self.per_second = self._inputs.per_second
        self.per_worker = self._moved(self.per_worker, inputs / seconds)
        if representative and cost > 0:
            self._cost.observe(cost, started, ended)
            self.cost_per_second = self._cost.per_second
            self.cost_per_worker = self._moved(self.cost_per_worker, cost / seconds)

    def _moved(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)

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

    def cost_seconds(self, costs: Sequence[float], batch: Batching) -> float | None:
        """Seconds to answer inputs of these estimated ``costs`` alone at the measured
        rates: all of them at the workers' rate together, but no sooner than their first
        batch takes on one worker. None before a representative batch was measured."""
        if not self.cost_per_second or not self.cost_per_worker:
            return None
        first = min(sum(costs[: batch.size]), batch.tokens)
        return max(sum(costs) / self.cost_per_second, first / self.cost_per_worker)


@dataclass(frozen=True)
class Batching:
    """The batcher's limits: a batch closes at ``size`` inputs or ``tokens`` of cost."""

    size: int
    tokens: int


@dataclass
class TextCost:
    """A text's cost (tokens) estimated from its length before it is tokenised, by the
    characters per token this model's tokenizer was seen to make (decayed sums over
    requests, so large requests weigh more than small ones). Inputs cut at the model's max
    length are left out of the measure: their characters say nothing of their tokens."""

    chars_per_token: float | None = None
    weight: float = 0.2  # of the newest request
    _chars: float = 0.0
    _tokens: float = 0.0

    def observe(self, chars: Sequence[int], tokens: Sequence[int], max_length: int) -> None:
        """A request's inputs were ``chars`` long and made ``tokens`` tokens each."""
        seen_chars = seen_tokens = 0
        for c, t in zip(chars, tokens, strict=False):
            if t < max_length:
                seen_chars += c
                seen_tokens += t
        if seen_tokens <= 0 or seen_chars <= 0:
            return
        keep = 1.0 - self.weight
        self._chars = self._chars * keep + seen_chars
        self._tokens = self._tokens * keep + seen_tokens
        self.chars_per_token = self._chars / self._tokens

    def estimate(self, chars: Sequence[int], max_length: int) -> list[float] | None:
        """Each input's estimated tokens (at most ``max_length``: longer ones are cut);
        None before a measurement."""
        ratio = self.chars_per_token
        if ratio is None:
            return None
        return [min(float(max_length), math.ceil(c / ratio) or 1.0) for c in chars]


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused at arrival, and with which status: 429 (now, or at this
    size) or 413 (never in one request)."""

    status: int
    reason: str


def fitting(costs: Sequence[float], seconds: float, throughput: Throughput, batch: Batching) -> int:
    """How many of the first inputs (of these ``costs``) the measured rates answer within
    ``seconds``, as ``Throughput.cost_seconds`` prices them, in one pass."""
    union, worker = throughput.cost_per_second, throughput.cost_per_worker
    if not union or not worker:
        return len(costs)
    total = first = 0.0
    for k, cost in enumerate(costs):
        total += cost
        if k < batch.size:
            first = min(first + cost, float(batch.tokens))
        if max(total / union, first / worker) > seconds:
            return k
    return len(costs)


def decide(
    queued: int,
    count: int,
    budget_s: float | None,
    throughput: Throughput,
    *,
    max_queued: int,
    batch: Batching,
    costs: Sequence[float] | None = None,
) -> Refusal | None:
    """Whether a request of ``count`` inputs (estimated ``costs`` each, when known) may join
    ``queued`` ones under a queue of ``max_queued`` and a deadline ``budget_s`` away, in
    batches of ``batch``; None admits it. A pure function of its arguments: nothing here
    reads a clock.

    - more inputs than the queue can ever hold: 413 (split it; retrying cannot help);
    - the queue full: 429 (retry later);
    - its own inputs alone past the share of the deadline at the measured rate, even with
      nothing ahead: 429 naming how many of them fit in ``FIT_SHARE`` of it, so the client
      can split it;
    - the queue ahead plus its own inputs past that share: 429 (retry later).

    With no representative rate measured yet (a cold server) or no cost estimate (media),
    its own size is not judged, as before."""
    if count > max_queued:
        return Refusal(
            413,
            f"this request has {count} inputs, more than the {max_queued} the model queues "
            "at once (--max-queue-size); send at most that many per request",
        )
    if queued + count > max_queued:
        return Refusal(429, f"{queued} inputs are queued (limit {max_queued}); retry later")
    if budget_s is None:
        return None
    limit = budget_s * BUDGET_SHARE
    own = None if costs is None else throughput.cost_seconds(costs, batch)
    if own is not None and own > limit:
        assert costs is not None and throughput.cost_per_second is not None
        fit = fitting(costs, budget_s * FIT_SHARE, throughput, batch)
        return Refusal(
            429,
            f"this request's {count} inputs would take about {own:.1f}s alone at the "
            f"measured {throughput.cost_per_second:.0f} tokens/s, past what its "
            f"{budget_s:g}s deadline allows; about {fit} of them fit in one request "
            f"with time to spare: split it into requests of at most {fit} inputs",
        )
    if queued <= 0:
        return None
    ahead = throughput.wait(queued)
    if ahead is None:
        return None
    own_wait = own if own is not None else throughput.wait(count)
    wait = ahead + (own_wait or 0.0)
    if wait <= limit:
        return None
    return Refusal(
        429,
        f"{queued} inputs are queued ahead, about {wait:.1f}s of work at the measured "
        f"{throughput.per_second:.0f} inputs/s, past what this request's {budget_s:g}s "
        "deadline leaves for it; retry later",
    )
