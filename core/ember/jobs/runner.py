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
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ember import tracing
from ember.capabilities import Output
from ember.chunking import Chunking
from ember.config import ServerSettings
from ember.engine import Engine, EngineArray
from ember.engine.requests import EmbedRequest
from ember.errors import BadRequest, ConfigError
from ember.families.registry import Family
from ember.jobs.chunked import ChunkRows, per_input
from ember.jobs.inputs import InputSpec, Row
from ember.jobs.lock import hold_output
from ember.jobs.refusals import embed_each, split_refused
from ember.jobs.shards import embedding_array, rows_table
from ember.jobs.writer import JobRun, JobSummary, LayOut
from ember.lanes import bulk_by_default
from ember.models.spec import ModelSpec
from ember.outputs import embeds

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
# A chunked job's window counts chunks: each queues as an input of its own (a late chunk's
# tokens go in windows of the model's length, about as many tokens as its chunks). English
# runs 4-5 characters per token with WordPiece and BPE vocabularies.
CHARS_PER_TOKEN = 4
CHUNK_TOKENS_UNSIZED = 256  # a Chunking of the model's own size (the job always sets one)
# The job's own queue limit when it chunks: the window bounds what is queued, and a text's
# chunks are known only once it is tokenised (one book can be thousands).
CHUNKED_QUEUE = 1 << 30
# A job's inputs are not requests: none should expire while thousands queue ahead of it.
JOB_REQUEST_TIMEOUT = 7 * 24 * 3600.0


@dataclass(frozen=True)
class JobOptions:
    """What to compute and how to write it (the model comes from ``ServerSettings``)."""

    output: Path | str  # a directory, or an object-store URI (s3://bucket/prefix)
    output_kind: Output | None = None  # dense | sparse | multi; default: the model's own
    normalize: bool | None = None  # default: the model's
    dimensions: int | None = None
    prompt_name: str | None = None
    shard_rows: int | None = None  # None: SHARD_ROWS in-process; on Ray, sized to the cluster
    in_flight: int = IN_FLIGHT
    chunk_rows: int = CHUNK_ROWS
    overwrite: bool = False
    progress: bool = True
    truncate: bool = True  # off: a row past the model's maximum is refused (_errors.jsonl)
    chunking: Chunking | None = None  # a row per chunk of each input (jobs.chunked)

    @property
    def shard_size(self) -> int:
        """Rows per shard in one process: the given size, else ``SHARD_ROWS``."""
        return self.shard_rows or SHARD_ROWS

    def embed_request(self, output: Output | None = None) -> EmbedRequest:
        """The engine request every chunk is embedded with (its own inputs put in)."""
        return EmbedRequest(
            (),
            output=output,
            normalize=self.normalize,
            dimensions=self.dimensions,
            prompt_name=self.prompt_name,
            truncate=self.truncate,
            chunking=self.chunking,
        )


