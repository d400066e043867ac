"""Several API keys from a TOML file (``--api-keys-file``), each with a name, the models and
routes it may use, rate limits, a concurrency cap and its own usage.

The file holds only each key's SHA-256 (``hash = "sha256:<hex>"``; ``ember keys hash``
makes one). A request's bearer token is hashed and looked up by that digest: the lookup's
timing depends on the digest of what the client sent, never on a prefix of a stored key,
and learning a stored digest does not give the key (SHA-256 is preimage-resistant); the
found digest is then compared with ``hmac.compare_digest`` all the same.

What is counted when:

- at the edge, before the body is read: the route (403), the concurrency cap, the inputs and
  tokens buckets' debt, then one token from the requests bucket (429 for each, naming it);
- after the engine served the request (``ember.callers.charge``): its inputs (texts, images,
  documents of a rerank, cache hits included) and their tokens, spent from the inputs and
  tokens buckets, which may go below zero: the key's next request waits until they refill;
- the model (403) when the engine picks it, after the body is parsed.

Reloads (the file's mtime polled at most once a second, or SIGHUP) build a new immutable
table and swap it in one assignment: requests in flight keep the key they started with; a
key whose entry did not change keeps its buckets; usage and in-flight counts stay per name.
A file that does not parse on reload is logged and the table in force stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from ember.api.limits import TokenBucket, retry_after
from ember.errors import ConfigError, Forbidden, RateLimited, Unauthorized
from ember.lanes import Lane, LaneRule
from ember.metrics import Metrics

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"
POLL_SECONDS = 1.0  # how often a request may stat the keys file: one stat a second at most
PLAIN_KEY_NAME = "--api-key"  # the one unnamed key of --api-key, as its usage label says
ADMIN_PATHS = frozenset({"/admin/usage", "/models/load", "/models/unload"})
UNAUTHORIZED = "missing or wrong API key: send `Authorization: Bearer <key>`"


def hash_key(key: str) -> str:
    """What the keys file stores for ``key``: ``sha256:`` and the hex digest of its UTF-8."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


LaneName = Literal["interactive", "default", "bulk"]


class KeyEntry(BaseModel):
    """One ``[[keys]]`` table of the file. Absent limits are no limit; a burst defaults to
    one second's worth of its rate (at least 1). ``priority``: the lane of the key's
    requests that claim none; ``priority_ceiling``: the soonest lane they may claim (a
    claim sooner is served there); absent, the default lane and no ceiling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    admin: bool = False
    models: tuple[str, ...] | None = None
    routes: tuple[str, ...] | None = None
    requests_per_second: float | None = Field(None, gt=0)
    requests_burst: float | None = Field(None, ge=1)
    inputs_per_second: float | None = Field(None, gt=0)
    inputs_burst: float | None = Field(None, ge=1)
    tokens_per_second: float | None = Field(None, gt=0)
    tokens_burst: float | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)
    priority: LaneName | None = None
    priority_ceiling: LaneName | None = None

    @model_validator(mode="after")
    def _lanes(self) -> KeyEntry:
        if self.priority is not None and Lane[self.priority.upper()] < self.lanes.ceiling:
            raise ValueError(
                f"priority {self.priority!r} is sooner than priority_ceiling "
                f"{self.priority_ceiling!r}: its own requests could not be served there"
            )
        return self

    @property
    def lanes(self) -> LaneRule:
        """The key's lane rule (``ember.lanes``)."""
        ceiling = Lane[(self.priority_ceiling or "interactive").upper()]
        default = Lane[(self.priority or "default").upper()]
        return LaneRule(default=max(default, ceiling), ceiling=ceiling)


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeyEntry]

    @model_validator(mode="after")
    def _unique(self) -> KeysFile:
        for attr in ("name", "hash"):
            seen: set[str] = set()
            for entry in self.keys:
                value = getattr(entry, attr)
                if value in seen:
                    shown = value if attr == "name" else f"of key {entry.name!r}"
                    raise ValueError(f"two keys have the same {attr} {shown}")
                seen.add(value)
        return self


