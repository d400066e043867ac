"""Threads sized from the cgroup's CPU quota as well as the affinity mask: a pod limited to
2 CPUs on a 64-core node must plan for 2 cores, not 64 (fake cgroup trees, v2 and v1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember import cpu


def _v2(tmp_path: Path, path: str, limits: dict[str, str]) -> None:
    """A cgroup v2 tree under ``tmp_path/cgroup`` (``limits``: directory -> cpu.max) and a
    /proc/self/cgroup that puts this process at ``path``."""
    for directory, value in limits.items():
        folder = tmp_path / "cgroup" / directory.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(value + "\n")
    (tmp_path / "proc-cgroup").write_text(f"0::{path}\n")


@pytest.fixture
def node_of_64(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A 64-core node as the process sees it (affinity), reading cgroups under tmp_path."""
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cpu, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(cpu, "PROC_CGROUP", tmp_path / "proc-cgroup")
    return tmp_path


def test_a_two_cpu_pod_on_a_64_core_node_plans_for_two(node_of_64: Path) -> None:
    _v2(node_of_64, "/", {"/": "200000 100000"})  # limits.cpu: 2, in its own namespace
    assert cpu.cgroup_cpu_quota() == 2.0
    assert cpu.cpu_count() == 2
    assert cpu.physical_cores() <= 2
    assert cpu.cpu_forward_plan() == (2, 1)


def test_fractional_quotas_round_up_and_max_means_none(node_of_64: Path) -> None:
    _v2(node_of_64, "/", {"/": "150000 100000"})
    assert cpu.cpu_count() == 2
    _v2(node_of_64, "/", {"/": "50000 100000"})
    assert cpu.cpu_count() == 1
    _v2(node_of_64, "/", {"/": "max 100000"})
    assert cpu.cgroup_cpu_quota() is None
    assert cpu.cpu_count() == 64


def test_the_tightest_quota_on_the_path_counts(node_of_64: Path) -> None:
    """Outside a cgroup namespace the path is the pod's and its container's: a parent's
    quota (the pod's) caps a child without one, and the smaller of two wins."""
    path = "/kubepods/burstable/pod1/ctr"
    _v2(node_of_64, path, {"/kubepods/burstable/pod1": "400000 100000", path: "max 100000"})
    assert cpu.cgroup_cpu_quota() == 4.0
    _v2(node_of_64, path, {path: "300000 100000"})
    assert cpu.cgroup_cpu_quota() == 3.0
    assert cpu.cpu_count() == 3


def test_cgroup_v1_quota(node_of_64: Path) -> None:
    mount = node_of_64 / "cgroup" / "cpu,cpuacct"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("300000\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    (node_of_64 / "proc-cgroup").write_text("4:memory:/\n3:cpu,cpuacct:/\n")
    assert cpu.cgroup_cpu_quota() == 3.0
    (mount / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu.cgroup_cpu_quota() is None


def test_no_cgroup_and_an_affinity_smaller_than_the_quota(
    node_of_64: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cpu.cgroup_cpu_quota() is None  # no /proc/self/cgroup file at all
    assert cpu.cpu_count() == 64
    _v2(node_of_64, "/", {"/": "800000 100000"})
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert cpu.cpu_count() == 3


def test_a_ray_worker_pins_no_more_cores_than_the_quota(
    node_of_64: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray node started with more CPUs than its 2-CPU pod may use grants a worker 8: it
    pins to 2 cores (its engine then plans 2 forwards), not to 8; within the quota a grant
    pins as it is."""
    from ember.ray import cores

    pinned: list[list[int]] = []
    monkeypatch.setattr(cores.os, "sched_setaffinity", lambda pid, mask: pinned.append(mask))
    monkeypatch.setattr(cores, "LOCKS", node_of_64 / "locks")
    _v2(node_of_64, "/", {"/": "200000 100000"})
    assert cores.claim_cores(8) == [0, 1] and pinned == [[0, 1]]
    assert cores.claim_cores(1) == [2]  # cores 0 and 1 are held by the first claim
