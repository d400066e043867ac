"""A multi-node Ray cluster on this machine, as SPEC-NOTES fakes one: a head with no CPUs
(``ray start --head --num-cpus 0``) and worker nodes of one CPU, each its own raylet, all on
127.0.0.1. The tests and ``benchmarks/ray_cluster.py`` start one and stop it by SIGKILL of
its own processes (never ``ray stop``, which stops every cluster of the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.support import free_port


def _procs_with(marker: str) -> dict[int, str]:
    """pid -> command line of this machine's processes whose command line names
    ``marker`` (a cluster's temp dir or GCS address: its own processes only)."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if marker in line:
            found[proc.info["pid"]] = line
    return found


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Cluster:
    """A head (no CPUs) and worker nodes (1 CPU each) on 127.0.0.1, each node its own
    raylet; started and stopped by ``ray start`` and SIGKILL of its own processes (never
    ``ray stop``, which would stop every cluster of the machine)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="ert-")  # short: Ray's socket paths are bounded
        # A home of its own: Ray reads ~/.ray/auth_token, which another cluster of the
        # machine may have written (its GCS then wants a token our nodes do not send).
        os.mkdir(home := os.path.join(self.temp, "home"))
        self.home = home
        self.env = {**env, "HOME": home}
        self.head: set[int] = set()
        self.nodes: list[set[int]] = []  # each worker node's processes

    def _ray(self, *args: str) -> None:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        done = subprocess.run(
            [ray_cli, "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *args],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def mine(self) -> set[int]:
        return set(_procs_with(self.address)) | set(_procs_with(self.temp))

    def start(self) -> None:
        before = self.mine()
        self._ray(
            "--head", "--num-cpus", "0", "--port", str(self.port), "--temp-dir", self.temp,
            "--include-dashboard", "false", "--dashboard-port", str(free_port()),
            "--ray-client-server-port", str(free_port()),
        )  # fmt: skip
        self.head = self.mine() - before
        self.add_node("--num-gpus", "1")  # a fake GPU: fractional workers share it
        self.add_node()

    def add_node(self, *extra: str) -> None:
        before = self.mine()
        self._ray(
            "--address", self.address, "--num-cpus", "1",
            "--dashboard-agent-listen-port", str(free_port()), *extra,
        )  # fmt: skip
        self.nodes.append(self.mine() - before)

    def raylet(self, node: set[int]) -> int:
        """The pid of ``node``'s raylet: killing it is losing the node."""
        lines = _procs_with(self.temp)  # a worker node's raylet uses the head's session dir
        (pid,) = [p for p in node if p in lines and lines[p].split()[0].endswith("raylet")]
        return pid

    def kill_head(self) -> None:
        kill_pids(self.head)

    def remove(self) -> None:
        """Stop it and delete its temp dir (sessions, logs, spilled objects)."""
        self.stop()
        shutil.rmtree(self.temp, ignore_errors=True)

    def stop(self) -> None:
        kill_pids(self.mine())
        deadline = time.monotonic() + 60
        while self.mine() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.head, self.nodes = set(), []
