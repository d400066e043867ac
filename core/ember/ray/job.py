"""``ember embed INPUT --output DIR --ray [ADDRESS]``: the corpus job with its shards
embedded by a pool of Ray actors.

Everything but the embedding is the in-process job's (``jobs.writer.JobRun``): the same
checkpoint, digests, shard files, dead letters and summary, so either job resumes the
other's output. The driver reads the input (it has to: digests), puts each shard's texts in
Ray's object store and hands them out through a small ``_Feed`` actor; a Ray Data pipeline
takes them one shard a block (``_take``), embeds each on an ``Embedder`` actor, and comes
back to the driver in input order, which writes it. Nothing needs a shared filesystem: text
goes out and vectors come back through the object store, and only the driver writes.

A killed worker: Ray restarts the actor and runs its shard again (Ray Data's actor pools
retry their tasks), so every row is written once. A killed driver: the cluster it started
goes with it, and the same command resumes from the checkpoint, as in-process. The feeder
keeps at most ``window`` shards in the object store ahead of the one being written.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from ember.config import ServerSettings
from ember.errors import ConfigError, EmberError
from ember.jobs.inputs import InputSpec
from ember.jobs.lock import hold_output
from ember.jobs.runner import JobOptions, _check_rows, job_settings, open_run, output_of
from ember.jobs.writer import JobRun, JobSummary
from ember.ray.embedder import Embedder, default_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayOptions:
    """Where and on how many workers: ``address`` None or "" starts a local cluster sized
    to the machine (or joins ``RAY_ADDRESS``), else joins the cluster there."""

    address: str | None = None
    workers: int | None = None  # default: as many as the cluster has room for
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0


@ray.remote(num_cpus=0)
class _Feed:
    """The driver's shards, by number, until each is written: a read task waits here for
    its shard, a retried one finds it again."""

    def __init__(self) -> None:
        import asyncio

        self._shards: dict[int, Any] = {}
        self._ready: dict[int, asyncio.Event] = {}

    def _event(self, index: int) -> Any:
        import asyncio

        return self._ready.setdefault(index, asyncio.Event())

    async def put(self, index: int, shard: list[Any]) -> None:
        self._shards[index] = shard  # [ObjectRef]: a list, so the ref is not resolved
        self._event(index).set()

    async def take(self, index: int) -> list[Any]:
        await self._event(index).wait()
        return self._shards[index]

    async def drop(self, index: int) -> None:
        self._shards.pop(index, None)
        self._ready.pop(index, None)


def _take(feed: Any) -> Any:
    """The read step: a block ``{"shard": [k]}`` in, shard k's texts out."""

    def take(batch: pa.Table) -> Iterator[pa.Table]:
        for index in batch.column("shard").to_pylist():
            ref = ray.get(feed.take.remote(index))[0]
            if ref is None:
                raise RuntimeError(f"the driver could not read shard {index} of the input")
            yield ray.get(ref)

    return take


def embed_on_ray(
    settings: ServerSettings, source: InputSpec, options: JobOptions, on: RayOptions
) -> JobSummary:
    """Run the job on a Ray cluster (started here when none is named, stopped at the end).
    The summary's ``seconds`` include starting the cluster and the workers' model loading
    (in-process, loading is not in them)."""
    from ember.families.resolve import resolve_model

    _check_rows(source)
    with hold_output(options.output):
        spec = job_settings(settings, options).model_specs()[0]
        model = resolve_model(spec)  # the model's files and family: no weights loaded
        output = output_of(model.family, model.served_name, options.output_kind)
        _check_options(model, output, options)
        run = open_run(spec, source, output, options)
        if run.finished:
            return run.finish()
        try:
            with cluster(on.address):
                _embed(run, settings, options, output, on)
        except ray.exceptions.RayError as exc:  # a worker's own error: said as in-process
            cause = _ember_cause(exc)
            if cause is None:
                raise
            raise cause from None
        finally:
            run.close()
        return run.finish()


def _check_options(model: Any, output: str, options: JobOptions) -> None:
    """What the in-process job's first call would refuse, refused before any worker starts
    (a worker's failed start reaches the driver as Ray's error, not the model's reason)."""
    from ember.errors import BadRequest
    from ember.outputs import check_dimensions, is_dense

    if options.dimensions is not None:
        if not is_dense(output):  # type: ignore[arg-type]
            raise BadRequest(f"--dimensions applies to dense embeddings, not {output}")
        check_dimensions(options.dimensions, model.hidden_size)
    if options.prompt_name is not None and options.prompt_name not in model.prompts:
        raise BadRequest(
            f"prompt_name {options.prompt_name!r} is not one of this model's prompts "
            f"{sorted(model.prompts) or '(none)'}"
        )


