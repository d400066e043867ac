"""Which lane the next batch comes from: weighted fair share of the tokens forwarded,
with aging.

Each lane keeps an account of the tokens (a batch's padded cost) forwarded for it; the
next batch comes from the waiting lane whose account, over its weight, is least, the
sooner lane on a tie. Two rules keep that fair over time:

- a lane that had nothing waiting at the last pick starts level with the least of the
  waiting lanes (its account raised to theirs, never lowered): an idle lane banks no
  credit, so bulk coming back after an hour does not run a burst ahead of queries, and a
  query arriving alone ties and, as the sooner lane, goes first;
- every account decays by ``e`` per ``horizon_tokens`` forwarded (aging): a lane's use
  long ago stops counting against it, so its share follows the recent load.

So the interactive lane goes first whenever it is light, and under saturation each
waiting lane gets its weight's share of the tokens: with weights 9:3:1, bulk against a
flood of queries keeps 1/10. Nothing here reads a clock: the same picks and charges give
the same answers on any host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ember.lanes import WEIGHTS, Lane

# The accounts forget e of their weight per this many tokens forwarded: 32 full batches of
# the default 8,192 tokens, a few seconds of a busy CPU, a fraction of one of a GPU.
HORIZON_TOKENS = 262_144.0


@dataclass(frozen=True)
class LanePolicy:
    """How the lanes share a model: their weights (interactive, default, bulk) and the
    cap on a bulk batch's padded cost, so that a query arriving behind a running bulk
    batch waits at most about one such batch (no forward is pre-empted). None: no cap."""

    weights: tuple[float, float, float] = WEIGHTS
    bulk_batch_tokens: int | None = None
    horizon_tokens: float = HORIZON_TOKENS

    def batch_tokens(self, lane: Lane, max_batch_tokens: int) -> int:
        """The padded cost a batch of ``lane`` may reach."""
        if lane == Lane.BULK and self.bulk_batch_tokens is not None:
            return min(max_batch_tokens, self.bulk_batch_tokens)
        return max_batch_tokens


class Shares:
    """The lanes' decayed accounts of tokens forwarded, and the pick they decide."""

    def __init__(self, policy: LanePolicy | None = None) -> None:
        self.policy = policy or LanePolicy()
        self.accounts = [0.0] * len(Lane)
        self._waiting: frozenset[Lane] = frozenset()  # the lanes waiting at the last pick

    def _level(self, lane: Lane) -> float:
        return self.accounts[lane] / self.policy.weights[lane]

    def pick(self, waiting: Iterable[Lane]) -> Lane:
        """The lane the next batch comes from, of the lanes with work ``waiting``."""
        lanes = sorted(set(waiting))
        if not lanes:
            raise ValueError("no lane is waiting")
        staying = [lane for lane in lanes if lane in self._waiting]
        if staying:
            floor = min(self._level(lane) for lane in staying)
            for lane in lanes:
                if lane not in self._waiting:  # came back: level with the waiting ones
                    raised = floor * self.policy.weights[lane]
                    self.accounts[lane] = max(self.accounts[lane], raised)
        self._waiting = frozenset(lanes)
        least = min(self._level(lane) for lane in lanes)
        # the sooner lane on a tie: a lane just raised to the floor may differ by rounding
        return next(lane for lane in lanes if self._level(lane) <= least * (1 + 1e-9))

    def charge(self, lane: Lane, tokens: float) -> None:
        """A batch of ``lane`` costing ``tokens`` was formed: age every account, count it."""
        keep = math.exp(-tokens / self.policy.horizon_tokens)
        self.accounts = [account * keep for account in self.accounts]
        self.accounts[lane] += tokens

    def shares(self) -> list[float]:
        """Each lane's part of the tokens the accounts hold (what the pick balances)."""
        total = sum(self.accounts)
        return [account / total if total else 0.0 for account in self.accounts]
