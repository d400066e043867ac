"""The one place where exceptions become OpenAI-shaped HTTP error bodies, and the one
shape every non-2xx answer has (``ErrorResponse``), documented for each status."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ember.errors import EmberError, RateLimited, error_body
from ember.logs import RateLimitedLog

log = logging.getLogger(__name__)
# Timeouts (504) and disconnects (499) come in floods under overload: one WARNING line
# per kind every few seconds, with the count of those folded into it.
expected = RateLimitedLog(log, interval=5.0)
_disconnects = RateLimitedLog(log, interval=5.0)


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error, authentication_error, not_found_error, "
        "rate_limit_error, timeout_error, service_unavailable or server_error."
    )
    param: str | None = Field(description="The request field at fault, where one is.")
    code: int = Field(description="The HTTP status.")


class ErrorResponse(BaseModel):
    """Every non-2xx answer (OpenAI's error shape)."""

    error: ErrorDetail


# What each error status means, on whichever route lists it.
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON, or a request the model cannot serve: a task or output it lacks, "
    "text over its max tokens with `truncate: false`, no `model` with several served.",
    401: "Missing or wrong API key (with `--api-key` or `--api-keys-file`).",
    403: "The API key may not use this model or route (`--api-keys-file`), or the route "
    "needs an admin key.",
    408: "Any route: the request head did not arrive within `--header-timeout`, or its body "
    "stalled for `--body-timeout`; the connection closes.",
    404: "`model` names no served model.",
    413: "Body over `--payload-limit`, or more inputs than `--max-client-batch-size`.",
    422: "The body does not fit the schema.",
    431: "Any route: the request head is over 16 KiB or 100 header lines.",
    429: "The model cannot take the request in time (queue full or too long a wait), or the "
    "API key is over one of its own limits (the message names it); retry after `Retry-After`.",
    500: "A forward pass failed (only the requests in its batch), or an internal error.",
    499: "Never read by a client: what the metrics and the log record when the client left "
    "before its answer (its queued inputs are dropped).",
    503: "The model is still loading, or loading failed; on any route, a new connection "
    "past `--max-connections`.",
    504: "The request waited past `--request-timeout`.",
}

ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}},
    429: {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait."}},
}

# What the connection layer (ember.api.connections) answers on any route, before routing.
CONNECTION_ERRORS = (408, 431, 503)


def error_responses(statuses: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    """``add_api_route(responses=...)`` entries: each status with the one error model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]}
        if status in ERROR_HEADERS:
            entry["headers"] = ERROR_HEADERS[status]
        out[status] = entry
    return out


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


def allowed_methods(app: FastAPI, path: str) -> str:
    """Every method some route answers on ``path``: Starlette's 405 names only the first
    route's, and ``/`` has two (GET redirects to the docs, POST is TEI's)."""
    methods = {
        m
        for r in app.routes
        if getattr(r, "path", None) == path
        for m in getattr(r, "methods", None) or ()
    }
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            path = request.scope["path"].removeprefix(request.scope.get("root_path", ""))
            exc.headers = {**(exc.headers or {}), "Allow": allowed_methods(app, path)}
        return exception_response(exc)

    for kind in (EmberError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(kind, handle)
