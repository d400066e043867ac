"""The Ray job's shard plan, alone: sized to the cluster unless --shard-rows is given, and
its tasks cover the rows left exactly once, each at its byte offset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from ember.jobs.inputs import InputSpec  # noqa: E402
from ember.jobs.runner import SHARD_ROWS  # noqa: E402
from ember.ray.job import MIN_SHARD_ROWS, SHARDS_PER_WORKER, plan_tasks, shard_rows_for  # noqa: E402


@pytest.mark.parametrize(
    ("rows", "workers", "given", "expected"),
    [
        (16_000, 2, None, 16_000 // (2 * SHARDS_PER_WORKER)),  # every worker several shards
        (4_000, 8, None, MIN_SHARD_ROWS),  # no smaller than the floor
        (10_000_000, 4, None, SHARD_ROWS),  # no larger than the in-process size
        (16_000, 2, 1_000, 1_000),  # --shard-rows wins
        (5, 3, None, MIN_SHARD_ROWS),
    ],
)
def test_shard_size_follows_the_cluster(
    rows: int, workers: int, given: int | None, expected: int
) -> None:
    assert shard_rows_for(rows, workers, given) == expected


def test_more_workers_mean_more_shards() -> None:
    shards = [-(-16_000 // shard_rows_for(16_000, n, None)) for n in (1, 2, 4, 8)]
    assert shards == sorted(shards) and shards[0] < shards[-1]
    assert all(
        count >= SHARDS_PER_WORKER * n for count, n in zip(shards, (1, 2, 4, 8), strict=True)
    )


def test_tasks_cover_the_rows_once_from_their_offsets(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"row {i} " + "x" * (i % 7)}) for i in range(1000)]
    lines.insert(500, "")  # a blank line separates nothing and is no row
    path.write_text("\n".join(lines) + "\n")
    source = InputSpec.of(path)
    start = 130  # a resume: rows before are done
    offsets = source.offsets(start, 200)
    tasks = plan_tasks(start, 1000 - start, 200, offsets, "tag")
    assert [(t.start, t.rows) for t in tasks] == [(130 + 200 * k, 200) for k in range(4)] + [
        (930, 70)
    ]
    assert len({t.file for t in tasks}) == len(tasks)
    read = [row for t in tasks for row in source.rows(t.start, t.start + t.rows, t.offset)]
    assert read == list(source.rows(start))
    assert read[0] == (130, "row 130 " + "x" * (130 % 7))


@pytest.mark.parametrize(
    ("cpus", "gpus", "fragment"),
    [
        (1.0, 1.5, "more than one GPU must be a whole number"),
        (-1.0, 0.0, "cannot be negative"),
        (0.0, 0.0, "needs CPUs or GPUs"),
    ],
)
def test_worker_sizes_ray_cannot_place_are_refused(cpus: float, gpus: float, fragment: str) -> None:
    from ember.errors import ConfigError
    from ember.jobs.command import _check_worker_size

    with pytest.raises(ConfigError, match=fragment):
        _check_worker_size(cpus, gpus)


@pytest.mark.parametrize(("cpus", "gpus"), [(1.0, 0.0), (0.5, 0.5), (1.0, 0.25), (1.0, 2.0)])
def test_fractional_and_whole_gpu_shares_are_taken(cpus: float, gpus: float) -> None:
    from ember.jobs.command import _check_worker_size

    _check_worker_size(cpus, gpus)


def test_a_local_cluster_has_the_cpus_the_cgroup_quota_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job's own local cluster gets ``ember.cpu.cpu_count()`` CPUs (affinity capped by
    the cgroup quota), as an in-process job plans for; a joined cluster keeps its own."""
    from ember.ray import job

    calls: list[dict] = []
    monkeypatch.setattr(job.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(job.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(job.ray, "shutdown", lambda: None)
    monkeypatch.setattr(job, "cpu_count", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with job.cluster(None):
        pass
    with job.cluster("127.0.0.1:6379"):
        pass
    assert calls[0]["num_cpus"] == 2 and "num_cpus" not in calls[1]
