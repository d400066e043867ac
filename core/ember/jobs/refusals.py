"""Rows the model refuses: a job writes them to its dead-letter file instead of failing.

A corpus of millions of rows holds a few the model cannot take (longer than its maximum
with truncation off): failing the whole job on one of them, after hours, helps nobody.
The engine refuses a call, not a row, so a refused call is tried again one row at a time
(``embed_each``), which names the rows; each then stands as a ``Refused`` in the values,
and the writer leaves it out of the Parquet shard and puts it in ``_errors.jsonl``.
Only the request family's ``BadRequest`` is a refusal: anything else (a failed forward,
out of memory) still fails the job, which resumes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ember.errors import BadRequest


@dataclass(frozen=True)
class Refused:
    """The value of a refused row: the model's reason."""

    error: str


async def embed_each(texts: Sequence[str], embed_one: Callable[[str], Awaitable[Any]]) -> list[Any]:
    """Each text's embedding, or ``Refused`` with the message the engine refused it with
    (all at once: the batcher groups them as it would the chunk)."""
    import asyncio

    async def one(text: str) -> Any:
        try:
            return await embed_one(text)
        except BadRequest as exc:
            return Refused(exc.message)

    return list(await asyncio.gather(*(one(t) for t in texts)))


def split_refused(values: Sequence[Any]) -> tuple[list[Any], list[tuple[int, str]]]:
    """(the embedded values, (index, error) of each refused one)."""
    good = [v for v in values if not isinstance(v, Refused)]
    refused = [(i, v.error) for i, v in enumerate(values) if isinstance(v, Refused)]
    return good, refused


def dead_letters(
    ids: Sequence[Any], start: int, refused: Sequence[tuple[int, str]]
) -> list[dict[str, Any]]:
    """The ``_errors.jsonl`` lines of a shard's refused rows (``start``: its first row)."""
    return [{"id": ids[i], "position": start + i, "error": error} for i, error in refused]
