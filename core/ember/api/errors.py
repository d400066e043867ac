"""The one place where exceptions become OpenAI-shaped HTTP error bodies."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ember.errors import EmberError, RateLimited, error_body
from ember.logs import RateLimitedLog

log = logging.getLogger(__name__)
# Timeouts (504) and disconnects (499) come in floods under overload: one WARNING line
# per kind every few seconds, with the count of those folded into it.
expected = RateLimitedLog(log, interval=5.0)
_disconnects = RateLimitedLog(log, interval=5.0)

_HTTP_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_response(status: int, body: dict, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


# Headers a status carries by its RFC: when to retry, how to authenticate.
_STATUS_HEADERS = {429: {"Retry-After": "1"}, 401: {"WWW-Authenticate": "Bearer"}}


def client_gone_response(answered: int | None = None) -> Response:
    """499 for a client that left before its answer (its queued inputs are dropped). Where
    the connection layer ``answered`` the request itself (a stalled body's 408, logged
    there), that status, unlogged: the send is dropped, and the metrics count the 408."""
    if answered is not None:
        body = error_body("answered by the connection layer", "timeout_error", answered)
        return error_response(answered, body)
    _disconnects.warning("client disconnected before its answer (499)")
    return error_response(499, error_body("client disconnected", "client_closed", 499))


def ember_error_response(exc: EmberError) -> Response:
    headers = _STATUS_HEADERS.get(exc.status_code)
    if isinstance(exc, RateLimited):
        headers = {"Retry-After": str(exc.retry_after)}
    return error_response(exc.status_code, exc.to_body(), headers)


def validation_message(errors: list[dict]) -> tuple[int, str, str | None]:
    """(status, message, param) for pydantic's error list: the first problems, readably."""
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        return (
            400,
            f"request body is not valid JSON: {detail.get('ctx', {}).get('error', '')}",
            None,
        )
    parts, param = [], None
    for err in errors[:3]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if param is None and loc:
            param = loc[0]
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return 422, "; ".join(parts) + more, param


def exception_response(exc: Exception) -> Response:
    """Any exception as an OpenAI-shaped error response: FastAPI's handlers and the model
    routes' fast path both answer through here."""
    if isinstance(exc, EmberError):
        if exc.status_code == 504:  # the client's deadline under load, not a server fault
            expected.warning(f"{type(exc).__name__}: {exc.message}")
        elif exc.status_code >= 500:
            log.error("%s: %s", type(exc).__name__, exc.message)
        return ember_error_response(exc)
    if isinstance(exc, RequestValidationError):
        status, message, param = validation_message(list(exc.errors()))
        return error_response(status, error_body(message, "invalid_request_error", status, param))
    if isinstance(exc, HTTPException):
        kind = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        return error_response(
            exc.status_code,
            error_body(str(exc.detail), kind, exc.status_code),
            getattr(exc, "headers", None),
        )
    log.error("unhandled error", exc_info=exc)
    return error_response(
        500, error_body(f"internal error: {type(exc).__name__}", "server_error", 500)
    )


def install_error_handlers(app: FastAPI) -> None:
    async def handle(_: Request, exc: Exception) -> Response:
        return exception_response(exc)

    for kind in (EmberError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(kind, handle)
