"""`ember embed` as a user runs it: killed with SIGKILL mid-run (a second job on its
directory meanwhile refused), then run again, the dataset holds every input row exactly
once, in input order, with the engine's vectors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support import REPO, child_env, run_python

ROWS = 2400
SHARD_ROWS = 100
# Short texts (4-24 words): the job's code paths, not the forward, are what this tests.
WORDS = "retrieval models embed every sentence of a corpus into vectors for search".split()


def _texts() -> list[str]:
    rng = np.random.default_rng(12)
    return [
        f"{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(4, 24)))) for i in range(ROWS)
    ]


def _embed(args: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ember", "embed", *args]
    with log.open("ab") as fh:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env=child_env(drop_prefixes=("EMBER_",)),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _rows_done(out: Path) -> int:
    try:
        return sum(s["rows"] for s in json.loads((out / "_ember_job.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0  # not written yet (or being replaced: the rename is atomic, reads are not)


@pytest.mark.slow
def test_killed_job_resumes_with_every_row_once_in_order(tmp_path: Path, minilm_path: Path) -> None:
    texts = _texts()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"doc": f"doc-{i:05d}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    out, log = tmp_path / "out", tmp_path / "embed.log"
    args = [
        str(corpus), "--output", str(out), "--id-column", "doc", "--shard-rows",
        str(SHARD_ROWS), "--model-id", str(minilm_path), "--backend", "torch",
        "--device", "cpu", "--no-progress",
    ]  # fmt: skip

    first = _embed(args, log)
    try:
        deadline = time.monotonic() + 180
        while _rows_done(out) < 3 * SHARD_ROWS:  # a few shards in, far from the end
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no shard written in 180 s"
            time.sleep(0.02)
        # A second job on the same directory is refused, naming the one that holds it.
        rival = subprocess.run(
            [sys.executable, "-m", "ember", "embed", *args],
            cwd=REPO, env=child_env(drop_prefixes=("EMBER_",)), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert rival.returncode == 2, rival.stderr[-3000:]
        assert f"another job (pid {first.pid})" in rival.stderr.splitlines()[-1]
        assert first.poll() is None  # and the first one goes on
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    killed_at = _rows_done(out)
    assert 3 * SHARD_ROWS <= killed_at < ROWS

    summary = json.loads(run_python("-m", "ember", "embed", *args, timeout=300)[-1])
    assert summary["rows"] == ROWS and summary["resumed_from"] >= killed_at
    assert summary["rows_this_run"] == ROWS - summary["resumed_from"]

    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [f"doc-{i:05d}" for i in range(ROWS)]
    assert not list(out.glob("*.tmp"))
    checkpoint = json.loads((out / "_ember_job.json").read_text())
    assert checkpoint["complete"] and checkpoint["total_rows"] == ROWS
    starts = [s["start"] for s in checkpoint["shards"]]
    assert starts == sorted(starts) and starts[0] == 0

    # Rows from both runs, around where the second one picked up, are the engine's own.
    from ember.engine import SyncEngineArray

    resumed = summary["resumed_from"]
    sample = sorted({0, 1, resumed - 2, resumed - 1, resumed, resumed + 1, ROWS - 1})
    vectors = np.asarray(table.column("embedding").take(sample).to_pylist(), dtype=np.float32)
    with SyncEngineArray(model_id=str(minilm_path), backend="torch", device="cpu") as ref:
        want = ref.embed([texts[i] for i in sample])
    assert np.abs(vectors - want).max() < 1e-5


def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, minilm_path: Path) -> None:
    corpus = tmp_path / "c.csv"
    corpus.write_text("body\nhello\n")
    utf16 = tmp_path / "u16.txt"
    utf16.write_text("hello\n", encoding="utf-16")
    cases = [
        ([str(utf16)], "u16.txt is UTF-16 (it starts with a byte-order mark)"),
        ([str(tmp_path / "missing.jsonl")], "is not a file"),
        ([str(corpus)], "has no column 'text'; its columns: body"),
        ([str(corpus), "--shard-rows", "0"], "--shard-rows must be at least 1"),
    ]
    for extra, fragment in cases:
        done = subprocess.run(
            [sys.executable, "-m", "ember", "embed", *extra, "--output", str(tmp_path / "o"),
             "--model-id", str(minilm_path), "--device", "cpu", "--backend", "torch"],
            cwd=REPO, env=child_env(drop_prefixes=("EMBER_",)), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert fragment in done.stderr.splitlines()[-1], done.stderr
