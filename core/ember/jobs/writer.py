"""The output side of one run of the corpus job, wherever its vectors are computed.

In-process (``runner``) and on Ray (``ember.ray``) a run does the same here: open the
dataset's checkpoint (refusing another job's), check the rows already embedded against
their digests, hand out the rows still to embed (each shard's digest taken as they are
read), write each shard as its vectors come back, in input order, with its refused rows
in the dead-letter file, and say what it did. Only where ``write``'s vectors come from
differs, so either can resume the other's output.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.jobs.digests import ShardDigests, verify_rows
from ember.jobs.inputs import InputSpec
from ember.jobs.refusals import dead_letters
from ember.jobs.shards import Checkpoint, Dataset, id_type_of, rows_table

log = logging.getLogger(__name__)

# (ids kept, their values, id type) -> a shard's Arrow table: ``rows_table`` for whole rows
# (the values an Arrow column), ``jobs.chunked.ChunkRows`` for a chunked job's.
LayOut = Callable[[Sequence[Any], Any, Any], Any]


@dataclass(frozen=True)
class JobSummary:
    output: Path | str
    rows: int  # input rows done: embedded into the dataset, or refused
    rows_this_run: int
    seconds: float  # of this run's embedding, model loading excluded
    shards: int
    resumed_from: int  # rows already done when this run started
    errors: int = 0  # rows refused by the model (in ``_errors.jsonl``), of ``rows``
    # What only a Ray run says: its start (cluster, workers' model loads: not in
    # ``seconds``), the driver's own CPU seconds, and the rows each node's workers embedded.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> dict[str, Any]:
        """The summary ``ember embed`` prints."""
        return {
            "output": str(self.output),
            "rows": self.rows,
            "rows_this_run": self.rows_this_run,
            "errors": self.errors,
            "resumed_from": self.resumed_from,
            "shards": self.shards,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            **self.extra,
        }


class JobRun:
    """One run over ``output`` (held by the caller: ``jobs.lock``): ``rows`` to embed,
    ``write`` per shard of them, ``finish`` at the end; ``finished`` already when the
    dataset is complete and the input has no rows past it."""

    def __init__(
        self,
        source: InputSpec,
        output: Path | str,
        job: dict[str, Any],
        *,
        shard_rows: int,
        overwrite: bool = False,
        progress: bool = True,
    ) -> None:
        from tqdm import tqdm

        self.source, self.output, self.shard_rows = source, output, shard_rows
        self.dataset = Dataset(output)
        self.checkpoint = checkpoint = self.dataset.open(job, overwrite=overwrite)
        self.resumed_from = done = checkpoint.rows_done
        verify_rows(source.rows(0, done), checkpoint.shards, source.name, output)
        self.finished = checkpoint.complete
        if checkpoint.complete:
            if next(iter(source.rows(done, done + 1)), None) is None:
                log.info("%s is complete (%d rows); nothing to do", output, done)
            else:
                log.info("%s has rows past the %d embedded: embedding them", source.path, done)
                self.finished = checkpoint.complete = False
                checkpoint.total_rows = None
        if checkpoint.total_rows is None and not self.finished:
            checkpoint.total_rows = source.count_rows()
            self.dataset.save(checkpoint)
        self.id_type = _id_type(self.dataset, checkpoint)
        self.rows = ShardDigests(source.rows(start=done), shard_rows)
        self.bar = tqdm(
            total=checkpoint.total_rows,
            initial=done,
            unit="row",
            desc="embed",
            disable=not progress or self.finished,
            smoothing=0.05,
            dynamic_ncols=True,
        )
        self.started = time.perf_counter()

    @property
    def rows_left(self) -> int:
        """Rows still to embed, as counted when the run began."""
        return (self.checkpoint.total_rows or 0) - self.checkpoint.rows_done

    def write(
        self,
        ids: Sequence[Any],
        embeddings: Any,
        refused: Sequence[tuple[int, str]] = (),
        lay_out: LayOut = rows_table,
    ) -> None:
        """The next shard: the rows ``ids`` (as ``rows`` gave them), ``embeddings`` the
        Arrow column of those not ``refused`` ((index in ``ids``, error) each), or what
        ``lay_out`` takes instead (a chunked job's values: ``jobs.chunked``)."""
        self.id_type = self.id_type or id_type_of(ids[:1000])
        table, errors = shard_parts(
            ids, embeddings, refused, self.id_type, self.checkpoint.rows_done, lay_out
        )
        self.dataset.write_shard(
            self.checkpoint, table, self.rows.next_digest(), errors, rows=len(ids)
        )

    def finish(self) -> JobSummary:
        """Mark the dataset complete (rows past a resume may have been added meanwhile)."""
        self.bar.close()
        seconds = 0.0 if self.finished else time.perf_counter() - self.started
        checkpoint = self.checkpoint
        if not self.finished:
            checkpoint.complete = True
            checkpoint.total_rows = checkpoint.rows_done
            self.dataset.save(checkpoint)
            self.finished = True
        rows = checkpoint.rows_done
        return JobSummary(
            self.output,
            rows,
            rows - self.resumed_from,
            seconds,
            len(checkpoint.shards),
            self.resumed_from,
            checkpoint.errors,
        )

    def close(self) -> None:
        self.bar.close()


def shard_parts(
    ids: Sequence[Any],
    embeddings: Any,
    refused: Sequence[tuple[int, str]],
    id_type: Any,
    start: int,
    lay_out: LayOut = rows_table,
) -> tuple[Any, list[dict[str, Any]]]:
    """A shard's (id, embedding) table (or ``lay_out``'s) and the dead letters of its
    refused rows, the shard beginning at input row ``start``: the one recipe in-process and
    Ray workers write by."""
    gone = {i for i, _ in refused}
    kept = [row_id for i, row_id in enumerate(ids) if i not in gone] if gone else ids
    return lay_out(kept, embeddings, id_type), dead_letters(ids, start, refused)


def _id_type(dataset: Dataset, checkpoint: Checkpoint) -> Any:
    """The id type earlier shards were written with (None before the first)."""
    if not checkpoint.shards:
        return None
    return dataset.store.read_schema(checkpoint.shards[0].name).field("id").type
