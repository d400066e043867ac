"""What a backend is told by the settings, and nothing more of them.

The settings (``ember.config``: CLI flag = ``EMBER_*`` env = default) resolve into one
``ModelSpec`` per served model, which batching, queues, routes and prompts read too. A
backend needs a dozen of its fields: where to run, in what dtype, how many forwards at
once, where to keep artifacts and how to compile. ``BackendSettings`` is those, built once
per resolved model from its spec (``ResolvedModel.runtime``), so that backends depend on
what they use and not on the whole spec (``tests/unit/test_layers.py`` holds them to it).

On the ground floor: the settings check values with its rules, models build it, backends
read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.models.spec import ModelSpec

# The nice increment of the threads that load and run models (--forward-nice's default).
FORWARD_NICE = 10


@dataclass(frozen=True)
class BackendSettings:
    """A backend's share of one model's settings (each field is the ``ModelSpec`` field
    of the same name, and the setting of that name: ``--device``, ``--cache-dir``, ...)."""

    model_id: str = ""  # as asked for ("": the packaged default); artifacts record it
    backend: str = "auto"  # see ember.backends.choice
    device: str = "auto"
    dtype: str = "auto"
    near_exact_check: str = "start"  # or "background" (ember.backends.near_exact.settle)
    forward_workers: int = 0  # 0: auto (ember.cpu.cpu_forward_plan)
    forward_nice: int = FORWARD_NICE  # the threads that load and run models (ember.cpu)
    torch_compile: bool = False
    trust_remote_code: bool = False
    cache_dir: Path | None = None  # None: ember.defaults.default_cache_dir()
    neuron_batch_size: int | None = None  # None: ember.defaults.NEURON_BATCH_SIZE
    neuron_sequence_lengths: tuple[int, ...] | None = None  # None: defaults, capped
    neuron_auto_cast: str | None = None
    neuron_cores: int | None = None

    @classmethod
    def of(cls, spec: ModelSpec) -> BackendSettings:
        """The fields of ``spec`` a backend reads."""
        return cls(**{f.name: getattr(spec, f.name) for f in fields(cls)})


def normalize_buckets(sequence_lengths: Iterable[int]) -> tuple[int, ...]:
    """Sorted, de-duplicated, positive bucket lengths; raises on an empty or bad list.

    The one rule for Neuron's sequence buckets: ``--neuron-sequence-lengths`` is checked
    with it (``ember.config_values``), and so are the neuron backend's manifests."""
    buckets = sorted({int(x) for x in sequence_lengths})
    if not buckets:
        raise ValueError("at least one sequence length (bucket) is needed")
    if buckets[0] < 2:
        raise ValueError(f"sequence lengths must be >= 2, got {buckets}")
    return tuple(buckets)
