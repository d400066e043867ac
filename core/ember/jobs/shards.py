"""The output: a Parquet dataset of numbered shards plus a checkpoint that lists them.

A shard is written to a temporary name and published by rename, then the checkpoint is
rewritten the same way, so after a kill at any instant the checkpoint names only complete
shards, each exactly once. A resumed job deletes whatever the checkpoint does not name
(a temporary file, or a shard published just before the kill) and starts at the first row
no listed shard holds: no row is lost or written twice. The checkpoint's name starts with
``_``, which Parquet readers (pyarrow, DuckDB, Spark, polars) skip, so the directory reads
as one dataset, in input order (shard names sort in order).

A row the model refuses (too long with ``truncate`` off) is not in any shard: it is a line
of ``_errors.jsonl`` (its id, position and the error), appended before its shard is
published; each shard records how many of its rows were refused, so a resume cuts the
file back to the lines of the shards the checkpoint names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember.capabilities import Output
from ember.errors import BadRequest, ConfigError
from ember.jobs.store import TEMP_SUFFIX, Store, atomic_write
from ember.outputs import DenseVectors, MultiVectors, OutputValue, SparseVectors, output_type

CHECKPOINT = "_ember_job.json"
ERRORS = "_errors.jsonl"  # the dead letters: rows the model refused, one JSON line each
# Ray workers write their shards here, under names of their own; the driver renames each to
# its place in input order. Parquet readers skip ``_`` paths, so this never reads as data.
STAGING = "_staging"


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def same_job(job: dict[str, Any], recorded: dict[str, Any], holds: str) -> None:
    """Refuse to resume a checkpoint written by a job with other settings, naming them."""
    if job != recorded:
        changed = sorted(k for k in {*job, *recorded} if job.get(k) != recorded.get(k))
        raise ConfigError(
            f"{holds} (differs in {', '.join(changed)}); write to a new --output, or pass "
            "--overwrite to start again"
        )


_atomic_write = atomic_write  # the name fanout and batch results import


def write_failed(directory: Path | str, exc: OSError) -> ConfigError:
    """A failed write (a full disk, a quota, a file-size limit) as the one line a job ends
    with: the checkpoint on disk is the last one written whole, so the job resumes."""
    # os.strerror: pyarrow's own strerror repeats itself ("Error writing bytes... Detail: ...").
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return ConfigError(
        f"cannot write to {directory}: {reason} (errno {exc.errno}); the shards written "
        "before are kept: make room and run the job again to resume"
    )


@dataclass
class Shard:
    name: str
    start: int  # first input row it holds
    rows: int  # input rows it covers: those in the file and the ``errors`` refused
    digest: str | None = None  # of the input rows it was computed from (jobs.digests)
    errors: int = 0  # rows refused by the model, in the dataset's ``_errors.jsonl``


@dataclass(frozen=True)
class Staged:
    """A shard a Ray worker wrote under ``STAGING`` (its own name), waiting for the driver
    to give it its place in the dataset: what the checkpoint will say of it."""

    file: str  # its name under STAGING
    start: int
    rows: int
    digest: str
    errors: tuple[dict[str, Any], ...] = ()  # its dead letters, positions in the whole input


@dataclass
class Checkpoint:
    """What a job has written; ``job`` identifies the job, so a resume with another input,
    model or output shape is refused instead of mixing two jobs in one dataset."""

    job: dict[str, Any]
    shards: list[Shard] = field(default_factory=list)
    total_rows: int | None = None
    complete: bool = False

    @property
    def rows_done(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.shards)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, default=str).encode()

    @classmethod
    def read(cls, path: Path) -> Checkpoint:
        return cls.parse(path.read_bytes())

    @classmethod
    def parse(cls, data: bytes) -> Checkpoint:
        raw = json.loads(data)
        return cls(
            job=raw["job"],
            shards=[Shard(**s) for s in raw["shards"]],
            total_rows=raw.get("total_rows"),
            complete=raw.get("complete", False),
        )


class Dataset:
    """One output (a local directory or an object-store prefix): its checkpoint and shards."""

    def __init__(self, directory: Path | str | Store) -> None:
        self.store = Store.of(directory)

    @property
    def dir(self) -> Path:
        """The local directory (fan-out joins link files there)."""
        return self.store.dir

    @property
    def checkpoint_path(self) -> Path:
        return self.dir / CHECKPOINT

    @property
    def errors_path(self) -> Path:
        return self.dir / ERRORS

    def open(self, job: dict[str, Any], *, overwrite: bool = False) -> Checkpoint:
        """The checkpoint to continue from (a new one for a new job), with the directory
        cleared of everything it does not name."""
        store = self.store
        try:
            store.make()
            names = store.names()
        except OSError as exc:
            raise write_failed(store, exc) from None
        checkpoint = None
        if CHECKPOINT in names and not overwrite:
            checkpoint = Checkpoint.parse(store.read_bytes(CHECKPOINT))
            same_job(job, checkpoint.job, f"{store} holds another job's output")
        elif any(n.startswith("part-") and n.endswith(".parquet") for n in names) and not overwrite:
            raise ConfigError(
                f"{store} holds Parquet shards but no {CHECKPOINT}; write to a new --output, "
                "or pass --overwrite"
            )
        checkpoint = checkpoint or Checkpoint(job=job)
        self._clean(checkpoint, names)
        self.save(checkpoint)
        return checkpoint

    def _clean(self, checkpoint: Checkpoint, names: list[str]) -> None:
        store = self.store
        self._cut_errors(checkpoint.errors)
        keep = {s.name for s in checkpoint.shards}
        for name in names:
            if name.endswith(TEMP_SUFFIX) or (name.startswith("part-") and name not in keep):
                store.delete(name)
        store.delete_dir(STAGING)  # shards Ray workers wrote that no checkpoint names
        present = set(names)
        for shard in checkpoint.shards:
            if shard.name not in present:
                raise ConfigError(
                    f"{store.display(shard.name)} is listed in {CHECKPOINT} but missing; the "
                    "output was changed by hand: pass --overwrite to start again"
                )

    def _cut_errors(self, lines: int) -> None:
        """Keep the dead letters of the listed shards: lines appended for a shard a kill
        left unrecorded would be written again by the resume."""
        store = self.store
        if not store.exists(ERRORS):
            return
        if store.local:
            with self.errors_path.open("rb+") as fh:
                for _ in range(lines):
                    if not fh.readline():
                        break
                fh.truncate(fh.tell())
            return
        data = store.read_bytes(ERRORS)
        kept = b"".join(data.splitlines(keepends=True)[:lines])
        if kept != data:
            store.write_bytes(ERRORS, kept)

    def _append_errors(self, errors: Sequence[dict[str, Any]]) -> None:
        import orjson

        data = b"".join(orjson.dumps(e, default=str) + b"\n" for e in errors)
        try:
            self.store.append_bytes(ERRORS, data)
        except OSError as exc:
            raise write_failed(self.store, exc) from None

    def save(self, checkpoint: Checkpoint) -> None:
        try:
            self.store.write_bytes(CHECKPOINT, checkpoint.to_json())
        except OSError as exc:
            raise write_failed(self.store, exc) from None

    def write_shard(
        self,
        checkpoint: Checkpoint,
        table: Any,
        digest: str | None = None,
        errors: Sequence[dict[str, Any]] = (),
        rows: int | None = None,
    ) -> Shard:
        """Publish ``table`` as the next shard, then record it (with the ``digest`` of its
        input rows): the order that makes a kill between the two leave only a file the next
        run deletes. ``errors``: the dead letters of the shard's refused rows, appended
        first. The shard covers ``rows`` input rows (default: ``table``'s rows and the
        refused ones; a chunked job's table has several rows per input)."""
        shard = Shard(
            shard_name(len(checkpoint.shards)),
            checkpoint.rows_done,
            table.num_rows + len(errors) if rows is None else rows,
            digest,
            len(errors),
        )
        if errors:
            self._append_errors(errors)
        try:
            self.store.write_table(shard.name, table)
        except OSError as exc:  # pyarrow's IO errors are OSError too
            raise write_failed(self.store, exc) from None
        checkpoint.shards.append(shard)
        self.save(checkpoint)
        return shard

    def commit(self, checkpoint: Checkpoint, staged: Sequence[Staged]) -> None:
        """Give shards Ray workers wrote (in input order, the next after the checkpoint's)
        their places: dead letters appended, each file renamed to its shard name, then one
        checkpoint naming them all. The driver moves names only, never a vector."""
        letters = [e for s in staged for e in s.errors]
        if letters:
            self._append_errors(letters)
        for item in staged:
            if item.start != checkpoint.rows_done:
                raise ConfigError(
                    f"a worker's shard starts at row {item.start}, the dataset at "
                    f"{checkpoint.rows_done}: rerun the same command to resume"
                )
            shard = Shard(
                shard_name(len(checkpoint.shards)),
                item.start,
                item.rows,
                item.digest,
                len(item.errors),
            )
            staged_name = f"{STAGING}/{item.file}"
            if not self.store.exists(staged_name):
                raise ConfigError(
                    f"{self.store.display(staged_name)} was written by a Ray worker but this "
                    "driver does not see it: the output must be storage every node sees (a "
                    "shared directory, or s3://...)"
                )
            try:
                self.store.move(staged_name, shard.name)
            except OSError as exc:
                raise write_failed(self.store, exc) from None
            checkpoint.shards.append(shard)
        self.save(checkpoint)


# ---- rows -> Arrow ---------------------------------------------------------------------


def _dense_array(values: Sequence[Any]) -> Any:
    """``fixed_size_list<float32>[d]``."""
    import pyarrow as pa

    matrix = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    flat = pa.array(matrix.reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1])


