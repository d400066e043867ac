"""The backend table: adding a backend is one row here.

Everything that lists backends reads this table: ``--backend``'s choices and help
(``ember.config``), ``ember export``'s backends (``ember.cli``), the loader
(``ember.backends.load_backend``, through ``ember.backends.registry``), the detection of
an export directory (``ember.backends.choice.exported_backend``), the runtime a platform
pre-imports (``ember.platform.preload_runtime``), the families' table of backends
(``ember.families.table``) and the docs test that checks the README's Backends table.
Which families a backend runs is each family's to say (``ember.families``:
``Family.backends``). Plain data on the ground floor: it names modules and imports none,
so the settings can list backends without importing one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendEntry:
    """One backend.

    ``module`` has ``load(model) -> Backend``. ``exporter``, where the backend writes
    ahead-of-time artifacts, has ``export(model, out_dir, progress=None) -> Path``: the
    directory it writes is served by ``--model-id DIR``, and its artifact manifest
    (``ember.backends.artifacts``) sits in ``export_subdir`` of it. ``runtime`` lists the
    libraries a load imports (what a platform pre-imports before a memory snapshot);
    ``extra``, the pyproject extra that installs them (named by the missing-package hint).
    """

    name: str
    module: str
    runtime: tuple[str, ...]
    exporter: str | None = None
    export_subdir: str = ""
    cpu_only: bool = False  # it runs on the CPU whatever --device says (numpy)
    extra: str = ""  # `pip install 'ember[EXTRA]'`; "" where the core install has it


REGISTRY: dict[str, BackendEntry] = {
    entry.name: entry
    for entry in (
        BackendEntry(
            "torch", "ember.backends.torch_backend", ("torch", "transformers"), extra="torch"
        ),
        BackendEntry(
            "onnx",
            "ember.backends.onnx_backend",
            ("onnxruntime",),
            exporter="ember.backends.onnx_export",
            extra="cpu",  # torch-free; converting a model that ships no graph: ember[export]
        ),
        BackendEntry(
            "ct2",
            "ember.backends.ct2_backend",
            ("ctranslate2",),
            exporter="ember.backends.ct2_backend",
            export_subdir="ct2",  # the converted model has a config.json of its own
            extra="ct2",
        ),
        BackendEntry("openvino", "ember.backends.openvino_backend", ("openvino",), extra="cpu"),
        BackendEntry(
            "neuron",
            "ember.backends.neuron_backend",
            ("optimum.neuron",),
            exporter="ember.backends.neuron_export",
            extra="neuron",
        ),
        BackendEntry(
            "numpy",
            "ember.backends.static_backend",
            ("numpy",),
            cpu_only=True,  # tables with no network (each family says which it runs)
        ),
    )
}

BACKEND_NAMES: tuple[str, ...] = tuple(REGISTRY)
EXPORTERS: tuple[str, ...] = tuple(e.name for e in REGISTRY.values() if e.exporter)
