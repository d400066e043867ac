"""Request ids alone: which client ids are kept, and how log lines carry the id."""

from __future__ import annotations

import io
import logging
import uuid

import orjson
import pytest

from ember.api.request_ids import MAX_LENGTH, request_id_for
from ember.logs import REQUEST_ID, JsonFormatter, PlainFormatter, RequestIdFilter


@pytest.mark.parametrize(
    "sent",
    [
        "3f2b8c1e-7d4a-4e0b-9a51-0c2d7e6f8a90",
        "01HZX3K6J8Q9W2E4R5T7Y8U9I0",
        "Root=1-5759e988-bd862e3fe1be46a994272793",
        "a" * MAX_LENGTH,
    ],
)
def test_a_safe_client_id_is_kept(sent: str) -> None:
    assert request_id_for([(b"x-request-id", sent.encode())]) == sent


@pytest.mark.parametrize(
    "sent",
    [b"", b"a" * (MAX_LENGTH + 1), b"two words", b"line\nbreak", b'quote"', b"\xc3\xbc", b"a;b"],
)
def test_an_unsafe_client_id_is_replaced(sent: bytes) -> None:
    got = request_id_for([(b"x-request-id", sent)])
    assert got != sent.decode(errors="replace") and uuid.UUID(hex=got).version == 4


def test_without_one_each_request_gets_a_new_id() -> None:
    ids = {request_id_for([(b"content-type", b"application/json")]) for _ in range(100)}
    assert len(ids) == 100
    assert all(uuid.UUID(hex=i).hex == i and uuid.UUID(hex=i).version == 4 for i in ids)


def _line(formatter: logging.Formatter, request_id: str | None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("tests.request_ids")
    logger.addHandler(handler)
    logger.propagate = False
    token = REQUEST_ID.set(request_id)
    try:
        logger.warning("something about %s", "it")
    finally:
        REQUEST_ID.reset(token)
        logger.removeHandler(handler)
    return stream.getvalue().strip()


def test_log_lines_carry_the_id_of_the_request_they_are_about() -> None:
    plain = _line(PlainFormatter(), "abc123")
    assert plain.endswith("WARNING tests.request_ids [request_id=abc123]: something about it")
    assert _line(PlainFormatter(), None).endswith("WARNING tests.request_ids: something about it")
    entry = orjson.loads(_line(JsonFormatter(), "abc123"))
    assert entry["request_id"] == "abc123" and entry["message"] == "something about it"
    assert "request_id" not in orjson.loads(_line(JsonFormatter(), None))
