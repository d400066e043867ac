"""`ember embed --ray` on a multi-node Ray cluster started on this machine (a head with no
CPUs, two worker nodes of one CPU, one of them with a fake GPU), the way SPEC-NOTES says a
cluster is faked here: each node its own raylet. Every worker reads its shard of the input
and writes its Parquet file itself; the output is the in-process job's (ids, order, vectors,
shards, digests, dead letters), on a local directory and on S3 (moto's server), and each
job resumes the other's. A worker node killed mid-run (its raylet, SIGKILL) is survived with
every row once; a killed head ends the job with one line and the same command resumes; a
killed driver resumes too, and leaves no Ray process.

One cluster serves the module (the head-kill test, last, restarts it); the driver-kill test
lets the CLI start and stop a local one of its own. A tiny seeded model keeps it short.
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
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from tests.ray_cluster import Cluster, kill_pids
from tests.support import REPO, child_env

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

ROWS = 2400
BUCKET = "ember-ray-tests"
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
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, with a bucket for the module."""
    from tests.platforms._helpers_runpod_sagemaker import moto_server

    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        import boto3

        boto3.client("s3", **_boto_kwargs(server.url)).create_bucket(Bucket=BUCKET)
        yield server.url


def _boto_kwargs(url: str) -> dict[str, str]:
    return {
        "endpoint_url": url,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }


def _aws_env(url: str) -> dict[str, str]:
    """What pyarrow's S3 filesystem reads (in the driver and in every node's workers)."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="module")
def cluster(moto_url: str) -> Iterator[Cluster]:
    """The module's multi-node cluster, stopped after it (and none of it left running)."""
    started = Cluster(_env(moto_url))
    try:
        started.start()
        yield started
    finally:
        started.remove()
        assert not started.mine(), "Ray processes left after the module's cluster"


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


def _args(
    corpus: Path | str, out: Path | str, model: Path, shard_rows: int, *extra: str
) -> list[str]:
    return [
        sys.executable, "-m", "ember", "embed", str(corpus), "--output", str(out),
        "--id-column", "doc", "--shard-rows", str(shard_rows), "--model-id", str(model),
        "--backend", "torch", "--device", "cpu", "--no-truncate", "--no-progress", *extra,
    ]  # fmt: skip


def _env(moto_url: str | None = None) -> dict[str, str]:
    return child_env(
        _aws_env(moto_url) if moto_url else None, drop_prefixes=("EMBER_", "RAY_ADDRESS", "AWS_")
    )