def _multi_array(values: Sequence[Any]) -> Any:
    """``list<fixed_size_list<float32>[d]>``: one vector per token."""
    import pyarrow as pa

    mats = [np.asarray(m, dtype=np.float32) for m in values]
    dim = mats[0].shape[1] if mats else 0
    flat = pa.array(
        np.concatenate([m.reshape(-1) for m in mats]) if mats else np.zeros(0, np.float32),
        type=pa.float32(),
    )
    vectors = pa.FixedSizeListArray.from_arrays(flat, dim)
    offsets = np.concatenate([[0], np.cumsum([m.shape[0] for m in mats])]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), vectors)


def _sparse_array(values: Sequence[Any]) -> Any:
    """``struct<indices: list<int64>, values: list<float32>>``."""
    import pyarrow as pa

    indices = pa.array([np.asarray(v.indices, dtype=np.int64) for v in values])
    weights = pa.array(
        [np.asarray(v.values, dtype=np.float32) for v in values], type=pa.list_(pa.float32())
    )
    return pa.StructArray.from_arrays([indices, weights], names=["indices", "values"])


_ARRAYS: dict[type[OutputValue], Any] = {
    DenseVectors: _dense_array,
    MultiVectors: _multi_array,
    SparseVectors: _sparse_array,
}


