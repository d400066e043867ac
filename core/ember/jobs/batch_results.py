"""A batch job's results file and the checkpoint beside it (``<output>.ember-job.json``):
what is durable, how a resumed run cuts back to it, and the input lines it answered."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from ember.errors import ConfigError
from ember.jobs.shards import _atomic_write, same_job

CHECKPOINT_SUFFIX = ".ember-job.json"


@dataclass
class BatchCheckpoint:
    job: dict[str, Any]
    lines_done: int = 0  # input lines consumed (blank ones included)
    bytes: int = 0  # of the results file that hold those lines' results
    requests: int = 0
    errors: int = 0
    complete: bool = False
    input_digest: str = ""  # sha256 of the input lines consumed: a resume over an edit refused


class ResultsFile:
    """The results JSON Lines file and its checkpoint, beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.checkpoint_path = path.with_name(path.name + CHECKPOINT_SUFFIX)

    def open(self, job: dict[str, Any], *, overwrite: bool) -> BatchCheckpoint:
        """The checkpoint to continue from, with the file cut back to what it records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = None
        if self.checkpoint_path.exists() and not overwrite:
            raw = json.loads(self.checkpoint_path.read_text())
            checkpoint = BatchCheckpoint(**raw)
            same_job(job, checkpoint.job, f"{self.path} holds another job's results")
        elif self.path.exists() and not overwrite:
            raise ConfigError(
                f"{self.path} exists but has no {self.checkpoint_path.name}; write to a new "
                "--output, or pass --overwrite"
            )
        checkpoint = checkpoint or BatchCheckpoint(job=job)
        with self.path.open("ab") as fh:  # created if new; what follows the checkpoint goes
            fh.truncate(checkpoint.bytes)
        self.save(checkpoint)
        return checkpoint

    def save(self, checkpoint: BatchCheckpoint) -> None:
        _atomic_write(self.checkpoint_path, json.dumps(asdict(checkpoint), indent=1).encode())

    def append(self, checkpoint: BatchCheckpoint, lines: list[bytes], consumed: int) -> None:
        """Write results, make them durable, then record them: a kill between the two
        leaves bytes past the checkpoint, which the next run cuts off."""
        with self.path.open("ab") as fh:
            fh.write(b"".join(lines))
            fh.flush()
            os.fsync(fh.fileno())
            checkpoint.bytes = fh.tell()
        checkpoint.lines_done = consumed
        self.save(checkpoint)


def input_lines(path: Path, start: int) -> Iterator[tuple[int, bytes]]:
    """(1-based number, raw line) from line ``start + 1`` on; blank lines included (they
    are consumed and answered by nothing)."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, 1):
            if number > start:
                yield number, raw


def prefix_digest(path: Path, stop: int) -> Any:
    """A sha256 over the first ``stop`` input lines, to go on with as lines are consumed."""
    digest = hashlib.sha256()
    for number, raw in input_lines(path, 0):
        if number > stop:
            break
        digest.update(raw)
    return digest


def seen_ids(path: Path, stop: int) -> set[str]:
    """The custom_ids of the lines a resumed job already answered: a repeat after the
    resume point is still refused."""
    seen: set[str] = set()
    for number, raw in input_lines(path, 0):
        if number > stop:
            break
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("custom_id"), str):
            seen.add(record["custom_id"])
    return seen
