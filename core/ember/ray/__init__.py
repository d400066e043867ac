"""Ember on Ray Data: embed a column of any Ray ``Dataset``, or run ``ember embed --ray``.

    import ray
    from ember.ray import Embedder, pool_options

    ds = ray.data.read_parquet("s3://bucket/docs/")
    ds = ds.map_batches(Embedder, fn_constructor_kwargs={"model_id": "BAAI/bge-small-en-v1.5"},
                        batch_size=4096, **pool_options(workers=8, gpus_per_worker=1))

Each actor of the pool loads the model once and runs its own engine: the batches it is
given go through the server's batcher (length-grouped batches, the same vectors). Ray is
an extra (``pip install 'ember[ray]'``); nothing else in Ember imports it.
"""

from __future__ import annotations

MISSING = "Ray is not installed: pip install 'ember[ray]'"

try:
    import ray  # noqa: F401
    import ray.data  # noqa: F401
except ImportError:
    raise ImportError(MISSING) from None

from ember.ray.embedder import Embedder, embed_column, pool_options  # noqa: E402

__all__ = ["MISSING", "Embedder", "embed_column", "pool_options"]
