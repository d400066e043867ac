"""Defaults that settings and the layers below them share, on the ground floor: the
settings (``ember.config``) read them, and so do models and backends, which never import
the settings themselves (settings flow down, never back)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# neuron: optimum-neuron's auto_cast modes, the sequence buckets compiled when none are
# given (each capped at the model's maximum: ember.backends.neuron_shapes), and the rows
# per call of a compiled graph.
NEURON_AUTO_CAST = ("none", "matmul", "all")
NEURON_BUCKETS = (128, 256, 512)
NEURON_BATCH_SIZE = 8
CACHE_MAX_BYTES = 256 * 1024 * 1024  # the embedding cache's (--cache-max-bytes)


def default_cache_dir() -> Path:
    """Where artifacts go without ``--cache-dir``: $XDG_CACHE_HOME/ember, else ~/.cache/ember."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "ember"
