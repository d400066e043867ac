"""How many cores this process may use, and how a CPU backend spreads its forwards over
them (read by every CPU backend and the engine's media pool)."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cgroup_cpu_quota(root: Path | None = None, proc_cgroup: Path | None = None) -> float | None:
    """The CPU quota of this process's cgroup in cores (``cpu.max``'s quota over its period
    on cgroup v2, ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` on v1), the tightest along
    its path up to the root; None where there is none ("max", -1) or no cgroup to read.

    Why: a Kubernetes pod's ``limits.cpu`` is such a quota, not an affinity mask, so a
    2-CPU pod on a 64-core node sees 64 cores in ``sched_getaffinity`` and started 64
    threads, which the quota then throttled every period. Paths come from
    ``/proc/self/cgroup``: "/" inside a container's own cgroup namespace, the full path
    outside one."""
    root = root or CGROUP_ROOT
    try:
        lines = (proc_cgroup or PROC_CGROUP).read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2: the unified hierarchy
            found += _quotas(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                if (root / mount).is_dir():
                    found += _quotas(root / mount, path, _v1_quota)
                    break
    return min(found) if found else None


def _quotas(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas set on ``path`` and each of its parents under ``mount``."""
    relative = Path(path.strip("/"))
    found = []
    for part in (relative, *relative.parents):
        quota = read(mount / part)
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_count() -> int:
    """Cores this process may use: its CPU affinity, capped by its cgroup's CPU quota
    (rounded up, as Go's and .NET's runtimes round it: 1.5 CPUs run two threads), at least 1."""
    cores = _affinity()
    if (quota := cgroup_cpu_quota()) is not None:
        cores = min(cores, math.ceil(quota - 1e-9))
    return max(1, cores)


def cpu_forward_plan(requested: int = 0, cores: int | None = None) -> tuple[int, int]:
    """(concurrent forward passes, threads each) for a CPU backend.

    Intra-op thread pools synchronise at a barrier after every operator; when another
    process (a load generator, a sidecar) takes one core, the pool waits a whole
    scheduler slice at each barrier and a MiniLM forward measured 30x slower here. So
    small CPUs run one single-threaded forward per core instead (no barriers at all),
    and larger ones split the cores into groups of four.
    """
    cores = cores or cpu_count()
    workers = requested if requested > 0 else (cores if cores <= 4 else max(2, cores // 4))
    workers = min(workers, cores)
    return workers, max(1, cores // workers)


def int8_dot_product() -> str:
    """How this CPU multiplies int8 (as ONNX Runtime's MLAS chooses its kernel, from CPUID):
    ``"vnni"`` (AVX512-VNNI, which every AMX part has too), ``"x86"`` (no VNNI: AVX2 or
    AVX-512 without it) or ``"other"`` (not x86).

    Why it matters: without VNNI, MLAS multiplies uint8 activations by int8 weights with
    ``vpmaddubsw``, which saturates pairs of products at 16 bits; tower graphs then drifted
    to cosine 0.992 against their 0.999 bar. Read from numpy's CPUID probe, not
    /proc/cpuinfo, so a CPU-model emulator (``qemu-x86_64 -cpu Haswell``) is seen as the
    CPU it emulates."""
    import platform

    from numpy._core._multiarray_umath import __cpu_features__

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "other"
    return "vnni" if __cpu_features__.get("AVX512VNNI") else "x86"


def native_bf16() -> str | None:
    """The unit that multiplies bfloat16 natively on this CPU: ``"amx"`` (AMX-BF16 tiles),
    ``"avx512_bf16"``, or None (bf16 is then emulated and slower than float32).

    Why it matters: ``--backend auto`` serves a bf16 path where the CPU has one and it
    stays near-exact (``ember.backends.near_exact``). AVX512-BF16 is read from numpy's CPUID
    probe, as ``int8_dot_product`` reads VNNI (an emulated CPU is seen as the one it
    emulates); AMX, which numpy does not probe, from the kernel's flags."""
    from numpy._core._multiarray_umath import __cpu_features__

    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line.split() for line in info if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "amx_bf16" in flags:
        return "amx"
    return "avx512_bf16" if __cpu_features__.get("AVX512BF16") else None


def physical_cores() -> int:
    """Physical cores we may run on (within the cgroup's quota): SMT siblings share one
    core's matmul units."""
    allowed = cpu_count()
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or allowed
    except ImportError:
        physical = allowed
    return max(1, min(allowed, physical))


def lower_thread_priority(increment: int) -> None:
    """Lower the calling thread's CPU priority by ``increment`` nice levels (Linux; a
    no-op elsewhere, where a nice value is per process).

    Why: the forward passes keep every core busy under load, and the event loop that
    accepts connections, refuses what cannot be queued (429) and answers probes then
    waits its turn behind them; a 200-request flood's refusals took 1-5 ms in the app (p99)
    at equal priority against 0.5-1 ms with forwards at nice 10. The forwards still take
    every cycle the loop leaves. Threads a runtime starts from this thread (ORT's and
    CTranslate2's pools, torch's OpenMP team) inherit the value."""
    if increment <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError as exc:  # a sandbox without the call (gVisor may refuse it): a hint only
        logging.getLogger(__name__).warning("--forward-nice not applied: %s", exc)
