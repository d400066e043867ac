"""Priority lanes: which lane a request is served in, for the layers below the HTTP edge.

A request claims a lane with vLLM's ``priority`` integer (lower is sooner), OpenAI's
``service_tier`` (``priority`` / ``default`` or ``auto`` / ``flex``) or the
``X-Ember-Priority`` header; its API key gives the lane of requests that claim none and a
ceiling, the soonest lane its requests may claim (a bulk key cannot claim the interactive
lane: its claim is lowered to the ceiling, and the served lane is echoed). The edge sets
the request's ``LaneRule`` here, the route resolves the body's claim against it, and the
engine hands the lane to the batcher (``ember.engine.shares`` schedules the lanes), as
``ember.callers`` carries the key: nothing is passed along.

A contract on the ground floor: the engine imports this module, never the HTTP layer.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import ParamSpec, TypeVar

from ember.errors import BadRequest

P = ParamSpec("P")
T = TypeVar("T")


class Lane(IntEnum):
    """Sooner lanes have lower values (as vLLM's ``priority``)."""

    INTERACTIVE = 0
    DEFAULT = 1
    BULK = 2

    @property
    def label(self) -> str:
        """The lane's name: in the header, the keys file and the metrics."""
        return self.name.lower()


LANE_NAMES = tuple(lane.label for lane in Lane)
# OpenAI's service tiers and the lane each is served in; the echo uses the first per lane.
TIERS: dict[str, Lane] = {
    "priority": Lane.INTERACTIVE,
    "default": Lane.DEFAULT,
    "auto": Lane.DEFAULT,
    "flex": Lane.BULK,
}
SERVED_TIER: dict[Lane, str] = {
    Lane.INTERACTIVE: "priority",
    Lane.DEFAULT: "default",
    Lane.BULK: "flex",
}
HEADER = "x-ember-priority"
# How the lanes share a saturated model (interactive, default, bulk): each waiting lane gets
# its weight's part of the tokens forwarded, so bulk under a flood of queries keeps 1/10.
WEIGHTS = (9.0, 3.0, 1.0)


def from_priority(value: int) -> Lane:
    """vLLM's ``priority`` (default 0; lower is sooner): below 0 interactive, 0 the default
    lane, above 0 bulk."""
    if value < 0:
        return Lane.INTERACTIVE
    return Lane.DEFAULT if value == 0 else Lane.BULK


def parse(value: str, where: str) -> Lane:
    """A lane named in text (the header, a keys file): a lane's name, an OpenAI service
    tier, or a vLLM priority integer; BadRequest naming ``where`` otherwise."""
    word = value.strip().lower()
    if word in LANE_NAMES:
        return Lane[word.upper()]
    if word in TIERS:
        return TIERS[word]
    try:
        return from_priority(int(word))
    except ValueError:
        names = "|".join((*LANE_NAMES, *TIERS))
        raise BadRequest(
            f"{where} {value!r} is not a lane: one of {names} or a vLLM priority integer",
            param=where,
        ) from None


def claimed(priority: int | None, service_tier: str | None) -> Lane | None:
    """The lane a body's fields claim (``service_tier`` first); None: no claim."""
    if service_tier is not None:
        return TIERS[service_tier]
    return None if priority is None else from_priority(priority)


@dataclass(frozen=True)
class LaneRule:
    """A request's lane when it claims none (``default``: its key's, or the header's) and
    the soonest lane it may claim (``ceiling``: its key's)."""

    default: Lane = Lane.DEFAULT
    ceiling: Lane = Lane.INTERACTIVE

    def served(self, claim: Lane | None) -> Lane:
        """The lane a request claiming ``claim`` is served in: never sooner than the ceiling."""
        return max(self.default if claim is None else claim, self.ceiling)


# Set by the edge per request (the key's rule, the header's claim as its default) and by
# the jobs (bulk by default); the route sets LANE from the body's claim against it.
# None: no rule set (the embedded API, a test), the default lane and no ceiling.
RULE: ContextVar[LaneRule | None] = ContextVar("ember_lane_rule", default=None)
LANE: ContextVar[Lane | None] = ContextVar("ember_lane", default=None)
OPEN = LaneRule()


def serve(claim: Lane | None) -> Lane:
    """Resolve the request's ``claim`` against its rule and serve it in that lane."""
    lane = (RULE.get() or OPEN).served(claim)
    LANE.set(lane)
    return lane


def current() -> Lane:
    """The lane the running request is served in (its rule's default if it claimed none)."""
    lane = LANE.get()
    return (RULE.get() or OPEN).served(None) if lane is None else lane


def bulk_by_default(job: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``job`` with its engine calls in the bulk lane unless they claim another (the
    corpus job, OpenAI batch files: nobody waits on a line)."""

    @functools.wraps(job)
    async def in_bulk(*args: P.args, **kwargs: P.kwargs) -> T:
        token = RULE.set(replace(RULE.get() or OPEN, default=Lane.BULK))
        try:
            return await job(*args, **kwargs)
        finally:
            RULE.reset(token)

    return in_bulk