def job_settings(settings: ServerSettings, options: JobOptions) -> ServerSettings:
    """Serve settings turned to a job: its window is the queue, and nothing times out."""
    if len(settings.model_specs()) != 1:
        raise ConfigError("ember embed runs one model; pass one --model-id")
    return settings.model_copy(
        update={
            "max_queue_size": str(
                max(options.in_flight, options.chunk_rows)
                if options.chunking is None
                else CHUNKED_QUEUE
            ),
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
    request: EmbedRequest | None = None,
    on_rows: Callable[[int], object] | None = None,
    refuse_rows: bool = False,
) -> AsyncIterator[tuple[list[Any], list[Any]]]:
    """(ids, embeddings) of ``shard_rows`` rows at a time (the last may be shorter), in
    the order ``rows`` gives them, with up to ``in_flight`` inputs queued ahead (with
    chunking: about that many chunks, ``chunks_weighed``). With ``refuse_rows`` a row the
    model refuses is a ``Refused`` among the embeddings (``jobs.refusals``) instead of the
    call's error."""
    base = replace(request or EmbedRequest(()), output=output)  # each chunk's options
    values_of = _values_of(base)
    weigh = (lambda text: 1) if base.chunking is None else partial(chunks_weighed, base.chunking)
    source = iter(rows)
    window: deque[tuple[list[Any], list[str], int, asyncio.Task[Any]]] = deque()
    queued = 0
    held: list[Row] = []  # rows read that would pass the window: the next call's
    ids: list[Any] = []
    values: list[Any] = []
    try:
        while True:
            while True:
                part = held or list(itertools.islice(source, chunk_rows))
                if not part:
                    break
                weight = sum(weigh(text) for _, text in part)
                if window and queued + weight > in_flight:
                    held = part
                    break
                held = []
                texts = [text for _, text in part]
                call = engine.embed(replace(base, inputs=texts))
                call = tracing.traced(tracing.JOB_SPAN, call)  # a span per chunk, if on
                chunk_ids = [row_id for row_id, _ in part]
                window.append((chunk_ids, texts, weight, asyncio.ensure_future(call)))
                queued += weight
            if not window:
                break
            chunk_ids, texts, weight, task = window.popleft()
            try:
                outputs = values_of(await task)
            except BadRequest:
                if not refuse_rows:
                    raise
                outputs = await embed_each(texts, partial(_embed_one, engine, base, values_of))
            queued -= weight
            ids.extend(chunk_ids)
            values.extend(outputs)
            if on_rows is not None:
                on_rows(len(chunk_ids))
            while len(ids) >= shard_rows:
                yield ids[:shard_rows], values[:shard_rows]
                ids, values = ids[shard_rows:], values[shard_rows:]
        if ids:
            yield ids, values
    finally:
        for *_, task in window:  # an error or a cancelled job: drop what is still queued
            task.cancel()
        await asyncio.gather(*(task for *_, task in window), return_exceptions=True)


def chunks_weighed(chunking: Chunking, text: str) -> int:
    """About how many chunks ``text`` queues (it is tokenised only in the engine): one per
    ``size - overlap`` tokens at ``CHARS_PER_TOKEN``. Text of fewer characters per token
    queues more than weighed, which the job's queue takes (``job_settings``)."""
    step = (chunking.size or CHUNK_TOKENS_UNSIZED) - chunking.overlap
    return max(1, -(-len(text) // (CHARS_PER_TOKEN * step)))


def _values_of(request: EmbedRequest) -> Callable[[Any], Sequence[Any]]:
    """A call's answer as one value per input: the payload, or each input's chunks."""
    if request.chunking is None:
        return lambda result: result.outputs
    return lambda result: per_input(result.output)


async def _embed_one(
    engine: Engine, base: EmbedRequest, values_of: Callable[[Any], Sequence[Any]], text: str
) -> Any:
    return values_of(await engine.embed(replace(base, inputs=[text])))[0]


def job_identity(
    spec: ModelSpec, source: InputSpec, output: str | None, options: JobOptions
) -> dict[str, Any]:
    """What must not change between a run and its resume (a mix would be one dataset of
    two jobs): the input file, its columns, the model and what is computed from it."""
    return {  # the input's content is checked row by row instead (jobs.digests)
        "input": source.identity,
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
        # only when off: a checkpoint written before the flag existed resumes as it was
        **({} if options.truncate else {"truncate": False}),
        **({} if options.chunking is None else {"chunking": asdict(options.chunking)}),
    }


def open_run(
    spec: ModelSpec,
    source: InputSpec,
    output: str,
    options: JobOptions,
    shard_rows: int | None = None,
) -> JobRun:
    """The run over ``options.output`` for this job, as in-process and Ray open it: the
    same identity, so either resumes the other's output (shards may differ in size)."""
    return JobRun(
        source,
        options.output,
        job_identity(spec, source, output, options),
        shard_rows=shard_rows or options.shard_size,
        overwrite=options.overwrite,
        progress=options.progress,
    )


def choose_output(engine: Engine, wanted: Output | None) -> Output:
    """The embedding to compute: the one asked for, if the model has it, else its own."""
    return output_of(engine.family, engine.name, wanted)


def output_of(kind: Family, name: str, wanted: Output | None) -> Output:
    """``choose_output`` from the model's family (a Ray driver resolves it, loads nothing)."""
    output = wanted or kind.embedding
    if output is None or not embeds(output):
        raise BadRequest(f"model {name!r} ({kind.name}) does not embed; it serves {kind.serves()}")
    kind.require_output(output, name)
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


@bulk_by_default
async def _embed_held(engine: Engine, source: InputSpec, options: JobOptions) -> JobSummary:
    """``run_embed_job`` once this process holds the output directory."""
    output = choose_output(engine, options.output_kind)
    request = options.embed_request(output)
    # The options are tried once first: one the model cannot take (dimensions past its
    # size) fails the job here, not every row into the dead-letter file.
    # With chunking, the probe is where a model that cannot chunk is refused, in one line.
    probe = await engine.embed(replace(request, inputs=["ember"]))
    column_of, lay_out = _layout(output, options.chunking, probe)
    run = open_run(engine.spec, source, output, options)
    if run.finished:
        return run.finish()
    try:
        async for ids, values in embed_rows(
            engine,
            run.rows,
            output=output,
            shard_rows=options.shard_size,
            in_flight=options.in_flight,
            chunk_rows=options.chunk_rows,
            request=request,
            on_rows=run.bar.update,
            refuse_rows=True,
        ):
            good, refused = split_refused(values)
            # Parquet encoding and fsync off the loop: the batcher keeps being fed meanwhile.
            await asyncio.to_thread(run.write, ids, column_of(good), refused, lay_out)
    finally:
        run.close()
    return run.finish()


def _layout(
    output: Output, chunking: Chunking | None, probe: Any
) -> tuple[Callable[[list[Any]], Any], LayOut]:
    """How a shard's embedded values become its table: an Arrow column of whole rows (its
    type from the probe, for a shard whose rows are all refused), or rows per chunk."""
    if chunking is None:
        empty = embedding_array(output, probe.outputs)[:0]
        return (lambda good: embedding_array(output, good) if good else empty), rows_table
    width = probe.output.chunks[0].shape[1]
    return (lambda good: good), ChunkRows(width, chunking.text)


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
