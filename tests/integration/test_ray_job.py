"""`ember embed --ray` on a local Ray cluster: the in-process job's output (ids, order,
vectors, shards, digests, dead letters), each resuming the other's; a worker killed
mid-run and a driver killed mid-run both end with every row once; no Ray process is left.

One cluster (``ray.init(num_cpus=2)`` on loopback) serves the module's joined runs; the
driver-kill test lets the CLI start and stop its own. A tiny seeded model keeps it short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from tests.support import REPO, child_env

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

ROWS = 2400
REFUSED = (7, 1501, 2222)  # past the tiny model's 128 tokens, with --no-truncate
WORDS = "retrieval models embed every sentence of a corpus into vectors for search".split()


def _ray_pids() -> set[int]:
    """Ray's processes on this machine: its servers and its workers (``ray::...``)."""
    found = set()
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if line.startswith("ray::") or any(
            part in line for part in ("/ray/core/src/ray/", "raylet", "gcs_server", "ray/_private")
        ):
            found.add(proc.info["pid"])
    return found


def _wait_gone(before: set[int], seconds: float = 60) -> set[int]:
    deadline = time.monotonic() + seconds
    while (left := _ray_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local cluster for the module, stopped after it (and none of it left running)."""
    before = _ray_pids()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        assert not _wait_gone(before), "Ray processes left after the module's cluster"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_models import build_tiny_embedder

    return build_tiny_embedder(tmp_path_factory.mktemp("ray-model") / "tiny")


def _texts(n: int, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [
        f"{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) for i in range(n)
    ]
    for i in REFUSED:
        if i < n:
            texts[i] = "long " * 300
    return texts


def _write_corpus(path: Path, texts: list[str], start: int = 0, mode: str = "w") -> Path:
    with path.open(mode) as fh:
        for i, text in enumerate(texts, start):
            fh.write(json.dumps({"doc": f"doc-{i:05d}", "text": text}) + "\n")
    return path


def _args(corpus: Path, out: Path, model: Path, shard_rows: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "ember", "embed", str(corpus), "--output", str(out),
        "--id-column", "doc", "--shard-rows", str(shard_rows), "--model-id", str(model),
        "--backend", "torch", "--device", "cpu", "--no-truncate", "--no-progress", *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return child_env(drop_prefixes=("EMBER_", "RAY_ADDRESS"))


def _run(args: list[str], timeout: float = 400) -> dict:
    done = subprocess.run(
        args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("ab") as fh:
        return subprocess.Popen(
            args, cwd=REPO, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _rows_done(out: Path) -> int:
    try:
        return sum(s["rows"] for s in json.loads((out / "_ember_job.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


def _wait_rows(out: Path, rows: int, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _rows_done(out) < rows:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"fewer than {rows} rows in {seconds} s"
        time.sleep(0.05)


def _same_dataset(a: Path, b: Path, rows: int) -> None:
    """Ids and order equal, vectors to cosine 0.9999, the same shards and digests, and the
    same dead letters: exactly the refused rows."""
    ta, tb = pq.read_table(a), pq.read_table(b)
    kept = [f"doc-{i:05d}" for i in range(rows) if i not in REFUSED]
    assert ta.column("id").to_pylist() == tb.column("id").to_pylist() == kept
    va = np.asarray(ta.column("embedding").to_pylist(), dtype=np.float32)
    vb = np.asarray(tb.column("embedding").to_pylist(), dtype=np.float32)
    cos = (va * vb).sum(1) / np.linalg.norm(va, axis=1) / np.linalg.norm(vb, axis=1)
    assert cos.min() >= 0.9999
    ca, cb = (json.loads((d / "_ember_job.json").read_text()) for d in (a, b))
    assert ca == cb and ca["complete"]
    letters = [json.loads(line) for line in (a / "_errors.jsonl").read_text().splitlines()]
    assert (a / "_errors.jsonl").read_text() == (b / "_errors.jsonl").read_text()
    assert [(e["id"], e["position"]) for e in letters] == [
        (f"doc-{i:05d}", i) for i in REFUSED if i < rows
    ]
    assert all("more than this model's maximum of 128" in e["error"] for e in letters)


@pytest.mark.slow
def test_ray_equals_in_process_and_each_resumes_the_other(
    tmp_path: Path, tiny: Path, cluster: str
) -> None:
    texts = _texts(ROWS + 600)
    corpus = _write_corpus(tmp_path / "corpus.jsonl", texts[:ROWS])
    by_proc, by_ray = tmp_path / "in-process", tmp_path / "ray"
    first = _run(_args(corpus, by_proc, tiny, 500))
    on_ray = _run(_args(corpus, by_ray, tiny, 500, f"--ray={cluster}", "--ray-workers", "2"))
    assert first["rows"] == on_ray["rows"] == ROWS
    assert first["errors"] == on_ray["errors"] == 3
    _same_dataset(by_proc, by_ray, ROWS)

    # Rows appended: each job resumes the other's complete output.
    _write_corpus(corpus, texts[ROWS:], start=ROWS, mode="a")
    resumed_by_ray = _run(_args(corpus, by_proc, tiny, 500, f"--ray={cluster}"))
    resumed_in_proc = _run(_args(corpus, by_ray, tiny, 500))
    for summary in (resumed_by_ray, resumed_in_proc):
        assert (summary["resumed_from"], summary["rows"]) == (ROWS, ROWS + 600)
    _same_dataset(by_proc, by_ray, ROWS + 600)


def _embedder_workers() -> list[psutil.Process]:
    workers = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if line.startswith("ray::") and "Embedder" in line:
            workers.append(proc)
    return workers


@pytest.mark.slow
def test_a_killed_worker_s_shard_is_run_again(tmp_path: Path, tiny: Path, cluster: str) -> None:
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(ROWS))
    out, log = tmp_path / "out", tmp_path / "embed.log"
    args = _args(corpus, out, tiny, 50, f"--ray={cluster}", "--ray-workers", "2")
    job = _start(args, log)
    try:
        _wait_rows(out, 100, job, log, 300)
        workers = _embedder_workers()
        assert workers, "no Embedder actor found"
        workers[0].send_signal(signal.SIGKILL)
        assert job.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    assert _rows_done(tmp_path / "out") == ROWS
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids == [f"doc-{i:05d}" for i in range(ROWS) if i not in REFUSED]


@pytest.mark.slow
def test_a_killed_driver_resumes_and_leaves_no_ray_process(tmp_path: Path, tiny: Path) -> None:
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(ROWS))
    out, log = tmp_path / "out", tmp_path / "embed.log"
    args = _args(corpus, out, tiny, 50, "--ray", "--ray-workers", "1")
    before = _ray_pids()
    job = _start(args, log)
    try:
        _wait_rows(out, 100, job, log, 300)
        # The output directory stays held: an in-process job on it is refused at once.
        rival = subprocess.run(
            _args(corpus, out, tiny, 50), cwd=REPO, env=_env(), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert rival.returncode == 2 and f"another job (pid {job.pid})" in rival.stderr
        job.send_signal(signal.SIGKILL)  # the driver only: its cluster must go with it
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    killed_at = _rows_done(out)
    assert 100 <= killed_at < ROWS

    summary = _run(args)
    assert summary["resumed_from"] == killed_at and summary["rows"] == ROWS
    assert summary["errors"] == len(REFUSED)
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids == [f"doc-{i:05d}" for i in range(ROWS) if i not in REFUSED]
    # Both clusters gone: the killed driver's with it (its raylet and workers at once; Ray's
    # two agents exit when they find their raylet dead, ~80 s on this host) and the one the
    # resumed job started and stopped.
    assert not _wait_gone(before, 180), "Ray processes outlived their job"
