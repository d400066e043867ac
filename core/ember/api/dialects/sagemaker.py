"""SageMaker Batch Transform's JSON Lines (``application/jsonlines``, ``SplitType=Line``,
``BatchStrategy=MultiRecord``): one output line per input line, in order.

A record that is one input (a JSON string, or an object with a string ``text`` and maybe
an ``id``) decodes to its text and is answered ``{"id": ..., "embedding": ...}`` (id when
given; dense, sparse ``{"indices", "values"}`` or multi-vector, as the model returns). A
record that is a whole request body (OpenAI, Cohere, TEI: rerank rows, say) decodes to
None: ``/invocations`` answers it in its own dialect. The other platforms' bodies (RunPod's,
Modal's ``invoke``, BentoML's) are the HTTP routes' own.
"""

from __future__ import annotations

from typing import Any

import orjson

from ember.errors import BadRequest
from ember.outputs import SparseVector

JSONLINES = "application/jsonlines"
# Fields that make a JSON Lines record a whole request body rather than one input.
BODY_FIELDS = ("input", "inputs", "texts", "query")


def records(body: bytes) -> list[Any]:
    """The body's records, one per non-blank line (a trailing newline is no record)."""
    found = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            found.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"line {number} of the JSON Lines body is not JSON: {exc}") from None
    return found


def decode(record: Any, number: int) -> str | None:
    """A record's text when it is one input; None when it is a whole request body."""
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if any(f in record for f in BODY_FIELDS):
            return None
        if isinstance(record.get("text"), str):
            return record["text"]
    raise BadRequest(
        f"record {number} is neither one input (a JSON string or an object with a string "
        "'text') nor a request body (with 'input', 'inputs', 'texts' or 'query')"
    )


def encode(record: Any, value: Any) -> dict[str, Any]:
    """One input's answer line: its embedding, after its ``id`` when the record has one."""
    line = {"embedding": value.as_dict() if isinstance(value, SparseVector) else value}
    if isinstance(record, dict) and "id" in record:
        return {"id": record["id"], **line}
    return line


def lines(answers: list[Any]) -> bytes:
    """Every record's answer, one JSON line each, in order."""
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    return b"".join(orjson.dumps(answer, option=option) for answer in answers)
