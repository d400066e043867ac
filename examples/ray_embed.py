"""Embed a column of a Ray Dataset with Ember: an actor pool, the model loaded once per actor.

pip install 'ember[ray]'
python examples/ray_embed.py

Starts a local Ray cluster of 2 CPUs (on a cluster, call ray.init() with its address, or
set RAY_ADDRESS). EMBED_MODEL: a Hugging Face id or directory; default: the packaged
all-MiniLM-L6-v2. For a whole corpus file into Parquet, resumable, use the CLI instead:
`ember embed corpus.jsonl --output vectors/ --ray`.
"""

import os

import numpy as np
import ray

from ember.ray import Embedder, pool_options

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    docs = ray.data.from_items(
        [
            {"id": i, "text": f"document {i} about {topic}"}
            for i, topic in enumerate(
                ["bread baking", "tax forms", "sourdough starters", "filing returns"] * 25
            )
        ]
    )
    embedded = docs.map_batches(
        Embedder,
        fn_constructor_kwargs={"model_id": os.environ.get("EMBED_MODEL"), "device": "cpu"},
        batch_size=50,
        **pool_options(workers=2, cpus_per_worker=1),
    )
    rows = embedded.take_all()
    vectors = np.stack([row["embedding"] for row in rows])
    print(
        f"{len(rows)} rows, {vectors.shape[1]} dims, refused: "
        f"{sum(row['error'] is not None for row in rows)}"
    )
    bread, sourdough, tax = vectors[0], vectors[2], vectors[1]
    print(
        "bread~sourdough:",
        round(float(bread @ sourdough), 3),
        "bread~tax:",
        round(float(bread @ tax), 3),
    )
finally:
    ray.shutdown()