def _ember_cause(exc: BaseException) -> EmberError | None:
    """The Ember error a Ray error wraps (a worker's bad model, say), if it is one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, EmberError):
            return current
        seen.add(id(current))
        current = getattr(current, "cause", None) or current.__cause__ or current.__context__
    return None


@contextmanager
def cluster(address: str | None) -> Iterator[None]:
    """Connected to Ray for the block: a session already open in this process is used as
    it is; else ``address`` (or ``RAY_ADDRESS``) is joined, or a local cluster started,
    and left (stopped, if started here) at the end."""
    if ray.is_initialized():
        yield
        return
    local = not address and not os.environ.get("RAY_ADDRESS")  # Ray's own variable
    ray.init(
        address=address or None,
        # a cluster of this machine only: its servers listen on loopback
        **({"_node_ip_address": "127.0.0.1"} if local else {}),
        include_dashboard=False,
        log_to_driver=False,  # the workers' model-loading chatter; errors come back raised
        logging_level=logging.WARNING,
    )
    try:
        yield
    finally:
        ray.shutdown()


def _embed(
    run: JobRun, settings: ServerSettings, options: JobOptions, output: str, on: RayOptions
) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    workers = on.workers or default_workers(on.cpus_per_worker, on.gpus_per_worker)
    shards = -(-run.rows_left // options.shard_rows)
    if shards < 1:  # killed between its last shard and marking the dataset complete
        return
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    feed = _Feed.options(scheduling_strategy=here).remote()
    window = 2 * workers + 1  # shards in the object store: each worker's next one waiting
    feeder = _Feeder(run, feed, shards, window)

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # blocks come back in input order
    ctx.enable_progress_bars = False  # the job's own bar counts rows written
    ctx.execution_no_progress_timeout_s = -1  # a shard may take long on a slow model
    ds = ray.data.from_items([{"shard": k} for k in range(shards)], override_num_blocks=shards)
    ds = ds.map_batches(
        _take(feed),
        batch_size=None,
        batch_format="pyarrow",
        compute=ray.data.TaskPoolStrategy(size=window),
        num_cpus=0,  # waits on the feed; the CPUs are the workers'
    )
    ds = ds.map_batches(
        Embedder,
        fn_constructor_kwargs={
            "settings": settings,
            "column": "text",
            "output": output,
            "normalize": options.normalize,
            "dimensions": options.dimensions,
            "prompt_name": options.prompt_name,
            "truncate": options.truncate,
            "keep_columns": ["position"],
            "in_flight": options.in_flight,
            "chunk_rows": options.chunk_rows,
        },
        batch_size=None,  # a shard a call: the batcher groups from all of it
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=on.cpus_per_worker,
        num_gpus=on.gpus_per_worker,
    )
    feeder.start()
    try:
        _write(run, feeder, ds.iter_batches(batch_size=None, batch_format="pyarrow"), feed)
    except Exception:
        if feeder.error is not None:  # the input's fault (a bad row), said as in-process
            raise feeder.error from None
        raise
    finally:
        feeder.stop()
    if feeder.error is not None:
        raise feeder.error


def _write(run: JobRun, feeder: _Feeder, blocks: Iterator[pa.Table], feed: Any) -> None:
    """Cut the embedded rows coming back into the shards the feeder read, in order."""
    held: list[pa.Table] = []
    rows = 0
    for block in blocks:
        held.append(block)
        rows += block.num_rows
        while feeder.pending and rows >= len(feeder.pending[0][1]):
            index, ids = feeder.pending.popleft()
            table = pa.concat_tables(held) if len(held) > 1 else held[0]
            shard, rest = table.slice(0, len(ids)), table.slice(len(ids))
            held, rows = ([rest] if rest.num_rows else []), rest.num_rows
            _write_shard(run, ids, shard)
            feeder.written(index)
            feed.drop.remote(index)
    if rows or any(ids for _, ids in feeder.pending):
        raise ConfigError("the Ray pipeline returned other rows than the job sent it")


def _write_shard(run: JobRun, ids: list[Any], shard: pa.Table) -> None:
    start = run.checkpoint.rows_done
    positions = shard.column("position")
    if len(ids) and (
        positions[0].as_py() != start or positions[-1].as_py() != start + len(ids) - 1
    ):
        raise ConfigError(
            f"the Ray pipeline returned rows {positions[0]}.. for the shard at row {start}"
        )
    errors = shard.column("error").combine_chunks()
    ok = pc.is_null(errors)
    embeddings = shard.column("embedding").combine_chunks().filter(ok)
    refused = [(i, e) for i, e in enumerate(errors.to_pylist()) if e is not None]
    if ids:
        run.write(ids, embeddings, refused)
    run.bar.update(len(ids))


class _Feeder(threading.Thread):
    """Reads the input on the driver, shard by shard, into the object store and the feed
    (at most ``window`` shards ahead of the one written); ``pending`` holds the ids of
    each shard sent and not yet written, for the writer."""

    def __init__(self, run: JobRun, feed: Any, shards: int, window: int) -> None:
        super().__init__(name="ember-ray-feeder", daemon=True)
        self.run_, self.feed, self.shards, self.window = run, feed, shards, window
        self.pending: deque[tuple[int, list[Any]]] = deque()
        self.error: BaseException | None = None
        self._room = threading.Condition()
        self._written = 0
        self._stopped = False

    def written(self, index: int) -> None:
        with self._room:
            self._written = index + 1
            self._room.notify()

    def stop(self) -> None:
        with self._room:
            self._stopped = True
            self._room.notify()

    def run(self) -> None:
        rows = iter(self.run_.rows)
        start = self.run_.checkpoint.rows_done
        index = 0
        try:
            for index in range(self.shards):
                with self._room:
                    self._room.wait_for(
                        lambda i=index: self._stopped or i < self._written + self.window
                    )
                    if self._stopped:
                        return
                part = list(itertools.islice(rows, self.run_.shard_rows))
                table = pa.table(
                    {
                        "position": pa.array(range(start, start + len(part)), pa.int64()),
                        "text": pa.array([text for _, text in part], pa.string()),
                    }
                )
                start += len(part)
                self.pending.append((index, [row_id for row_id, _ in part]))
                self.feed.put.remote(index, [ray.put(table)])
        except BaseException as exc:  # the writer re-raises it
            self.error = exc
            log.debug("reading the input failed", exc_info=True)
            for waiting in range(index, self.shards):  # their read steps fail, so does the run
                self.feed.put.remote(waiting, [None])
