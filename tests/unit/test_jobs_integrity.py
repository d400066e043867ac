"""A corpus job never mixes two inputs or two writers in one dataset: a resume over rows
that changed since they were embedded is refused naming the shard, and a second job on
the same output directory is refused naming the first one's pid, until that one dies
(``kill -9`` included: the kernel drops the lock)."""

from __future__ import annotations

import errno
import gc
import json
import os
import select
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ember.engine import EmbedRequest
from ember.errors import ConfigError
from ember.jobs.digests import ShardDigests, rows_digest, verify_rows
from ember.jobs.inputs import InputSpec
from ember.jobs.lock import LOCK, hold_output
from ember.jobs.runner import JobOptions, job_settings, run_embed_job
from ember.jobs.shards import CHECKPOINT, Shard
from tests.support import REPO, child_env

ROWS = [(i, f"line {i}") for i in range(25)]


def test_shard_digests_follow_the_shards_written() -> None:
    rows = ShardDigests(ROWS, 10)
    assert list(rows) == ROWS  # passed through unchanged
    assert [rows.next_digest() for _ in range(3)] == [
        rows_digest(ROWS[0:10]),
        rows_digest(ROWS[10:20]),
        rows_digest(ROWS[20:25]),
    ]
    # The id's type and where one field ends count: none of these read alike.
    variants = [[(1, "ab")], [("1", "ab")], [(1, "a"), (1, "b")], [(1, "ab"), (2, "")]]
    assert len({rows_digest(v) for v in variants}) == len(variants)


def test_verify_names_the_first_shard_whose_rows_changed(tmp_path: Path) -> None:
    shards = [
        Shard(f"part-{i:05d}.parquet", 10 * i, 10, rows_digest(ROWS[10 * i : 10 * i + 10]))
        for i in range(2)
    ]
    verify_rows(ROWS, shards, "c.txt", tmp_path)  # unchanged; rows past the shards are free
    edited = [*ROWS[:13], (13, "line 13!"), *ROWS[14:]]
    with pytest.raises(ConfigError, match=r"rows 10-19 \(part-00001.parquet\) differ"):
        verify_rows(edited, shards, "c.txt", tmp_path)
    with pytest.raises(ConfigError, match="now has 15 rows, fewer than the 20 already"):
        verify_rows(ROWS[:15], shards, "c.txt", tmp_path)


