"""The corpus job: rows in, embeddings out, through the served model's own engine in-process.

Why in-process: the server's batcher is what makes Ember fast (batches formed across
requests, grouped by length); the job feeds it directly, with no HTTP or JSON in between.
It keeps the batcher full: up to ``in_flight`` inputs are submitted ahead in chunks, so
every forward worker finds a batch waiting, and the batcher picks from thousands of
queued texts, which pads less than any one request would. Memory stays bounded by
``in_flight`` (queued tokens) plus one shard of results. Chunks are awaited in the order
they were read, so rows come out in input order, whatever order batches finish in.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember import tracing
from ember.capabilities import Output
from ember.config import ServerSettings
from ember.engine import Engine, EngineArray
from ember.errors import BadRequest, ConfigError
from ember.jobs.digests import ShardDigests, verify_rows
from ember.jobs.inputs import InputSpec, Row
from ember.jobs.lock import hold_output
from ember.jobs.shards import Checkpoint, Dataset, id_type_of, shard_table
from ember.models.spec import ModelSpec

log = logging.getLogger(__name__)

# Inputs per engine call. The batcher regroups them across calls, so this only trades
# per-call overhead (one future per input either way) against how finely the window moves.
CHUNK_ROWS = 64
# Inputs submitted ahead of the oldest unanswered one: enough for every forward worker to
# find full, length-grouped batches (the batcher picks among all of them), small enough
# to hold only tokens: 4096 sentences of 128 tokens are 2 MiB of ids. Measured on 2 CPU
# cores (benchmarks/job_window.py): torch spent 10% less CPU per sentence in the ~27-row
# batches this forms than in the ~10-row ones a 128 window forms, onnx the same, ct2 int8
# 30% more (its forwards favour small batches there): ct2 jobs pass --in-flight 128.
IN_FLIGHT = 4096
SHARD_ROWS = 10_000
# A job's inputs are not requests: none should expire while thousands queue ahead of it.
JOB_REQUEST_TIMEOUT = 7 * 24 * 3600.0


@dataclass(frozen=True)
class JobOptions:
    """What to compute and how to write it (the model comes from ``ServerSettings``)."""

    output: Path
    output_kind: Output | None = None  # dense | sparse | multi; default: the model's own
    normalize: bool | None = None  # default: the model's
    dimensions: int | None = None
    prompt_name: str | None = None
    shard_rows: int = SHARD_ROWS
    in_flight: int = IN_FLIGHT
    chunk_rows: int = CHUNK_ROWS
    overwrite: bool = False
    progress: bool = True


@dataclass(frozen=True)
class JobSummary:
    output: Path
    rows: int  # in the dataset now
    rows_this_run: int
    seconds: float  # of this run's embedding, model loading excluded
    shards: int
    resumed_from: int  # rows already written when this run started

    @property
    def rows_per_second(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else 0.0


def job_settings(settings: ServerSettings, options: JobOptions) -> ServerSettings:
    """Serve settings turned to a job: its window is the queue, and nothing times out."""
    if len(settings.model_specs()) != 1:
        raise ConfigError("ember embed runs one model; pass one --model-id")
    return settings.model_copy(
        update={
            "max_queue_size": str(max(options.in_flight, options.chunk_rows)),
            "request_timeout": JOB_REQUEST_TIMEOUT,
        }
    )


async def embed_rows(
    engine: Engine,
    rows: Iterable[Row],
    *,
    output: Output,
    shard_rows: int,
    in_flight: int = IN_FLIGHT,
    chunk_rows: int = CHUNK_ROWS,
    embed_options: dict[str, Any] | None = None,
    on_rows: Callable[[int], object] | None = None,
) -> AsyncIterator[tuple[list[Any], list[Any]]]:
    """(ids, embeddings) of ``shard_rows`` rows at a time (the last may be shorter), in
    the order ``rows`` gives them, with up to ``in_flight`` inputs queued ahead."""
    options = embed_options or {}
    source = iter(rows)
    window: deque[tuple[list[Any], asyncio.Task[Any]]] = deque()
    queued = 0
    exhausted = False
    ids: list[Any] = []
    values: list[Any] = []
    try:
        while True:
            while not exhausted and (not window or queued + chunk_rows <= in_flight):
                part = list(itertools.islice(source, chunk_rows))
                if not part:
                    exhausted = True
                    break
                texts = [text for _, text in part]
                call = engine.embed(texts, output=output, **options)
                call = tracing.traced(tracing.JOB_SPAN, call)  # a span per chunk, if on
                window.append(([row_id for row_id, _ in part], asyncio.ensure_future(call)))
                queued += len(part)
            if not window:
                break
            chunk_ids, task = window.popleft()
            result = await task
            queued -= len(chunk_ids)
            ids.extend(chunk_ids)
            values.extend(result.outputs)
            if on_rows is not None:
                on_rows(len(chunk_ids))
            while len(ids) >= shard_rows:
                yield ids[:shard_rows], values[:shard_rows]
                ids, values = ids[shard_rows:], values[shard_rows:]
        if ids:
            yield ids, values
    finally:
        for _, task in window:  # an error or a cancelled job: drop what is still queued
            task.cancel()
        await asyncio.gather(*(task for _, task in window), return_exceptions=True)


def job_identity(
    spec: ModelSpec, source: InputSpec, output: str | None, options: JobOptions
) -> dict[str, Any]:
    """What must not change between a run and its resume (a mix would be one dataset of
    two jobs): the input file, its columns, the model and what is computed from it."""
    return {  # the input's content is checked row by row instead (jobs.digests)
        "input": str(source.path.resolve()),
        "format": source.format,
        "text_column": source.text_column,
        "id_column": source.id_column,
        "model": spec.model_id or "(the packaged default)",
        "revision": spec.revision,
        "backend": spec.backend,
        "dtype": spec.dtype,
        "pooling": spec.pooling,
        "output": output,
        "normalize": options.normalize,
        "dimensions": options.dimensions,
        "prompt_name": options.prompt_name,
    }


def choose_output(engine: Engine, wanted: Output | None) -> Output:
    """The embedding to compute: the one asked for, if the model has it, else its own."""
    kind = engine.family
    output = wanted or kind.embedding
    if output is None or output == "logits":
        raise BadRequest(
            f"model {engine.name!r} ({kind.name}) does not embed; it serves {kind.serves()}"
        )
    kind.require_output(output, engine.name)
    return output


def _check_rows(source: InputSpec) -> None:
    """A missing column or an empty input fails before the model loads or the output is
    made (a dataset of no shards would read as nothing)."""
    if next(iter(source.rows(0, 1)), None) is None:
        raise ConfigError(f"{source.path} has no rows to embed")


async def run_embed_job(engine: Engine, source: InputSpec, options: JobOptions) -> JobSummary:
    """Embed ``source`` into the Parquet dataset ``options.output``, continuing from its
    checkpoint when it holds an earlier run of the same job over the same rows."""
    _check_rows(source)
    with hold_output(options.output):
        return await _embed_held(engine, source, options)


async def _embed_held(engine: Engine, source: InputSpec, options: JobOptions) -> JobSummary:
    """``run_embed_job`` once this process holds the output directory."""
    from tqdm import tqdm

    output = choose_output(engine, options.output_kind)
    dataset = Dataset(options.output)
    checkpoint = dataset.open(
        job_identity(engine.spec, source, output, options), overwrite=options.overwrite
    )
    done = checkpoint.rows_done
    verify_rows(source.rows(0, done), checkpoint.shards, source.path.name, options.output)
    if checkpoint.complete:
        if next(iter(source.rows(done, done + 1)), None) is None:
            log.info("%s is complete (%d rows); nothing to do", options.output, done)
            return JobSummary(options.output, done, 0, 0.0, len(checkpoint.shards), done)
        log.info("%s has rows past the %d embedded: embedding them", source.path.name, done)
        checkpoint.complete, checkpoint.total_rows = False, None
    if checkpoint.total_rows is None:
        checkpoint.total_rows = source.count_rows()
        dataset.save(checkpoint)
    id_type = _id_type(dataset, checkpoint)
    embed_options = {
        "normalize": options.normalize,
        "dimensions": options.dimensions,
        "prompt_name": options.prompt_name,
    }
    bar = tqdm(
        total=checkpoint.total_rows,
        initial=done,
        unit="row",
        desc="embed",
        disable=not options.progress,
        smoothing=0.05,
        dynamic_ncols=True,
    )
    started = time.perf_counter()
    digested = ShardDigests(source.rows(start=done), options.shard_rows)
    try:
        async for ids, values in embed_rows(
            engine,
            digested,
            output=output,
            shard_rows=options.shard_rows,
            in_flight=options.in_flight,
            chunk_rows=options.chunk_rows,
            embed_options=embed_options,
            on_rows=bar.update,
        ):
            id_type = id_type or id_type_of(ids[:1000])
            table = shard_table(ids, output, values, id_type)
            # Parquet encoding and fsync off the loop: the batcher keeps being fed meanwhile.
            await asyncio.to_thread(dataset.write_shard, checkpoint, table, digested.next_digest())
    finally:
        bar.close()
    seconds = time.perf_counter() - started
    checkpoint.complete = True
    checkpoint.total_rows = checkpoint.rows_done  # rows past a resume may have been added
    dataset.save(checkpoint)
    rows = checkpoint.rows_done
    return JobSummary(options.output, rows, rows - done, seconds, len(checkpoint.shards), done)


def _id_type(dataset: Dataset, checkpoint: Checkpoint) -> Any:
    """The id type earlier shards were written with (None before the first)."""
    if not checkpoint.shards:
        return None
    import pyarrow.parquet as pq

    return pq.read_schema(dataset.dir / checkpoint.shards[0].name).field("id").type


async def _run(settings: ServerSettings, source: InputSpec, options: JobOptions) -> JobSummary:
    _check_rows(source)
    with hold_output(options.output):  # a second job on the directory stops before loading
        engines = EngineArray(job_settings(settings, options).model_specs())
        await engines.start()
        try:
            return await _embed_held(engines.get(None), source, options)
        finally:
            await engines.stop()


def embed_corpus(settings: ServerSettings, source: InputSpec, options: JobOptions) -> JobSummary:
    """Load the model, run the job to the end of the input, stop the model."""
    return asyncio.run(_run(settings, source, options))
