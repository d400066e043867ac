"""The output dataset: shards published atomically, a checkpoint naming only complete
ones, leftovers of a kill removed on resume, another job's output refused."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.errors import BadRequest, ConfigError
from ember.heads.sparse import SparseVector
from ember.jobs.shards import CHECKPOINT, Dataset, embedding_array, id_type_of, shard_table

JOB = {"input": "/data/c.jsonl", "fingerprint": "12:ab", "model": "m", "output": "dense"}


def _table(start: int, rows: int) -> pa.Table:
    vectors = np.arange(start * 3, (start + rows) * 3, dtype=np.float32).reshape(rows, 3)
    return shard_table(list(range(start, start + rows)), "dense", list(vectors), pa.int64())


def test_shards_read_back_as_one_dataset_in_order(tmp_path: Path) -> None:
    data = Dataset(tmp_path / "out")
    checkpoint = data.open(JOB)
    for start, rows in [(0, 4), (4, 4), (8, 2)]:
        data.write_shard(checkpoint, _table(start, rows))
    table = pq.read_table(data.dir)  # the checkpoint's leading "_" keeps it out
    assert table.column("id").to_pylist() == list(range(10))
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 3)
    assert np.asarray(table.column("embedding").to_pylist())[9].tolist() == [27, 28, 29]
    saved = json.loads((data.dir / CHECKPOINT).read_text())
    assert [(s["name"], s["start"], s["rows"]) for s in saved["shards"]] == [
        ("part-00000.parquet", 0, 4),
        ("part-00001.parquet", 4, 4),
        ("part-00002.parquet", 8, 2),
    ]


def test_resume_removes_what_the_checkpoint_does_not_name(tmp_path: Path) -> None:
    """A kill after a shard was published but before the checkpoint named it, or in the
    middle of writing one: both files go, and the run restarts at the first unnamed row."""
    data = Dataset(tmp_path / "out")
    checkpoint = data.open(JOB)
    data.write_shard(checkpoint, _table(0, 4))
    pq.write_table(_table(4, 4), data.dir / "part-00001.parquet")  # published, not recorded
    (data.dir / "part-00002.parquet.tmp").write_bytes(b"half a file")
    (data.dir / "_ember_job.json.tmp").write_bytes(b"{")
    resumed = Dataset(data.dir).open(JOB)
    assert resumed.rows_done == 4 and [s.name for s in resumed.shards] == ["part-00000.parquet"]
    assert sorted(p.name for p in data.dir.iterdir()) == [CHECKPOINT, "part-00000.parquet"]
    data.write_shard(resumed, _table(4, 4))
    assert pq.read_table(data.dir).column("id").to_pylist() == list(range(8))


def test_another_job_is_refused_unless_overwritten(tmp_path: Path) -> None:
    data = Dataset(tmp_path / "out")
    data.write_shard(data.open(JOB), _table(0, 4))
    with pytest.raises(ConfigError, match="differs in fingerprint, model"):
        data.open({**JOB, "fingerprint": "13:cd", "model": "other"})
    fresh = data.open({**JOB, "model": "other"}, overwrite=True)
    assert fresh.rows_done == 0 and not list(data.dir.glob("part-*"))


def test_shards_without_a_checkpoint_are_not_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(_table(0, 2), out / "part-00000.parquet")
    with pytest.raises(ConfigError, match="no _ember_job.json"):
        Dataset(out).open(JOB)


def test_a_missing_listed_shard_is_an_error(tmp_path: Path) -> None:
    data = Dataset(tmp_path / "out")
    data.write_shard(data.open(JOB), _table(0, 2))
    (data.dir / "part-00000.parquet").unlink()
    with pytest.raises(ConfigError, match="listed in _ember_job.json but missing"):
        data.open(JOB)


def test_multi_vector_and_sparse_columns() -> None:
    multi = embedding_array("multi", [np.ones((2, 4), np.float32), np.zeros((3, 4), np.float32)])
    assert multi.type == pa.list_(pa.list_(pa.float32(), 4))
    assert [len(x) for x in multi.to_pylist()] == [2, 3]
    sparse = embedding_array(
        "sparse",
        [
            SparseVector(np.array([3, 9]), np.array([0.5, 1.5], np.float32)),
            SparseVector(np.array([], np.int64), np.array([], np.float32)),
        ],
    )
    assert sparse.type == pa.struct(
        [("indices", pa.list_(pa.int64())), ("values", pa.list_(pa.float32()))]
    )
    assert sparse.to_pylist() == [
        {"indices": [3, 9], "values": [0.5, 1.5]},
        {"indices": [], "values": []},
    ]
    with pytest.raises(BadRequest):
        embedding_array("logits", [np.zeros(2)])


def test_ids_keep_one_type_across_shards() -> None:
    assert id_type_of(["a", "b"]) == pa.string()
    assert id_type_of([1, 2]) == pa.int64()
    with pytest.raises(BadRequest, match="ids must all have one type"):
        shard_table(["x"], "dense", [np.zeros(2, np.float32)], pa.int64())


@pytest.mark.parametrize("ids", [[1, 2**63], [-(2**63) - 1], [2**63, -1], [2**64]])
def test_ids_past_64_bits_are_a_one_line_error(ids: list[int]) -> None:
    big = next(i for i in ids if abs(i) >= 2**63)
    with pytest.raises(BadRequest, match=f"id {big} does not fit the 64-bit integer id column"):
        shard_table(ids, "dense", [np.zeros(2)] * len(ids), id_type_of(ids[:1]))


def test_ids_past_int64_but_not_negative_are_uint64() -> None:
    ids = [2**63, 2**64 - 1, 0]
    table = shard_table(ids, "dense", [np.zeros(2)] * 3, id_type_of(ids))
    assert table.schema.field("id").type == pa.uint64()
    assert table.column("id").to_pylist() == ids


def test_a_full_disk_is_one_line_and_the_checkpoint_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = Dataset(tmp_path / "out")
    checkpoint = data.open(JOB)
    data.write_shard(checkpoint, _table(0, 4))

    def full(table: pa.Table, where: Path) -> None:
        Path(where).write_bytes(b"half")  # what a writer leaves when the disk fills
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(ConfigError) as err:
        data.write_shard(checkpoint, _table(4, 4))
    assert "No space left on device (errno 28); the shards written before" in str(err.value)
    assert sorted(p.name for p in data.dir.iterdir()) == [CHECKPOINT, "part-00000.parquet"]
    assert Dataset(data.dir).open(JOB).rows_done == 4


WRITE_LIMITED = """
import resource, signal, sys
from pathlib import Path
import numpy as np, pyarrow as pa
from ember.errors import EmberError
from ember.jobs.shards import Dataset, shard_table
data = Dataset(Path(sys.argv[1]))
checkpoint = data.open({"job": 1})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
rows = np.random.default_rng(0).random((4000, 16), dtype=np.float32)
try:
    data.write_shard(checkpoint, shard_table(list(range(4000)), "dense", list(rows), pa.int64()))
except EmberError as exc:
    print(exc.message)
"""


def test_a_real_file_size_limit_is_the_same_one_line(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes pyarrow's own write fail (EFBIG) as a full disk would."""
    from tests.support import REPO, child_env

    done = subprocess.run(
        [sys.executable, "-c", WRITE_LIMITED, str(tmp_path / "out")],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "File too large (errno 27); the shards written before are kept" in done.stdout
    assert not list((tmp_path / "out").glob("*.tmp"))
