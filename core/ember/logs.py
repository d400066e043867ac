"""Logging: plain lines or one JSON object per line (for log shippers), each line
about a request carrying that request's id."""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar

import orjson

# The id of the request being served (``x-request-id``), set by the HTTP edge
# (``ember.api.request_ids``) for the request's task: every log call made while serving it,
# from any module, carries the id without passing it along. None outside a request.
REQUEST_ID: ContextVar[str | None] = ContextVar("ember_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Stamps each record with ``request_id`` (None outside a request). On the handler, so
    records of every logger (uvicorn's access lines too) get it; an embedding application
    adds it to its own handler to see the ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class PlainFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message>``; about a request, ``<logger> [request_id=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_tag = f" [request_id={request_id}]" if request_id else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str = "info", json_logs: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else PlainFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # Per-request access lines cost throughput; they appear with --log-level debug.
    logging.getLogger("uvicorn.access").setLevel("DEBUG" if level == "debug" else "WARNING")
    install_uvicorn_limits()


class RateLimitedLog:
    """At most one line per ``interval`` seconds for a kind of event: the first is logged,
    later ones within the interval are counted and their number joins the next line."""

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last = float("-inf")
        self._folded = 0

    def admit(self) -> str | None:
        """None while a line went out within the interval (this one is counted); else the
        suffix the line that goes out now carries ('' when none was folded)."""
        now = time.monotonic()
        if now - self._last < self.interval:
            self._folded += 1
            return None
        folded, self._folded, self._last = self._folded, 0, now
        return f" (+{folded} more like it in the last {self.interval:g}s)" if folded else ""

    def warning(self, message: str) -> bool:
        """Log ``message`` unless one went out within the interval; True when it did."""
        suffix = self.admit()
        if suffix is None:
            return False
        self.logger.warning("%s%s", message, suffix)
        return True


class RateLimitedMessages(logging.Filter):
    """A logger filter that rate-limits records whose message is one of ``messages``, as
    ``RateLimitedLog`` does Ember's own: a library's line logged once per refused request
    (uvicorn's ``Invalid HTTP request received.``, one per malformed request a client
    sends) would otherwise let a client write the log as fast as it can send."""

    def __init__(self, messages: tuple[str, ...], interval: float = 5.0) -> None:
        super().__init__()
        self._limits = {m: RateLimitedLog(logging.getLogger(), interval) for m in messages}

    def filter(self, record: logging.LogRecord) -> bool:
        limit = self._limits.get(record.msg) if isinstance(record.msg, str) else None
        if limit is None:
            return True
        suffix = limit.admit()
        if suffix:
            record.msg = record.msg + suffix
        return suffix is not None


# uvicorn's own refusal lines (uvicorn.error, WARNING), one per malformed request: Ember's
# protocol answers and logs these itself (``ember.api.connections``), rate-limited.
UVICORN_REFUSALS = ("Invalid HTTP request received.",)


def install_uvicorn_limits(interval: float = 5.0) -> None:
    """Rate-limit uvicorn's per-request refusal lines on its ``uvicorn.error`` logger (once:
    a filter already there is replaced)."""
    logger = logging.getLogger("uvicorn.error")
    for old in [f for f in logger.filters if isinstance(f, RateLimitedMessages)]:
        logger.removeFilter(old)
    logger.addFilter(RateLimitedMessages(UVICORN_REFUSALS, interval))
