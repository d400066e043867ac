"""Corpus jobs: embed a whole file into a Parquet dataset, resumably, in-process.

``inputs`` reads the corpus, ``runner`` feeds it through an engine, ``writer`` is a run's
output side (shared with ``ember.ray``, which computes the vectors on a Ray cluster),
``shards`` writes and checkpoints the dataset (``chunked``: a row per chunk of each input),
``refusals`` keeps rows the model refuses out of it (the dead-letter file), ``digests`` ties
each shard to its input rows, ``lock`` keeps one job per output directory, ``fanout`` splits
a corpus for many machines and joins their outputs, ``batch`` answers an OpenAI batch file
line by line, ``command`` is `ember embed`.
Nothing is imported here, so the CLI stays quick.
"""
