"""Which cores of its node a CPU worker runs on.

Ray grants an actor a number of CPUs, not which ones, and every process still sees all of
the node's cores; an engine sized to the node in each of N actors would run N times the
forwards the cores can take (``ember.cpu.cpu_forward_plan`` sizes to the cores a process
may use). So a worker claims that many free cores of its node with an ``flock`` per core
(the kernel drops it when the worker dies, however it dies) and pins itself to them; the
engine then plans its forwards for those cores. Where none are free (more workers than
cores) it is left unpinned. A grant is capped by the cgroup's CPU quota as
``ember.cpu.cpu_count()`` caps it: a node started with more CPUs than its container may use
(``ray start --num-cpus 8`` in a 2-CPU pod) pins a worker to the quota's worth of cores,
not to eight that would each get a quarter of one.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

from ember.cpu import cpu_count

LOCKS = Path(tempfile.gettempdir()) / "ember-ray-cores"


def claim_cores(count: int) -> list[int]:
    """Pin this process to ``count`` cores no other live worker on the node holds; the
    cores claimed (none: left as it was). The lock files stay open for the process's life."""
    allowed = sorted(os.sched_getaffinity(0))
    count = min(count, cpu_count())
    if count < 1 or count >= len(allowed):
        return []
    LOCKS.mkdir(parents=True, exist_ok=True)
    claimed: list[int] = []
    held: list[int] = []
    for core in allowed:
        fd = os.open(LOCKS / f"core-{core}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        claimed.append(core)  # fd kept open on purpose: the claim lasts as long as we do
        held.append(fd)
        if len(claimed) == count:
            os.sched_setaffinity(0, claimed)
            return claimed
    for fd in held:  # not enough free: stay unpinned, and hold none
        os.close(fd)
    return []