def _run(
    args: list[str], timeout: float = 400, moto_url: str | None = None, home: str | None = None
) -> dict[str, Any]:
    env = {**_env(moto_url), **({"HOME": home} if home else {})}
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _start(args: list[str], log: Path, home: str | None = None) -> subprocess.Popen:
    env = {**_env(), **({"HOME": home} if home else {})}
    with log.open("ab") as fh:
        return subprocess.Popen(
            args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def _rows_done(out: Path) -> int:
    try:
        return sum(s["rows"] for s in json.loads((out / "_ember_job.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


def _stop(job: subprocess.Popen) -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)


def _wait_rows(out: Path, rows: int, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _rows_done(out) < rows:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"fewer than {rows} rows in {seconds} s"
        time.sleep(0.05)


def _read(where: str, name: str, fs: Any = None) -> str:
    if fs is None:
        return (Path(where) / name).read_text()
    with fs.open_input_stream(f"{where}/{name}") as fh:
        return fh.read().decode()


def _same_dataset(a: str | Path, b: str | Path, rows: int, fs: Any = None) -> None:
    """Ids and order equal, vectors to cosine 0.9999, the same shards and digests, and the
    same dead letters: exactly the refused rows (``fs``: the datasets' filesystem, S3)."""
    ta, tb = (pq.read_table(str(d), filesystem=fs) for d in (a, b))
    kept = [f"doc-{i:05d}" for i in range(rows) if i not in REFUSED]
    assert ta.column("id").to_pylist() == tb.column("id").to_pylist() == kept
    va = np.asarray(ta.column("embedding").to_pylist(), dtype=np.float32)
    vb = np.asarray(tb.column("embedding").to_pylist(), dtype=np.float32)
    cos = (va * vb).sum(1) / np.linalg.norm(va, axis=1) / np.linalg.norm(vb, axis=1)
    assert cos.min() >= 0.9999
    ca, cb = (json.loads(_read(str(d), "_ember_job.json", fs)) for d in (a, b))
    assert ca == cb and ca["complete"]
    letters_a, letters_b = (_read(str(d), "_errors.jsonl", fs) for d in (a, b))
    assert letters_a == letters_b
    letters = [json.loads(line) for line in letters_a.splitlines()]
    assert [(e["id"], e["position"]) for e in letters] == [
        (f"doc-{i:05d}", i) for i in REFUSED if i < rows
    ]
    assert all("more than this model's maximum of 128" in e["error"] for e in letters)


def _nodes_embedded(summary: dict[str, Any]) -> dict[str, int]:
    """The rows each node's workers embedded, as the job's summary counts them."""
    return summary["rows_by_node"]


@pytest.mark.slow
def test_ray_equals_in_process_and_every_node_embeds(
    tmp_path: Path, tiny: Path, cluster: Cluster
) -> None:
    """A local output directory every node sees: each worker writes its own shards."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(ROWS))
    by_proc, by_ray = tmp_path / "in-process", tmp_path / "ray"
    first = _run(_args(corpus, by_proc, tiny, 300))  # the same shards: the same checkpoint
    on_ray = _run(_args(corpus, by_ray, tiny, 300, f"--ray={cluster.address}"), home=cluster.home)
    assert first["rows"] == on_ray["rows"] == ROWS
    assert first["errors"] == on_ray["errors"] == 3
    _same_dataset(by_proc, by_ray, ROWS)
    # Both worker nodes' workers embedded rows (the shards go out once both are up), and
    # the driver's own CPU is measured.
    by_node = _nodes_embedded(on_ray)
    assert len(by_node) == 2 and all(rows > 0 for rows in by_node.values()), by_node
    assert sum(by_node.values()) == ROWS
    assert on_ray["ray_workers"] == 2 and on_ray["driver_cpu_s"] > 0
    assert not (by_ray / "_staging").exists() or not any((by_ray / "_staging").iterdir())


@pytest.mark.slow
def test_s3_output_and_input_each_job_resumes_the_other(
    tmp_path: Path, tiny: Path, cluster: Cluster, moto_url: str
) -> None:
    """Input and output on S3 (moto): the workers read and write it, and the in-process
    job too; the datasets are equal and each job resumes the other's."""
    import boto3
    from pyarrow import fs as pafs

    s3 = boto3.client("s3", **_boto_kwargs(moto_url))
    texts = _texts(ROWS + 600)
    local = _write_corpus(tmp_path / "corpus.jsonl", texts[:ROWS])
    s3.put_object(Bucket=BUCKET, Key="in/corpus.jsonl", Body=local.read_bytes())
    corpus = f"s3://{BUCKET}/in/corpus.jsonl"
    by_proc, by_ray = f"s3://{BUCKET}/out/in-process", f"s3://{BUCKET}/out/ray"
    on = f"--ray={cluster.address}"
    first = _run(_args(corpus, by_proc, tiny, 500), moto_url=moto_url)
    on_ray = _run(_args(corpus, by_ray, tiny, 500, on), moto_url=moto_url, home=cluster.home)
    assert first["rows"] == on_ray["rows"] == ROWS
    fs = pafs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=moto_url,
        region="us-east-1",
    )  # fmt: skip
    _same_dataset(f"{BUCKET}/out/in-process", f"{BUCKET}/out/ray", ROWS, fs)
    assert len(_nodes_embedded(on_ray)) == 2

    # Rows appended to the input object: each job resumes the other's complete output.
    _write_corpus(local, texts[ROWS:], start=ROWS, mode="a")
    s3.put_object(Bucket=BUCKET, Key="in/corpus.jsonl", Body=local.read_bytes())
    resumed_by_ray = _run(
        _args(corpus, by_proc, tiny, 500, on), moto_url=moto_url, home=cluster.home
    )
    resumed_in_proc = _run(_args(corpus, by_ray, tiny, 500), moto_url=moto_url)
    for summary in (resumed_by_ray, resumed_in_proc):
        assert (summary["resumed_from"], summary["rows"]) == (ROWS, ROWS + 600)
    _same_dataset(f"{BUCKET}/out/in-process", f"{BUCKET}/out/ray", ROWS + 600, fs)


@pytest.mark.slow
def test_fractional_gpus_place_several_workers_on_one_gpu(
    tmp_path: Path, tiny: Path, cluster: Cluster
) -> None:
    """--ray-gpus-per-worker 0.5 on the cluster's one (fake) GPU: two workers share it,
    so every row is embedded on that GPU's node."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(600))
    summary = _run(
        _args(
            corpus, tmp_path / "out", tiny, 100, f"--ray={cluster.address}",
            "--ray-gpus-per-worker", "0.5", "--ray-cpus-per-worker", "0.5",
        ),
        home=cluster.home,
    )  # fmt: skip
    assert summary["ray_workers"] == 2 and summary["rows"] == 600
    assert len(_nodes_embedded(summary)) == 1, summary


@pytest.mark.slow
def test_a_killed_worker_node_is_survived(tmp_path: Path, tiny: Path, cluster: Cluster) -> None:
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(ROWS))
    out, log = tmp_path / "out", tmp_path / "embed.log"
    job = _start(_args(corpus, out, tiny, 50, f"--ray={cluster.address}"), log, cluster.home)
    lost: set[int] = set()
    try:
        _wait_rows(out, 100, job, log, 300)
        # The driver held still while the node goes, so the loss falls mid-job on any host:
        # its worker held two shards, and many are left for the driver to hand it.
        job.send_signal(signal.SIGSTOP)
        lost = cluster.nodes.pop()
        raylet = cluster.raylet(lost)
        workers = psutil.Process(raylet).children(recursive=True)
        assert any("ShardWorker" in " ".join(w.cmdline()) for w in workers), workers
        os.kill(raylet, signal.SIGKILL)  # the node: its workers go with it
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, f"the killed node's workers outlived its raylet: {alive}"
        job.send_signal(signal.SIGCONT)
        assert job.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        _stop(job)
        kill_pids(lost & cluster.mine())  # what of the node was left (its agents)
        cluster.add_node()  # two worker nodes again for the next test
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["rows"] == ROWS and len(summary["lost_workers"]) >= 1, summary
    assert _rows_done(out) == ROWS
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids == [f"doc-{i:05d}" for i in range(ROWS) if i not in REFUSED]


@pytest.mark.slow
def test_a_killed_head_ends_in_one_line_and_the_same_command_resumes(
    tmp_path: Path, tiny: Path, cluster: Cluster
) -> None:
    """Last of the module's cluster tests: it stops the cluster and starts it again."""
    corpus = _write_corpus(tmp_path / "corpus.jsonl", _texts(ROWS))
    out, log = tmp_path / "out", tmp_path / "embed.log"
    # Two workers named: the node the previous test killed may not be marked dead yet.
    args = _args(corpus, out, tiny, 50, f"--ray={cluster.address}", "--ray-workers", "2")
    job = _start(args, log, cluster.home)
    try:
        _wait_rows(out, 100, job, log, 300)
        job.send_signal(signal.SIGSTOP)  # held still: the head goes mid-job on any host
        head = [psutil.Process(pid) for pid in cluster.head if psutil.pid_exists(pid)]
        cluster.kill_head()
        _, alive = psutil.wait_procs(head, timeout=30)
        assert not alive, alive
        # Held past the driver's one-second head check: its first look after this finds
        # the head gone, before it commits another shard.
        time.sleep(1.5)
        job.send_signal(signal.SIGCONT)
        assert job.wait(timeout=120) == 2, log.read_text()[-3000:]
    finally:
        _stop(job)
    last = log.read_text().strip().splitlines()[-1]
    assert "lost the cluster's head" in last and "run the same command" in last, last
    assert "Traceback" not in log.read_text() and "StopIteration" not in log.read_text()
    killed_at = _rows_done(out)
    assert 100 <= killed_at < ROWS

    cluster.stop()  # the worker nodes too, then the same cluster again at the same address
    cluster.start()
    summary = _run(args, home=cluster.home)
    assert summary["resumed_from"] == killed_at and summary["rows"] == ROWS
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
        job.send_signal(signal.SIGSTOP)  # held mid-job on any host: it commits no more
        # The output directory stays held: an in-process job on it is refused at once.
        rival = subprocess.run(
            _args(corpus, out, tiny, 50), cwd=REPO, env=_env(), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert rival.returncode == 2 and f"another job (pid {job.pid})" in rival.stderr
        job.send_signal(signal.SIGKILL)  # the driver only: its cluster must go with it
        job.wait(timeout=30)
    finally:
        _stop(job)
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
