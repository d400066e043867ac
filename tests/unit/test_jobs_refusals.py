"""Rows the model refuses: named one by one, kept out of the shards, written once to the
dead-letter file (a resume cuts it back to the shards its checkpoint names)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ember.engine import EmbedRequest
from ember.errors import BadRequest
from ember.jobs.refusals import Refused
from ember.jobs.runner import embed_rows
from ember.jobs.shards import Dataset, embedding_array, rows_table


class _Result:
    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs


class RefusingEngine:
    """Refuses a call holding a text that starts with "bad", as the engine refuses a call
    with one input too long; the vector of a text is its row number."""

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, request: EmbedRequest) -> _Result:
        texts = request.inputs
        self.calls += 1
        if any(t.startswith("bad") for t in texts):
            raise BadRequest(f"input {texts[0].split()[1]} is too long")
        return _Result(np.array([[float(t.split()[1])] * 2 for t in texts], np.float32))


async def test_a_refused_row_is_named_and_the_rest_embedded_in_order() -> None:
    bad = {3, 17, 18}
    rows = [(f"id{i}", f"{'bad' if i in bad else 'row'} {i}") for i in range(40)]
    shards = [
        shard
        async for shard in embed_rows(
            RefusingEngine(),  # type: ignore[arg-type]
            rows,
            output="dense",
            shard_rows=16,
            chunk_rows=8,
            in_flight=32,
            refuse_rows=True,
        )
    ]
    values = [v for _, shard_values in shards for v in shard_values]
    assert [i for ids, _ in shards for i in ids] == [f"id{i}" for i in range(40)]
    for i, value in enumerate(values):
        if i in bad:
            assert value == Refused(f"input {i} is too long")
        else:
            assert value[0] == i


def _table(ids: list[int]) -> pa.Table:
    values = [np.full(2, i, np.float32) for i in ids]
    return rows_table(ids, embedding_array("dense", values), pa.int64())


def test_dead_letters_are_written_once_across_a_kill(tmp_path: Path) -> None:
    data = Dataset(tmp_path / "out")
    checkpoint = data.open({"job": 1})
    letter = {"id": 2, "position": 2, "error": "too long"}
    data.write_shard(checkpoint, _table([0, 1, 3]), "d0", [letter])
    assert (checkpoint.shards[0].rows, checkpoint.shards[0].errors) == (4, 1)
    assert checkpoint.rows_done == 4 and checkpoint.errors == 1
    # A kill after a shard's dead letters were appended, before it was recorded:
    data._append_errors([{"id": 5, "position": 5, "error": "too long"}])
    resumed = Dataset(tmp_path / "out").open({"job": 1})
    lines = (tmp_path / "out" / "_errors.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [letter]
    assert resumed.rows_done == 4