def embedding_array(output: Output, values: Sequence[Any]) -> Any:
    """One Arrow column of embeddings, in the output type's own column type."""
    write = _ARRAYS.get(output_type(output))
    if write is None:
        raise BadRequest(f"cannot write {output} outputs as embeddings")
    return write(values)


def shard_table(ids: Sequence[Any], output: Output, values: Sequence[Any], id_type: Any) -> Any:
    """The (id, embedding) table of one shard; ids cast to the job's id type, so every shard
    of a dataset has one schema."""
    return rows_table(ids, embedding_array(output, values), id_type)


def rows_table(ids: Sequence[Any], embeddings: Any, id_type: Any) -> Any:
    """``shard_table`` of embeddings already an Arrow column (as Ray workers return them)."""
    import pyarrow as pa

    try:
        id_array = pa.array(list(ids), type=id_type)
    except OverflowError:
        raise _id_too_large(ids) from None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise BadRequest(
            f"ids must all have one type ({id_type}, from the first rows): {exc}"
        ) from None
    return pa.table({"id": id_array, "embedding": embeddings})


def id_type_of(ids: Sequence[Any]) -> Any:
    """The Arrow type of a job's ids, inferred from its first rows (int64, string, ...):
    uint64 where they pass int64 but none is negative (a Parquet uint64 column's)."""
    import pyarrow as pa

    try:
        return pa.array(list(ids)).type
    except OverflowError:
        try:
            return pa.array(list(ids), type=pa.uint64()).type
        except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
            raise _id_too_large(ids) from None


def _id_too_large(ids: Sequence[Any]) -> BadRequest:
    """Arrow's integers are 64-bit: an id past them cannot be written as one."""
    big = next((i for i in ids if isinstance(i, int) and not -(2**63) <= i < 2**63), "an id")
    return BadRequest(
        f"id {big} does not fit the 64-bit integer id column (int64, or uint64 when no id "
        "is negative, as the first rows decide); write ids this large as strings"
    )
