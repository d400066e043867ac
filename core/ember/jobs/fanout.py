"""One corpus job over many machines: split the input into shard files, embed each shard
anywhere (each a small job of its own, resumable where it runs), join the results into one
dataset with the single-machine layout and checkpoint.

A platform supplies only the map (Modal's ``.map``); planning, per-shard work and joining
are here, so a fan-out writes exactly what ``ember embed`` writes on one machine. Every
step can be repeated after a failure: the plan is reused while the input is unchanged, a
shard whose checkpoint says complete is not run again, and joining links files and writes
the dataset's checkpoint last.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ember.engine import Engine
from ember.errors import ConfigError
from ember.jobs.digests import rows_digest, verify_rows
from ember.jobs.inputs import InputSpec
from ember.jobs.lock import hold_output
from ember.jobs.runner import JobOptions, JobSummary, run_embed_job
from ember.jobs.shards import Checkpoint, Dataset, Shard, _atomic_write, shard_name

PLAN = "_plan.json"


@dataclass(frozen=True)
class ShardTask:
    """One shard's work: its input file and its own output dataset (paths relative to the
    work directory, so they mean the same on every machine that mounts it)."""

    index: int
    start: int  # its first row in the whole input
    rows: int
    input: str
    output: str
    digest: str | None = None  # of its rows of the input (jobs.digests)

    @property
    def name(self) -> str:
        return self.input


def _write_inputs(source: InputSpec, work: Path, shard_rows: int) -> list[ShardTask]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ember.jobs.shards import id_type_of

    tasks: list[ShardTask] = []
    rows = source.rows()
    id_type = None
    while True:
        part = [row for _, row in zip(range(shard_rows), rows, strict=False)]
        if not part:
            return tasks
        ids = [row_id for row_id, _ in part]
        id_type = id_type or id_type_of(ids[:1000])
        index = len(tasks)
        task = ShardTask(
            index,
            start=sum(t.rows for t in tasks),
            rows=len(part),
            input=f"inputs/input-{index:05d}.parquet",
            output=f"shards/shard-{index:05d}",
            digest=rows_digest(part),
        )
        path = work / task.input
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table({"id": pa.array(ids, type=id_type), "text": [text for _, text in part]})
        pq.write_table(table, path.with_name(path.name + ".tmp"))
        os.replace(path.with_name(path.name + ".tmp"), path)
        tasks.append(task)


def plan_shards(source: InputSpec, work: Path, shard_rows: int) -> list[ShardTask]:
    """Split ``source`` into Parquet inputs of ``shard_rows`` rows under ``work``; reused
    when ``work`` already holds the plan of this same input and shard size, over the same
    rows (checked, row by row, against each planned shard's digest)."""
    work.mkdir(parents=True, exist_ok=True)
    key = {
        "input": source.identity,
        "text_column": source.text_column,
        "id_column": source.id_column,
        "shard_rows": shard_rows,
    }
    plan_path = work / PLAN
    if plan_path.exists():
        saved = json.loads(plan_path.read_text())
        if saved["key"] == key:
            tasks = [ShardTask(**t) for t in saved["tasks"]]
            _check_plan(source, work, tasks)
            return tasks
        raise ConfigError(f"{work} holds the plan of another input; use a new work directory")
    tasks = _write_inputs(source, work, shard_rows)
    _atomic_write(plan_path, json.dumps({"key": key, "tasks": [asdict(t) for t in tasks]}).encode())
    return tasks


def _check_plan(source: InputSpec, work: Path, tasks: list[ShardTask]) -> None:
    """A plan is reused only over the rows it split: the shards embed its copies of them."""
    advice = "use a new work directory"
    rows = iter(source.rows())
    verify_rows(rows, tasks, source.name, work, advice=advice)
    if next(rows, None) is not None:
        planned = sum(t.rows for t in tasks)
        raise ConfigError(
            f"{source.name} changed since {work} was planned: it has rows past the "
            f"{planned} planned; {advice}"
        )


def shard_done(work: Path, task: ShardTask) -> bool:
    path = work / task.output / "_ember_job.json"
    return path.exists() and Checkpoint.read(path).complete


async def run_shard(engine: Engine, work: Path, task: ShardTask, options: JobOptions) -> JobSummary:
    """Embed one shard into its own dataset (one Parquet file; resumed if cut short)."""
    source = InputSpec(work / task.input, "parquet", text_column="text", id_column="id")
    shard_options = JobOptions(
        output=work / task.output,
        output_kind=options.output_kind,
        normalize=options.normalize,
        dimensions=options.dimensions,
        prompt_name=options.prompt_name,
        shard_rows=max(1, task.rows),
        in_flight=options.in_flight,
        chunk_rows=options.chunk_rows,
        progress=False,
        chunking=options.chunking,
    )
    return await run_embed_job(engine, source, shard_options)


def _link(src: Path, dst: Path) -> None:
    """A hard link where the filesystem has them (no copy), else a copy."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def join_shards(
    work: Path, tasks: Iterable[ShardTask], output: Path, job: dict[str, Any]
) -> Checkpoint:
    """The shards' files, in input order, as one dataset at ``output`` with its checkpoint
    (``job`` identifies it, as ``ember embed``'s does); fails if a shard is not done."""
    with hold_output(output):
        return _join(work, tasks, output, job)


def _join(work: Path, tasks: Iterable[ShardTask], output: Path, job: dict[str, Any]) -> Checkpoint:
    dataset = Dataset(output)
    checkpoint = dataset.open(job)
    if checkpoint.complete:
        return checkpoint
    checkpoint.shards.clear()  # joined again from the start: links are cheap
    errors: list[bytes] = []
    for task in sorted(tasks, key=lambda t: t.index):
        if not shard_done(work, task):
            raise ConfigError(f"shard {task.index} ({task.output}) has not finished")
        inner = Checkpoint.read(work / task.output / "_ember_job.json")
        for part in inner.shards:
            name = shard_name(len(checkpoint.shards))
            _link(work / task.output / part.name, output / name)
            shard = Shard(name, checkpoint.rows_done, part.rows, part.digest, part.errors)
            checkpoint.shards.append(shard)
        errors += _shard_errors(work / task.output, task.start, inner.errors)
    _atomic_write(dataset.errors_path, b"".join(errors))  # before the checkpoint names them
    checkpoint.total_rows = checkpoint.rows_done
    checkpoint.complete = True
    dataset.save(checkpoint)
    return checkpoint


def _shard_errors(directory: Path, start: int, count: int) -> list[bytes]:
    """A shard job's dead letters, at their positions in the whole input."""
    import orjson

    if not count:
        return []
    out = []
    for line in Dataset(directory).errors_path.read_bytes().splitlines()[:count]:
        entry = orjson.loads(line)
        entry["position"] += start
        out.append(orjson.dumps(entry) + b"\n")
    return out


def fan_out(
    tasks: list[ShardTask],
    work: Path,
    map_shards: Callable[[list[ShardTask]], Iterable[Any]],
) -> list[ShardTask]:
    """Run the shards not yet done through ``map_shards`` (a platform's parallel map);
    returns the ones it ran."""
    pending = [t for t in tasks if not shard_done(work, t)]
    for _ in map_shards(pending):
        pass
    missing = [t.index for t in tasks if not shard_done(work, t)]
    if missing:
        raise ConfigError(f"shards {missing} did not finish; run the job again to retry them")
    return pending
