"""Limits that bound the same thing at two scopes, checked together as settings resolve.

A limit on one part above the limit on the whole it is part of can never be reached: with
``--max-media-bytes 200000000`` and the default 64 MiB ``--max-request-media-bytes``, a
184 MB item got 413 naming the request total, and nothing said so at start. Per pair,
when the part's limit is above the whole's:

- both set (flag or ``EMBER_*`` variable): refused, one line naming both;
- one set: the other, left at its default, follows it (raised or lowered to the same
  value) and one line says so.

A per-model limit (``--max-queue-size``) counts at its largest: ``--max-client-batch-size``
must fit at least one model's queue; a model given a smaller queue than the others is that
model's own choice, answered by its admission. Not paired, because each still holds:
``--media-fetch-timeout`` above ``--request-timeout`` (downloads also wait for slots, so
the request's deadline bounds them in any case), ``--max-request-fetches`` above
``--max-fetches`` (the rest wait), ``--max-image-pixels`` above ``--max-decoding-pixels``
(a larger image takes the whole budget), ``--max-media-bytes`` above ``--payload-limit``
(URLs are not in the body). Defaults never conflict (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ember.config_values import flag, split_values
from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.config import ServerSettings


@dataclass(frozen=True)
class Pair:
    """``part`` may not exceed ``whole``; ``why`` says what a higher ``part`` could not do."""

    part: str
    whole: str
    why: str


PAIRS = (
    Pair(
        "max_media_bytes",
        "max_request_media_bytes",
        "an item that large would be refused for the request's media bytes in all",
    ),
    Pair(
        "max_request_media_bytes",
        "max_fetched_bytes",
        "a request's media that large would pass the server-wide budget even on an idle server",
    ),
    Pair(
        "max_client_batch_size",
        "max_queue_size",
        "a request with that many inputs could never be queued: 429 however long it waited",
    ),
    Pair(
        "body_timeout",
        "body_total_timeout",
        "a body would be cut by the total first, never for stalling",
    ),
)


def _number(settings: ServerSettings, name: str) -> float | None:
    """The setting's value; a per-model one's largest (None when a value does not parse:
    the per-model checks refuse it later, naming it)."""
    value: Any = getattr(settings, name)
    if isinstance(value, str) or value is None:
        values = split_values(value) or [type(settings).model_fields[name].default]
        try:
            return max(int(v) for v in values)
        except ValueError:
            return None
    return float(value) if isinstance(value, float) else int(value)


def _shown(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _follow(settings: ServerSettings, name: str, value: float) -> str:
    """Give ``name`` ``value`` in its setting's type (a per-model one's is text, broadcast
    to every model); the value as shown."""
    annotation = type(settings).model_fields[name].annotation
    typed: Any = annotation(value) if annotation in (int, float) else str(int(value))
    setattr(settings, name, typed)
    return _shown(typed) if not isinstance(typed, str) else typed


def reconcile_limits(settings: ServerSettings, pairs: tuple[Pair, ...] = PAIRS) -> list[str]:
    """Check each pair of ``settings`` (changed in place where a default follows the other
    one); a line per change, or ConfigError for a pair that cannot hold."""
    given = settings.model_fields_set
    lines: list[str] = []
    for pair in pairs:
        part, whole = _number(settings, pair.part), _number(settings, pair.whole)
        if part is None or whole is None or part <= whole:
            continue
        if pair.part in given and pair.whole not in given:
            value = _follow(settings, pair.whole, part)
            lines.append(
                f"{flag(pair.whole)} raised from its default to {value} to match "
                f"{flag(pair.part)}; below it, {pair.why}"
            )
        elif pair.whole in given and pair.part not in given:
            value = _follow(settings, pair.part, whole)
            lines.append(
                f"{flag(pair.part)} lowered from its default to {value} to match "
                f"{flag(pair.whole)}; above it, {pair.why}"
            )
        else:
            raise ConfigError(
                f"{flag(pair.part)} {_shown(part)} is above {flag(pair.whole)} "
                f"{_shown(whole)}: {pair.why}; lower the first or raise the second"
            )
    return lines
