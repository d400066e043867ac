"""``Embedder``: a callable class for ``ray.data.Dataset.map_batches``.

Ray Data runs a callable class as an actor pool: each actor builds it once (here: loads
the model and starts an engine on its own event loop) and is then called batch after
batch. A batch goes through the corpus job's window (``jobs.runner.embed_rows``), so the
engine's batcher forms length-grouped batches from all of it, as ``ember embed`` does in
one process. A row the model refuses (too long with ``truncate=False``, no text) gets a
null embedding and its reason in ``error_column``; the job goes on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ember.capabilities import Output
from ember.jobs.refusals import Refused, split_refused
from ember.jobs.runner import CHUNK_ROWS, IN_FLIGHT, JobOptions, choose_output, embed_rows
from ember.jobs.shards import embedding_array
from ember.outputs import is_dense


class Embedder:
    """Embed ``column`` of each batch into ``output_column`` (and ``error_column``).

    ``model_id`` and ``settings`` (any ``ember serve`` setting: ``backend``, ``device``,
    ``dtype``, ...) name the model as ``ember serve`` would; ``output``, ``normalize``,
    ``dimensions``, ``prompt_name`` and ``truncate`` are the embedding's, as in a request.
    A ``pyarrow`` batch comes back as a table (embeddings as ``ember embed`` writes them);
    a NumPy batch (Ray's default) as arrays: dense rows an ``(n, d)`` float32 matrix (NaN
    rows where refused), sparse and multi-vector rows one object each.
    ``keep_columns``: input columns to pass through (default: all).
    """

    def __init__(
        self,
        model_id: str | None = None,
        *,
        column: str = "text",
        output_column: str = "embedding",
        error_column: str = "error",
        output: Output | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        truncate: bool = True,
        keep_columns: Sequence[str] | None = None,
        in_flight: int = IN_FLIGHT,
        chunk_rows: int = CHUNK_ROWS,
        settings: Any = None,
        **setting_overrides: Any,
    ) -> None:
        from ember.config import settings_from_env
        from ember.engine import EngineArray
        from ember.engine.loop import EngineLoop
        from ember.jobs.runner import job_settings

        self.column, self.output_column, self.error_column = column, output_column, error_column
        self.keep_columns = None if keep_columns is None else list(keep_columns)
        self.in_flight, self.chunk_rows = in_flight, chunk_rows
        options = JobOptions(
            output=Path(),
            normalize=normalize,
            dimensions=dimensions,
            prompt_name=prompt_name,
            truncate=truncate,
            in_flight=in_flight,
            chunk_rows=chunk_rows,
        )
        if settings is None:
            settings = settings_from_env(model_id=model_id, **setting_overrides)
        settings = _fit_to_worker(job_settings(settings, options))
        self.loop = EngineLoop()
        self.engines = EngineArray(settings.model_specs())
        self.loop.run(self.engines.start())
        self.engine = self.engines.get(None)
        self.output = choose_output(self.engine, output)
        self.request = options.embed_request(self.output)
        # The options are tried once (bad ones fail the pool at start, not every row), and
        # give the column's type for a batch whose rows are all refused.
        probe = self.loop.run(self.engine.embed(replace(self.request, inputs=["ember"])))
        self.empty = embedding_array(self.output, probe.outputs)[:0]

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        texts = _column(batch, self.column)
        values = self.embed(texts)
        if isinstance(batch, pa.Table):
            return self._arrow(batch, values)
        return self._numpy(batch, values)

    def embed(self, texts: Sequence[Any], *, in_flight: int | None = None) -> list[Any]:
        """Each text's embedding, or ``Refused`` (a value not text is refused too);
        ``in_flight``: this call's window, when several calls share the engine's queue."""
        rows = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
        values: list[Any] = [Refused("no text in the row")] * len(texts)
        if rows:
            window = in_flight or self.in_flight
            for (i, _), value in zip(rows, self.loop.run(self._embed(rows, window)), strict=True):
                values[i] = value
        return values

    async def _embed(self, rows: list[tuple[int, str]], in_flight: int) -> list[Any]:
        out: list[Any] = []
        async for _, values in embed_rows(
            self.engine,
            rows,
            output=self.output,
            shard_rows=len(rows),
            in_flight=in_flight,
            chunk_rows=self.chunk_rows,
            request=self.request,
            refuse_rows=True,
        ):
            out.extend(values)
        return out

    def embeddings(self, values: Sequence[Any]) -> Any:
        """The Arrow column of ``values``, null where refused."""
        import pyarrow as pa

        good, refused = split_refused(values)
        column = embedding_array(self.output, good) if good else self.empty
        if not refused:
            return column
        gone = {i for i, _ in refused}
        at = iter(range(len(good)))
        take = [None if i in gone else next(at) for i in range(len(values))]
        return column.take(pa.array(take, type=pa.int64()))

    def _arrow(self, batch: Any, values: list[Any]) -> Any:
        import pyarrow as pa

        kept = batch.select(self.keep_columns) if self.keep_columns is not None else batch
        errors = pa.array(
            [v.error if isinstance(v, Refused) else None for v in values], pa.string()
        )
        return kept.append_column(self.output_column, self.embeddings(values)).append_column(
            self.error_column, errors
        )

    def _numpy(self, batch: Any, values: list[Any]) -> dict[str, Any]:
        names = list(batch) if self.keep_columns is None else self.keep_columns
        out = {name: np.asarray(batch[name]) for name in names}
        if is_dense(self.output):
            dim = self.empty.type.list_size
            out[self.output_column] = (
                np.stack(
                    [
                        np.full(dim, np.nan, np.float32) if isinstance(v, Refused) else v
                        for v in values
                    ]
                ).astype(np.float32)
                if values
                else np.zeros((0, dim), np.float32)
            )
        else:
            column = np.empty(len(values), dtype=object)
            column[:] = [None if isinstance(v, Refused) else _plain(v) for v in values]
            out[self.output_column] = column
        errors = np.empty(len(values), dtype=object)
        errors[:] = [_error(v) for v in values]
        out[self.error_column] = errors
        return out

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            try:
                loop.run(self.engines.stop())
                loop.close()
            except Exception:  # an interpreter at exit: nothing left to stop cleanly
                pass


def _error(value: Any) -> str | None:
    return value.error if isinstance(value, Refused) else None


def _column(batch: Any, name: str) -> list[Any]:
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        if name not in batch.column_names:
            raise KeyError(f"the batch has no column {name!r}; its columns: {batch.column_names}")
        return batch.column(name).to_pylist()
    if name not in batch:
        raise KeyError(f"the batch has no column {name!r}; its columns: {list(batch)}")
    return list(batch[name])


def _plain(value: Any) -> Any:
    """A sparse vector as ``{"indices", "values"}``; a multi-vector matrix as it is."""
    if hasattr(value, "indices"):
        return {"indices": np.asarray(value.indices), "values": np.asarray(value.values)}
    return np.asarray(value, dtype=np.float32)


def _fit_to_worker(settings: Any) -> Any:
    """On CPU, pin this worker to the cores Ray granted it (``ember.ray.cores``), so its
    engine plans its forwards for them and N workers do not each plan for the node."""
    import ray

    from ember.ray.cores import claim_cores

    if not ray.is_initialized() or settings.device not in ("cpu", "auto"):
        return settings
    try:
        granted = ray.get_runtime_context().get_assigned_resources()
    except Exception:  # not in a Ray worker
        return settings
    if granted.get("GPU"):
        return settings
    claim_cores(math.floor(granted.get("CPU", 0)))
    return settings


def pool_options(
    workers: int | None = None, *, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0
) -> dict[str, Any]:
    """``map_batches`` keyword arguments for a pool of ``workers`` ``Embedder`` actors
    (default: as many as the cluster's GPUs, or CPUs, hold), each given these resources."""
    import ray

    if workers is None:
        workers = default_workers(cpus_per_worker, gpus_per_worker)
    if workers < 1:
        raise ValueError(f"an Embedder pool needs at least 1 worker, got {workers}")
    return {
        "compute": ray.data.ActorPoolStrategy(size=workers),
        "num_cpus": cpus_per_worker,
        "num_gpus": gpus_per_worker,
    }


def default_workers(cpus_per_worker: float, gpus_per_worker: float) -> int:
    """As many workers as the cluster has room for (its GPUs when workers take GPUs)."""
    import ray

    resources = ray.cluster_resources()
    if gpus_per_worker > 0:
        return max(1, int(resources.get("GPU", 0) // gpus_per_worker))
    return max(1, int(resources.get("CPU", 1) // max(cpus_per_worker, 1e-9)))


def embed_column(
    ds: Any,
    model_id: str | None = None,
    *,
    column: str = "text",
    batch_size: int = 4096,
    workers: int | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    batch_format: str = "default",
    **embedder_kwargs: Any,
) -> Any:
    """``ds`` with ``column`` embedded by a pool of ``Embedder`` actors (lazy, as Ray
    Data is): ``embed_column(ds, "BAAI/bge-small-en-v1.5", workers=4)``."""
    return ds.map_batches(
        Embedder,
        fn_constructor_kwargs={"model_id": model_id, "column": column, **embedder_kwargs},
        batch_size=batch_size,
        batch_format=batch_format,
        **pool_options(workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker),
    )