def read_keys_file(path: Path) -> list[KeyEntry]:
    """The file's entries, or ConfigError saying what is wrong with it."""
    try:
        raw = tomllib.loads(path.read_text())
        return KeysFile.model_validate(raw).keys
    except OSError as exc:
        raise ConfigError(f"--api-keys-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--api-keys-file {path} is not valid TOML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise ConfigError(f"--api-keys-file {path}: {problems}") from None


def _bucket(rate: float | None, burst: float | None) -> TokenBucket | None:
    return None if rate is None else TokenBucket(rate, burst or max(1.0, rate))


class KeyUsageReport(BaseModel):
    requests: int = Field(description="Requests answered, every status.")
    inputs: int = Field(description="Inputs the engine served (cache hits included).")
    tokens: int
    statuses: dict[str, int] = Field(description="Requests by answer status.")
    errors: dict[str, int] = Field(description="Requests answered 4xx or 5xx, by status.")
    in_flight: int
    active: bool = Field(description="False once a reload revoked the key.")


class UsageReport(BaseModel):  # GET /admin/usage
    keys: dict[str, KeyUsageReport]


@dataclass
class KeyUsage:
    """One key name's counts since the server started, across reloads."""

    requests: int = 0
    inputs: int = 0
    tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0

    def report(self, active: bool) -> KeyUsageReport:
        errors = {s: n for s, n in sorted(self.statuses.items()) if int(s) >= 400}
        return KeyUsageReport(
            requests=self.requests,
            inputs=self.inputs,
            tokens=self.tokens,
            statuses=dict(sorted(self.statuses.items())),
            errors=errors,
            in_flight=self.in_flight,
            active=active,
        )


class Key:
    """A key in force: its entry, its buckets and its usage. The request's
    ``ember.callers.Caller`` while it is served."""

    def __init__(
        self,
        entry: KeyEntry,
        usage: KeyUsage,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entry = entry
        self.name = entry.name
        self.digest = entry.hash.removeprefix(HASH_PREFIX)
        self.usage = usage
        self.clock = clock
        self.models = None if entry.models is None else frozenset(entry.models)
        self.routes = None if entry.routes is None else frozenset(entry.routes)
        self.requests = _bucket(entry.requests_per_second, entry.requests_burst)
        self.inputs = _bucket(entry.inputs_per_second, entry.inputs_burst)
        self.tokens = _bucket(entry.tokens_per_second, entry.tokens_burst)
        self._metrics = metrics
        self._answers: dict[int, Any] = {}  # status -> its counter: labels() takes a lock
        self._inputs_total = metrics.key_inputs.labels(self.name)
        self._tokens_total = metrics.key_tokens.labels(self.name)
        self._in_flight = metrics.key_in_flight.labels(self.name)

    def _refuse(self, limit: str, detail: str, wait: float) -> RateLimited:
        self._metrics.key_rate_limited.labels(self.name, limit).inc()
        after = retry_after(wait)
        return RateLimited(
            f"API key {self.name!r} is over its {limit} limit ({detail}); retry after {after}s",
            after,
        )

    def admit(self, path: str) -> None:
        """Let one request to ``path`` in, or raise (403 route, 429 limit). Admitted, it
        counts as in flight until ``finish``."""
        if path in ADMIN_PATHS:
            if not self.entry.admin:
                raise Forbidden(f"API key {self.name!r} is not an admin key: {path} needs one")
        elif self.routes is not None and path not in self.routes:
            raise Forbidden(
                f"API key {self.name!r} may not use {path}; its routes: "
                f"{', '.join(sorted(self.routes))}"
            )
        cap = self.entry.max_concurrent
        if cap is not None and self.usage.in_flight >= cap:
            # A place frees when any of the key's requests ends, typically within
            # milliseconds; Retry-After's least value (whole seconds) is 1, and an estimate
            # from the key's own request times would differ only for requests over 1 s.
            raise self._refuse("max_concurrent", f"{cap} requests at once", 1.0)
        now = self.clock()
        debts = (("inputs_per_second", self.inputs), ("tokens_per_second", self.tokens))
        for limit, bucket in debts:
            if bucket is not None and (wait := bucket.wait(now)) > 0:
                raise self._refuse(limit, f"{bucket.rate:g}/s, burst {bucket.burst:g}", wait)
        if self.requests is not None and (wait := self.requests.take(1, now)) > 0:
            rate, burst = self.requests.rate, self.requests.burst
            raise self._refuse("requests_per_second", f"{rate:g}/s, burst {burst:g}", wait)
        self.usage.in_flight += 1
        self._in_flight.inc()

    def finish(self, status: int, admitted: bool) -> None:
        """Count the request's answer; release its place if ``admit`` let it in."""
        if admitted:
            self.usage.in_flight -= 1
            self._in_flight.dec()
        code = str(status)
        self.usage.requests += 1
        self.usage.statuses[code] = self.usage.statuses.get(code, 0) + 1
        counter = self._answers.get(status)
        if counter is None:
            counter = self._answers[status] = self._metrics.key_requests.labels(self.name, code)
        counter.inc()

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def check_model(self, model: str) -> None:
        if not self.may_use(model):
            raise Forbidden(
                f"API key {self.name!r} may not use model {model!r}; its models: "
                f"{', '.join(sorted(self.models))}",
                param="model",
            )

    def charge(self, inputs: int, tokens: int) -> None:
        self.usage.inputs += inputs
        self.usage.tokens += tokens
        self._inputs_total.inc(inputs)
        self._tokens_total.inc(tokens)
        now = self.clock()
        if self.inputs is not None:
            self.inputs.charge(inputs, now)
        if self.tokens is not None:
            self.tokens.charge(tokens, now)


def _mtime(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class KeyStore:
    """The keys in force: an immutable table by digest, swapped whole on reload."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        path: Path | None = None,
        plain_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.path = path
        self.plain_key = plain_key
        self.clock = clock
        self.usage: dict[str, KeyUsage] = {}
        self.table: Mapping[str, Key] = MappingProxyType({})
        self._seen = _mtime(path) if path is not None else None
        self._polled = clock()
        self._install(read_keys_file(path) if path is not None else [])

    def _entries(self, entries: list[KeyEntry]) -> list[KeyEntry]:
        if self.plain_key is None:
            return entries
        # --api-key: one more key, unnamed in the file, with no limits and not admin.
        # The same key in the file too: the file's entry (its name and limits) wins.
        plain = KeyEntry.model_construct(name=PLAIN_KEY_NAME, hash=hash_key(self.plain_key))
        return entries if any(e.hash == plain.hash for e in entries) else [plain, *entries]

    def _install(self, entries: list[KeyEntry]) -> None:
        old = {key.name: key for key in self.table.values()}
        table: dict[str, Key] = {}
        for entry in self._entries(entries):
            kept = old.get(entry.name)
            if kept is not None and kept.entry == entry:
                key = kept  # unchanged: its buckets carry on
            else:
                usage = self.usage.setdefault(entry.name, KeyUsage())
                key = Key(entry, usage, self.metrics, self.clock)
            table[key.digest] = key
        self.table = MappingProxyType(table)  # one assignment: the swap

    def reload(self) -> bool:
        """Read the file again and swap the table in; on a bad file keep the table in
        force (logged). Whether it swapped."""
        if self.path is None:
            return False
        self._seen = _mtime(self.path)
        try:
            entries = read_keys_file(self.path)
        except ConfigError as exc:
            log.error("keys file not reloaded, the keys in force stay: %s", exc.message)
            return False
        before = {k.name for k in self.table.values()}
        self._install(entries)
        after = {k.name for k in self.table.values()}
        log.info(
            "keys file reloaded: %d keys (added: %s; removed: %s)",
            len(after),
            ", ".join(sorted(after - before)) or "none",
            ", ".join(sorted(before - after)) or "none",
        )
        return True

    def poll(self) -> None:
        """Reload if the file changed; stats it at most once every POLL_SECONDS."""
        if self.path is None:
            return
        now = self.clock()
        if now - self._polled < POLL_SECONDS:
            return
        self._polled = now
        if _mtime(self.path) != self._seen:
            self.reload()

    def find(self, headers: Any) -> Key:
        """The key of a request's ``Authorization: Bearer`` header, or Unauthorized."""
        header = b""
        for name, value in headers:
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            raise Unauthorized(UNAUTHORIZED)
        digest = hashlib.sha256(token.strip()).hexdigest()
        key = self.table.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            raise Unauthorized(UNAUTHORIZED)
        return key

    def report(self) -> UsageReport:
        """``GET /admin/usage``: every key name seen since start, revoked ones included."""
        active = {key.name for key in self.table.values()}
        return UsageReport(
            keys={name: usage.report(name in active) for name, usage in sorted(self.usage.items())}
        )


def key_store(metrics: Metrics, path: str | None, plain_key: str | None) -> KeyStore | None:
    """The server's keys from its settings; None when no key is configured (all open)."""
    if not path and not plain_key:
        return None
    return KeyStore(metrics, path=Path(path) if path else None, plain_key=plain_key)


def hash_command(stdin_key: str) -> str:
    """``ember keys hash``: the line to paste into the file for a key read from stdin."""
    key = stdin_key.rstrip("\r\n")
    if not key:
        raise ConfigError("ember keys hash: no key on stdin")
    return f'hash = "{hash_key(key)}"'


def reload_on_sighup(store: KeyStore) -> Callable[[], None] | None:
    """SIGHUP reloads the keys file (the event loop's handler, so it runs between requests);
    the undo, or None where the loop cannot take signals (not the main thread, Windows)."""
    if store.path is None:
        return None
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, store.reload)
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):
        return None
    return lambda: loop.remove_signal_handler(signal.SIGHUP)
