"""One exception family; the HTTP layer turns each into an OpenAI-shaped body."""

from __future__ import annotations

from typing import Any


class EmberError(Exception):
    """An error a client should see, with the HTTP status it maps to."""

    status_code: int = 400
    type: str = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        if type is not None:
            self.type = type
        self.param = param

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.status_code, self.param)


def error_body(message: str, type: str, status_code: int, param: str | None = None) -> dict:
    """The OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": status_code}}


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (its first), cut at ``limit``: how a library's own
    exception is quoted in a start-up refusal or a log line, its traceback left to debug."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class BadRequest(EmberError):
    status_code = 400


class Unauthorized(EmberError):
    status_code = 401
    type = "authentication_error"


class Forbidden(EmberError):
    """An API key that is known but not allowed this model or route."""

    status_code = 403
    type = "permission_error"


class NotFound(EmberError):
    status_code = 404
    type = "not_found_error"


class PayloadTooLarge(EmberError):
    status_code = 413


class Unprocessable(EmberError):
    status_code = 422


class Overloaded(EmberError):
    """The bounded queue is full: refuse at once instead of hanging."""

    status_code = 429
    type = "rate_limit_error"


class RateLimited(Overloaded):
    """An API key over one of its own limits (``--api-keys-file``): the message names the
    limit, ``retry_after`` says when the key may send again."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(EmberError):
    status_code = 504
    type = "timeout_error"


class NotReady(EmberError):
    status_code = 503
    type = "service_unavailable"


class Unavailable(EmberError):
    """The server lacks a resource to serve this now (file descriptors, its media budget):
    not the client's fault, and worth retrying."""

    status_code = 503
    type = "service_unavailable"


class BackendFailure(EmberError):
    """A forward pass raised; only the requests in that batch see this."""

    status_code = 500
    type = "server_error"


class MissingDependency(EmberError):
    """An optional backend/platform package is not installed."""

    status_code = 500
    type = "server_error"


class ConfigError(EmberError):
    """Bad configuration at start-up (CLI flags, env vars, model files)."""

    status_code = 500
    type = "server_error"
