"""``ShardWorker``: the Ray actor that does one shard of ``ember embed --ray`` end to end.

It reads its rows from the input (a file every node sees, or ``s3://``), takes their
digest, embeds them through its own engine (``Embedder``: the model loaded once), and
writes the shard's Parquet file into the output's staging area itself. The driver gets
back only what its checkpoint records (start, rows, digest, dead letters, the node): no
text and no vector crosses to it, so it stays a planner however many workers there are.

Two shards run at once in each worker (``CONCURRENT_SHARDS``): while one is in its last
batches, reading its file or writing its Parquet, the next one already fills the batcher.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from ember.errors import ConfigError
from ember.jobs.digests import rows_digest
from ember.jobs.inputs import InputSpec
from ember.jobs.refusals import split_refused
from ember.jobs.shards import STAGING, Staged, embedding_array
from ember.jobs.store import Store
from ember.jobs.writer import shard_parts

CONCURRENT_SHARDS = 2


@dataclass(frozen=True)
class ShardTask:
    """One planned shard: rows ``start`` to ``start + rows`` of the input, written under
    the staging name ``file``; ``offset``: where row ``start`` begins (line formats)."""

    index: int
    start: int
    rows: int
    file: str
    offset: int | None = None


@dataclass(frozen=True)
class ShardDone:
    """What a worker hands back for a shard: its checkpoint entry, and where it ran."""

    index: int
    staged: Staged
    node: str
    seconds: float


class ShardWorker:
    """Embeds whole shards, reading and writing the store itself (see the module)."""

    def __init__(
        self,
        embedder: dict[str, Any],
        source: InputSpec,
        output: str,
        id_type: Any,
        probe: str | None,
    ) -> None:
        import ray

        from ember.ray.embedder import Embedder

        self.node = ray.get_runtime_context().get_node_id()
        self.source, self.store, self.id_type = source, Store.of(output), id_type
        self._check_sees(probe)
        self.embedder = Embedder(**embedder)

    def _check_sees(self, probe: str | None) -> None:
        """Refuse at start, naming the node, when this node cannot see the input or the
        output the driver sees (a local path that is not on shared storage)."""
        try:
            with self.source.open():
                pass
        except OSError as exc:
            raise ConfigError(
                f"Ray node {self.node[:8]} cannot read the input {self.source.path} ({exc}); "
                "put it where every node sees it (a shared directory, or s3://...)"
            ) from None
        if probe is not None and not self.store.exists(f"{STAGING}/{probe}"):
            raise ConfigError(
                f"Ray node {self.node[:8]} does not see the output {self.store} the driver "
                "writes; use storage every node sees (a shared directory, or s3://...)"
            )

    def ready(self) -> str:
        """The node this worker runs on, once its model is loaded."""
        return self.node

    def run(self, task: ShardTask) -> ShardDone:
        """Read, embed and write one shard; its checkpoint entry back."""
        started = time.perf_counter()
        stop = task.start + task.rows
        rows = list(itertools.islice(self.source.rows(task.start, stop, task.offset), task.rows))
        if len(rows) < task.rows:
            raise ConfigError(
                f"{self.source.name} changed while the job ran: it has "
                f"{task.start + len(rows)} rows, fewer than the {stop} planned; run the same "
                "command again to resume"
            )
        ids = [row_id for row_id, _ in rows]
        in_flight = max(self.embedder.chunk_rows, self.embedder.in_flight // CONCURRENT_SHARDS)
        values = self.embedder.embed([text for _, text in rows], in_flight=in_flight)
        good, refused = split_refused(values)
        column = embedding_array(self.embedder.output, good) if good else self.embedder.empty
        table, errors = shard_parts(ids, column, refused, self.id_type, task.start)
        self.store.write_table(f"{STAGING}/{task.file}", table)
        staged = Staged(task.file, task.start, task.rows, rows_digest(rows), tuple(errors))
        return ShardDone(task.index, staged, self.node, time.perf_counter() - started)
