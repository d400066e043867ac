"""``ember embed INPUT --output DIR --ray [ADDRESS]``: the corpus job on a Ray cluster.

The driver plans and commits; the workers do everything else. It opens the output as the
in-process job does (``jobs.writer.JobRun``: checkpoint, the digests of the rows already
done), sizes shards to the cluster (``shard_rows_for``: several per worker, so none waits
and the last wave is short), and hands each ``ShardWorker`` actor (``ember.ray.worker``) two
shards at a time. A worker reads its rows from the input itself, embeds them and writes the
shard's Parquet file into the output's ``_staging/`` (a directory every node sees, or
``s3://``); the driver gets back the shard's digest and dead letters, gives the file its
place in input order by rename, and rewrites the checkpoint. It never holds a text or a
vector, so either job resumes the other's output, and the driver's own CPU stays a small
share (the summary says it: ``driver_cpu_s``, measured).

Failures: a worker, or a whole worker node, lost mid-shard: its shards go to the other
workers and a replacement is started where the cluster has room (every row once). Every
worker lost, or the cluster's head: the job ends with one line naming what was lost and
the rows kept; the same command resumes. A killed driver: the checkpoint names only whole
shards, and the resume deletes whatever it does not name.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
import resource
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from ember.config import ServerSettings
from ember.cpu import cpu_count
from ember.errors import ConfigError, EmberError
from ember.jobs.inputs import InputSpec
from ember.jobs.lock import hold_output
from ember.jobs.runner import (
    SHARD_ROWS,
    JobOptions,
    _check_rows,
    job_settings,
    open_run,
    output_of,
)
from ember.jobs.shards import STAGING, id_type_of
from ember.jobs.writer import JobRun, JobSummary
from ember.ray.embedder import default_workers
from ember.ray.worker import CONCURRENT_SHARDS, ShardDone, ShardTask, ShardWorker

log = logging.getLogger(__name__)

# Shards per worker when --shard-rows is not given: every worker has its next shard queued,
# and the last wave (one shard a worker at most) is a quarter of a worker's work or less.
SHARDS_PER_WORKER = 4
# ...but not so small that per-shard costs (a Parquet file, a checkpoint rewrite) show.
MIN_SHARD_ROWS = 200
START_GRACE_S = 120.0  # the first worker up waits this long at most for the rest of its wave
HEARTBEAT_S = 1.0  # how often the driver looks at the head while it waits on workers
HEAD_MISSES = 3  # the head's GCS refusing this many connects in a row (0.2 s apart): lost
ALL_LOST_WAIT_S = 120.0  # every worker lost: how long a replacement may take to start


@dataclass(frozen=True)
class RayOptions:
    """Where and on how many workers: ``address`` None or "" starts a local cluster sized
    to the machine (or joins ``RAY_ADDRESS``), else joins the cluster there."""

    address: str | None = None
    workers: int | None = None  # default: as many as the cluster has room for
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0


def shard_rows_for(rows: int, workers: int, given: int | None) -> int:
    """Rows per shard: ``given`` (--shard-rows) wins; else ``SHARDS_PER_WORKER`` shards a
    worker, between ``MIN_SHARD_ROWS`` and the in-process job's ``SHARD_ROWS``."""
    if given:
        return given
    per_shard = -(-rows // max(1, workers * SHARDS_PER_WORKER))
    return max(1, min(SHARD_ROWS, max(MIN_SHARD_ROWS, per_shard)))


def plan_tasks(
    start: int, rows: int, shard_rows: int, offsets: list[int] | None, tag: str
) -> list[ShardTask]:
    """The shards of rows ``start`` to ``start + rows``, each with its staging file name
    (``tag``: this run's, so a late write of an earlier run never takes a shard's place)."""
    count = -(-rows // shard_rows)
    if offsets is not None and len(offsets) < count:
        raise ConfigError("the input has fewer rows than when the job began; run it again")
    return [
        ShardTask(
            k,
            start + k * shard_rows,
            min(shard_rows, rows - k * shard_rows),
            f"{tag}-{k:05d}.parquet",
            offsets[k] if offsets is not None else None,
        )
        for k in range(count)
    ]


def embed_on_ray(
    settings: ServerSettings, source: InputSpec, options: JobOptions, on: RayOptions
) -> JobSummary:
    """Run the job on a Ray cluster (started here when none is named, stopped at the end).
    The summary's ``seconds`` count from the first worker ready (its model loaded), as
    in-process they exclude loading; ``startup_s`` is the time before that."""
    from ember.families.resolve import resolve_model

    began = time.perf_counter()
    if options.chunking is not None:  # the workers write whole rows (ember.jobs.shards)
        raise ConfigError("--chunk-tokens runs in-process: leave out --ray")
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
                extra = _embed(run, settings, options, output, on, began)
        except EmberError:
            raise
        except ray.exceptions.RayError as exc:  # a worker's own error: said as in-process
            cause = _ember_cause(exc)
            if cause is not None:
                raise cause from None
            log.debug("the Ray job stopped", exc_info=True)
            raise _stopped(run, _first_line(exc)) from None
        except Exception as exc:  # Ray's own machinery failing: one line, not its traceback
            log.debug("the Ray job stopped", exc_info=True)
            raise _stopped(run, f"{type(exc).__name__}: {_first_line(exc)}") from None
        finally:
            run.close()
        return replace(run.finish(), extra=extra)


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
    try:
        ray.init(
            address=address or None,
            # a cluster of this machine only: its servers listen on loopback, and it has the
            # CPUs this process may use (affinity capped by the cgroup quota), as an
            # in-process job plans for
            **({"_node_ip_address": "127.0.0.1", "num_cpus": cpu_count()} if local else {}),
            include_dashboard=False,
            log_to_driver=False,  # the workers' model-loading chatter; errors come back raised
            logging_level=logging.WARNING,
            # Ray runs its workers at nice 15: on a machine shared with other work (where a
            # local cluster runs) they would get a fraction of what the in-process job gets.
            **({"_system_config": {"worker_niceness": 0}} if local else {}),
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or os.environ.get("RAY_ADDRESS") or "this machine"
        raise ConfigError(
            f"cannot join the Ray cluster at {where}: {_first_line(exc)}; start it (ray start "
            "--head) or leave out the address to run a local one"
        ) from None
    try:
        yield
    finally:
        ray.shutdown()


def _first_line(exc: BaseException) -> str:
    """An exception as one line: Ray's carry tracebacks and blank lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _stopped(run: JobRun, what: str) -> ConfigError:
    """The one line a job the cluster failed ends with: what was lost, what is kept."""
    checkpoint = run.checkpoint
    return ConfigError(
        f"the Ray job stopped: {what}; {checkpoint.rows_done:,} of "
        f"{checkpoint.total_rows or 0:,} rows are in {run.dataset.store}: run the same command "
        "again (with the cluster up) to resume"
    )


def _cpu_seconds() -> float:
    """This process's CPU time, user and system, all threads (Ray's own included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _capacity(on: RayOptions) -> int:
    """How many workers the cluster's live nodes hold (whole workers per node); a worker
    no node could hold is refused here (Ray would wait for it forever)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    _check_room(on, nodes)
    held = 0
    for node in nodes:
        room = node["Resources"]
        fits = [int(room.get("CPU", 0) // on.cpus_per_worker + 1e-9)] if on.cpus_per_worker else []
        if on.gpus_per_worker:
            fits.append(int(room.get("GPU", 0) // on.gpus_per_worker + 1e-9))
        held += min(fits) if fits else 1
    return held


def _check_room(on: RayOptions, nodes: list[dict[str, Any]]) -> None:
    """Refuse a worker no node of the cluster could hold."""
    fits = [
        n
        for n in nodes
        if n["Resources"].get("CPU", 0) >= on.cpus_per_worker
        and n["Resources"].get("GPU", 0) >= on.gpus_per_worker
    ]
    if not fits:
        most_cpu = max((n["Resources"].get("CPU", 0) for n in nodes), default=0)
        most_gpu = max((n["Resources"].get("GPU", 0) for n in nodes), default=0)
        raise ConfigError(
            f"no node of the Ray cluster can hold a worker of {on.cpus_per_worker:g} CPU and "
            f"{on.gpus_per_worker:g} GPU (the largest node has {most_cpu:g} CPU, {most_gpu:g} "
            "GPU): change --ray-cpus-per-worker / --ray-gpus-per-worker, or add nodes"
        )


def _embed(
    run: JobRun,
    settings: ServerSettings,
    options: JobOptions,
    output: str,
    on: RayOptions,
    began: float,
) -> dict[str, Any]:
    """Plan the shards left, run them on the pool, commit each in input order; what the
    summary adds (start-up, the driver's CPU, rows by node)."""
    capacity = _capacity(on)
    workers = on.workers or default_workers(on.cpus_per_worker, on.gpus_per_worker)
    if workers > capacity:
        log.warning(
            "the Ray cluster holds %d of the %d workers asked for; the others start when "
            "it has room",
            capacity,
            workers,
        )
    done, left = run.checkpoint.rows_done, run.rows_left
    if left < 1:  # killed between its last shard and marking the dataset complete
        return {}
    shard_rows = shard_rows_for(left, workers, options.shard_rows)
    tag = uuid.uuid4().hex[:12]
    tasks = plan_tasks(done, left, shard_rows, run.source.offsets(done, shard_rows), tag)
    first = [row_id for row_id, _ in itertools.islice(run.source.rows(done, done + 1000), 1000)]
    id_type = run.id_type or id_type_of(first)
    store = run.dataset.store
    store.child(STAGING).make()
    store.write_bytes(f"{STAGING}/{tag}.probe", b"")  # a worker that cannot see it says so
    actor = ray.remote(ShardWorker).options(
        num_cpus=on.cpus_per_worker,
        num_gpus=on.gpus_per_worker,
        max_concurrency=CONCURRENT_SHARDS,
        max_restarts=0,  # a lost worker's shards go to the others; the pool replaces it
    )
    embedder = {
        "settings": settings,
        "column": "text",
        "output": output,
        "normalize": options.normalize,
        "dimensions": options.dimensions,
        "prompt_name": options.prompt_name,
        "truncate": options.truncate,
        "in_flight": options.in_flight,
        "chunk_rows": options.chunk_rows,
    }
    # Workers start in directories of their own: relative paths are the driver's.
    source, where = run.source, str(store)
    if isinstance(source.path, Path):
        source = dataclasses.replace(source, path=source.path.resolve())
    if store.local:
        where = str(Path(store.root).resolve())
    pool = _Pool(
        lambda: actor.remote(embedder, source, where, id_type, f"{tag}.probe"),
        workers,
        min(workers, capacity),
        tasks,
        run,
        ray.get_runtime_context().gcs_address,
    )
    try:
        pool.run()
    finally:
        pool.close()
        store.delete(f"{STAGING}/{tag}.probe")
    seconds = time.perf_counter() - (pool.first_ready or began)
    rows = run.checkpoint.rows_done - done
    return {
        "startup_s": round((pool.first_ready or began) - began, 3),
        "shard_rows": shard_rows,
        "ray_workers": workers,
        "driver_cpu_s": round(pool.driver_cpu, 3),
        "driver_cpu_share": round(pool.driver_cpu / seconds, 4) if seconds > 0 else 0.0,
        "driver_cpu_s_per_1000_rows": round(1000 * pool.driver_cpu / rows, 4) if rows else 0.0,
        "rows_by_node": dict(pool.rows_by_node.most_common()),
        "lost_workers": pool.lost,
    }


class _Pool:
    """The workers, the shards still to run, and the commit of finished ones in order."""

    def __init__(
        self,
        start_worker: Any,
        workers: int,
        first_wave: int,
        tasks: list[ShardTask],
        run: JobRun,
        gcs: str,
    ) -> None:
        self.start_worker, self.size, self.run_ = start_worker, workers, run
        # Shards go out once the first wave of workers is up (their models load in
        # parallel), so every worker starts with its share and the start-up is one figure.
        self.waiting_for = first_wave
        self.first_loaded: float | None = None
        self.total = len(tasks)
        self.todo = [(t.index, t) for t in tasks]  # a heap: the lowest index goes first
        heapq.heapify(self.todo)
        self.workers: set[Any] = set()  # every actor started and not lost
        self.starting: dict[Any, Any] = {}  # ready() ref -> actor
        self.live: dict[Any, str] = {}  # actor -> its node
        self.load: Counter[Any] = Counter()
        self.running: dict[Any, tuple[ShardTask, Any]] = {}  # run() ref -> (task, actor)
        self.finished: dict[int, ShardDone] = {}
        self.next_index = 0
        self.rows_by_node: Counter[str] = Counter()
        self.lost: list[str] = []  # "node N: why", one per lost worker
        self.first_ready: float | None = None
        self.cpu_at_ready = 0.0
        self.driver_cpu = 0.0
        self.gcs = gcs
        self._all_lost_since: float | None = None

    def run(self) -> None:
        for _ in range(self.size):
            self._start_one()
        checked = time.monotonic()
        while self.next_index < self.total:
            refs = [*self.running, *self.starting]
            ready, _ = ray.wait(refs, num_returns=1, timeout=HEARTBEAT_S) if refs else ([], [])
            if not ready or time.monotonic() - checked >= HEARTBEAT_S:
                # Also while results flow (checked before they are committed): workers
                # outlive a lost head by a minute, then go all at once; the job stops now,
                # with what it has committed.
                self._check_cluster()
                checked = time.monotonic()
            if not ready:
                continue
            ref = ready[0]
            if ref in self.starting:
                self._started(ref, self.starting.pop(ref))
            else:
                self._returned(ref, *self.running.pop(ref))
        if self.first_ready is not None:
            self.driver_cpu = _cpu_seconds() - self.cpu_at_ready
        self.run_.started = self.first_ready or self.run_.started  # rows/s: after start-up

    def _start_one(self) -> None:
        worker = self.start_worker()
        self.workers.add(worker)
        self.starting[worker.ready.remote()] = worker

    def _started(self, ref: Any, worker: Any) -> None:
        try:
            node = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            cause = _ember_cause(exc)
            if cause is not None:  # the model, the input or the output refused: said once
                raise cause from None
            self._lose(worker, "?", exc)
            return
        self.live[worker] = node
        self.first_loaded = self.first_loaded or time.monotonic()
        self._wave_member_done()
        self._feed(worker)

    def _wave_member_done(self) -> None:
        """One worker of the first wave up (or lost): the last one opens the dispatch."""
        self.waiting_for -= 1
        if self.waiting_for <= 0 and self.first_ready is None:
            self.first_ready, self.cpu_at_ready = time.perf_counter(), _cpu_seconds()
            for worker in list(self.live):
                self._feed(worker)

    def _returned(self, ref: Any, task: ShardTask, worker: Any) -> None:
        self.load[worker] -= 1
        try:
            result: ShardDone = ray.get(ref)
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError,
        ) as exc:
            heapq.heappush(self.todo, (task.index, task))  # runs again, on another worker
            self._lose(worker, self.live.get(worker, "?"), exc)
            return
        self.finished[result.index] = result
        self.rows_by_node[result.node[:8]] += result.staged.rows
        self._commit()
        self._feed(worker)

    def _feed(self, worker: Any) -> None:
        """Keep ``CONCURRENT_SHARDS`` shards on each live worker while any are left."""
        if self.first_ready is None:  # the first wave is still loading its models
            return
        for free in [worker, *self.live]:  # a requeued shard goes to whoever has room
            if free not in self.live:
                continue
            while self.load[free] < CONCURRENT_SHARDS and self.todo:
                _, task = heapq.heappop(self.todo)
                self.running[free.run.remote(task)] = (task, free)
                self.load[free] += 1

    def _commit(self) -> None:
        """Give every finished shard at the front of the dataset its place, in one
        checkpoint write."""
        staged = []
        while self.next_index in self.finished:
            staged.append(self.finished.pop(self.next_index).staged)
            self.next_index += 1
        if staged:
            self.run_.dataset.commit(self.run_.checkpoint, staged)
            self.run_.bar.update(sum(s.rows for s in staged))

    def _lose(self, worker: Any, node: str, exc: BaseException) -> None:
        """A worker is gone (its process, or its node): its shards were requeued; start a
        replacement (it runs where the cluster has room, when it has)."""
        if worker in self.workers:
            if self.first_ready is None and worker not in self.live:
                self._wave_member_done()  # lost while starting: the wave waits no longer
            self.workers.discard(worker)
            self.live.pop(worker, None)
            reason = f"node {node[:8]}: {_first_line(exc)}"
            self.lost.append(reason)
            log.warning("lost a Ray worker (%s); its shards run on the others", reason)
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # already gone with its node
                pass
            self._start_one()
        for ref, (task, owner) in list(self.running.items()):
            if owner is worker:  # its other shard: resubmitted now, not after Ray notices
                del self.running[ref]
                self.load[worker] -= 1
                heapq.heappush(self.todo, (task.index, task))
        if self.live:
            self._feed(next(iter(self.live)))

    def _check_cluster(self) -> None:
        """Between results: is the head still there, and is any worker? (And a first wave
        that cannot all start, the cluster being shared, goes ahead without the rest.)"""
        if (
            self.first_ready is None
            and self.first_loaded is not None
            and time.monotonic() - self.first_loaded > START_GRACE_S
        ):
            log.warning(
                "%d Ray workers have not started; going ahead without them", self.waiting_for
            )
            self.waiting_for = 1
            self._wave_member_done()
        if not _answers(self.gcs, HEAD_MISSES):
            raise _stopped(
                self.run_, f"lost the cluster's head (its GCS at {self.gcs} refuses connections)"
            )
        if self.live or self.running or not self.lost:
            self._all_lost_since = None
            return
        now = time.monotonic()
        self._all_lost_since = self._all_lost_since or now
        if now - self._all_lost_since > ALL_LOST_WAIT_S:
            raise _stopped(
                self.run_,
                f"every Ray worker was lost ({'; '.join(self.lost)}) and none could start "
                f"again in {ALL_LOST_WAIT_S:.0f} s",
            )

    def close(self) -> None:
        """Stop every worker of this run (a joined cluster keeps running)."""
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # gone with its node, or the cluster
                pass


def _answers(address: str, tries: int) -> bool:
    """Whether the head's GCS takes a connection in ``tries`` attempts 0.2 s apart (a
    loaded head may miss one; a dead one refuses every time, at once)."""
    for attempt in range(tries):
        if _reachable(address):
            return True
        if attempt < tries - 1:
            time.sleep(0.2)
    return False


def _reachable(address: str) -> bool:
    """Whether something accepts connections at ``host:port`` (the head's GCS)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False