async def test_a_resume_over_edited_rows_is_refused(
    tmp_path: Path,
    minilm_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A line edited in the middle keeps the file's size: refused where it was embedded,
    taken where it was not (the dataset is then the embedding of the input as it is)."""
    from ember.config import settings_from_env
    from ember.engine import EngineArray

    corpus = tmp_path / "c.txt"
    lines = [f"sentence {i:02d} about retrieval" for i in range(30)]
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    options = JobOptions(output=out, shard_rows=10, in_flight=32, progress=False)
    settings = settings_from_env(model_id=str(minilm_path), device="cpu", backend="torch")
    engines = EngineArray(job_settings(settings, options).model_specs())
    await engines.start()
    try:
        engine = engines.get(None)
        source = InputSpec.of(corpus)
        await run_embed_job(engine, source, options)
        # As a kill after two shards leaves it: the checkpoint lists only those.
        checkpoint = json.loads((out / CHECKPOINT).read_text())
        checkpoint.update(shards=checkpoint["shards"][:2], complete=False)
        (out / CHECKPOINT).write_text(json.dumps(checkpoint))

        current = list(lines)

        def edit(row: int, text: str) -> None:
            current[row] = text
            size = corpus.stat().st_size
            corpus.write_text("\n".join(current) + "\n")
            assert corpus.stat().st_size == size  # the case a size check cannot see

        edit(15, "sentence 15 about retrievaL")
        with pytest.raises(ConfigError) as err:
            await run_embed_job(engine, source, options)
        message = err.value.message
        assert "c.txt changed since" in message and "\n" not in message
        assert "rows 10-19 (part-00001.parquet) differ" in message
        assert "new --output, or pass --overwrite" in message

        edit(15, lines[15])
        edit(25, "sentence 25 about retrievaL")  # not embedded yet: taken
        summary = await run_embed_job(engine, source, options)
        assert (summary.resumed_from, summary.rows) == (20, 30)
        got = pq.read_table(out).column("embedding").to_pylist()[25]
        want = (
            await engine.embed(EmbedRequest(["sentence 25 about retrievaL"], output="dense"))
        ).outputs[0]
        assert np.abs(np.asarray(got) - want).max() < 1e-5

        edit(3, "sentence 03 about retrievaL")  # a complete dataset is checked too
        with pytest.raises(ConfigError, match=r"rows 0-9 \(part-00000.parquet\) differ"):
            await run_embed_job(engine, source, options)
        edit(3, lines[3])  # back as embedded; rows appended to a complete dataset are added
        with corpus.open("a") as fh:
            fh.write("sentence 30 about retrieval\nsentence 31 about retrieval\n")
        summary = await run_embed_job(engine, source, options)
        assert (summary.resumed_from, summary.rows_this_run, summary.rows) == (30, 2, 32)
        checkpoint = json.loads((out / CHECKPOINT).read_text())
        assert checkpoint["complete"] and checkpoint["total_rows"] == 32

        # The disk fills at the second shard, inputs still queued: one line, no asyncio
        # noise about the cancelled ones, and the next run resumes from the first shard.
        lines.extend(f"sentence {i} about retrieval" for i in range(30, 60))
        corpus.write_text("\n".join(lines) + "\n")
        fresh = replace(options, output=tmp_path / "full", chunk_rows=1)
        write_table = pq.write_table
        calls: list[int] = []

        def fills_up(table: object, where: object, **kwargs: object) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            write_table(table, where, **kwargs)

        monkeypatch.setattr(pq, "write_table", fills_up)
        with pytest.raises(ConfigError, match=r"No space left on device \(errno 28\)"):
            await run_embed_job(engine, source, fresh)
        monkeypatch.setattr(pq, "write_table", write_table)
        summary = await run_embed_job(engine, source, fresh)
        assert (summary.resumed_from, summary.rows) == (10, 60)
    finally:
        await engines.stop()
    del engine, engines  # what still holds the cancelled calls' futures goes with them
    gc.collect()
    assert "never retrieved" not in caplog.text


HOLD = """
import sys, time
from pathlib import Path
from ember.jobs.lock import hold_output
with hold_output(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_writer_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 60)
        assert ready and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as err, hold_output(out):
            pass
        assert f"being written by another job (pid {holder.pid})" in err.value.message
        assert "\n" not in err.value.message
    finally:
        holder.kill()  # SIGKILL: no handler runs, only the kernel releases the lock
        holder.wait(timeout=30)
    with hold_output(out):
        assert (out / LOCK).read_text().strip() == str(os.getpid())


def test_a_fan_out_plan_is_reused_only_over_the_rows_it_split(tmp_path: Path) -> None:
    """Its shards embed the plan's copies of the rows: an edit after planning would
    otherwise give a dataset of the old input, an appended row none at all."""
    from ember.jobs.fanout import plan_shards

    corpus, work = tmp_path / "c.txt", tmp_path / "work"
    lines = [f"line {i:02d}" for i in range(30)]
    corpus.write_text("\n".join(lines) + "\n")
    tasks = plan_shards(InputSpec.of(corpus), work, 10)
    assert plan_shards(InputSpec.of(corpus), work, 10) == tasks  # unchanged: reused
    corpus.write_text("\n".join([*lines[:14], "line 1x", *lines[15:]]) + "\n")
    with pytest.raises(ConfigError, match=r"rows 10-19 \(inputs/input-00001.parquet\) differ"):
        plan_shards(InputSpec.of(corpus), work, 10)
    corpus.write_text("\n".join([*lines, "line 30"]) + "\n")
    with pytest.raises(ConfigError, match="rows past the 30 planned; use a new work directory"):
        plan_shards(InputSpec.of(corpus), work, 10)


def test_a_filesystem_without_locks_warns_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with hold_output(tmp_path / "out"):
        pass
    assert "cannot lock" in caplog.text and "would not be refused" in caplog.text


def test_batch_results_files_lock_one_by_one(tmp_path: Path) -> None:
    """A batch job locks its results file's own lock name: a second job on the same file is
    refused, one writing another file in the same directory runs."""
    with hold_output(tmp_path, f"{LOCK}.a.jsonl"):
        with pytest.raises(ConfigError, match="being written by another job"):
            with hold_output(tmp_path, f"{LOCK}.a.jsonl"):
                pass
        with hold_output(tmp_path, f"{LOCK}.b.jsonl"):
            pass
