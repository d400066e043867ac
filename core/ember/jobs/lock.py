"""One job per output directory: an exclusive ``flock`` on ``_ember_job.lock`` inside it.

Two jobs writing one dataset would interleave shards and overwrite each other's checkpoint.
The kernel drops an ``flock`` when its process dies, ``kill -9`` included, so a lock left by
a crash never needs removing by hand; the file stays (removing it would let a third job
lock a new file while a second still holds the old one). It holds the holder's pid, for
the message a refused job prints. The leading ``_`` keeps it out of Parquet readers.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ember.errors import ConfigError

LOCK = "_ember_job.lock"
log = logging.getLogger(__name__)


@contextmanager
def hold_output(directory: Path | str, name: str = LOCK) -> Iterator[None]:
    """Hold ``directory`` (created if needed) for this process, or refuse at once; ``name``
    is the lock file's (a batch job's is its results file's, so two in one directory run).
    An object store (``s3://``) has no locks: a second job there is not refused (said)."""
    from ember.jobs.store import is_uri

    if is_uri(directory):
        log.warning("%s cannot be locked: run one job on it at a time", directory)
        yield
        return
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{directory} is being written by another job ({_holder(fd)}); wait for it "
                "to end, or write to another --output"
            ) from None
        except OSError as exc:  # a filesystem without locks (some network mounts): ENOLCK
            log.warning(
                "cannot lock %s (%s): a second job on it would not be refused",
                directory,
                os.strerror(exc.errno) if exc.errno else exc,
            )
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> str:
    """'pid N' of the process holding the lock, as it wrote it."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f"pid {text}" if text.isdigit() else "pid unknown: it is starting"
