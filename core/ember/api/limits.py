"""Per-key limits as pure state machines: a token bucket and a concurrency cap. No clock
of their own (the caller passes ``now``), so a unit test drives them without sleeping."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``. ``take`` spends before the work
    (a request: refused when short); ``charge`` spends after it (inputs and tokens, known
    only once the engine has counted them) and may drive the level below zero: the key is
    then refused until the debt is repaid, so one large request cannot pass the rate."""

    rate: float
    burst: float
    level: float = field(init=False)
    stamp: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.level = self.burst

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def take(self, amount: float, now: float) -> float:
        """Spend ``amount`` if the bucket holds it: 0.0; else spend nothing and return the
        seconds until it would."""
        self._refill(now)
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate

    def wait(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0.0 when it is not in debt)."""
        self._refill(now)
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def charge(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount


def retry_after(seconds: float) -> int:
    """``Retry-After`` in whole seconds (RFC 9110 delay-seconds), at least 1."""
    return max(1, math.ceil(seconds))
