"""The backend registry: the backends of the table (``ember.backend_table``, where a
backend is one row), imported by name only when one is chosen, so choosing costs nothing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ember.backend_table import BACKEND_NAMES, EXPORTERS, REGISTRY, BackendEntry
from ember.errors import ConfigError, MissingDependency

__all__ = [
    "BACKEND_NAMES",
    "EXPORTERS",
    "REGISTRY",
    "BackendEntry",
    "backend_module",
    "entry",
    "exporter_module",
    "import_backend",
]


def entry(name: str) -> BackendEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown backend {name!r}; choose one of auto, {', '.join(BACKEND_NAMES)}"
        ) from None


def backend_module(name: str) -> ModuleType:
    """The module that loads backend ``name`` (imported now)."""
    return importlib.import_module(entry(name).module)


def exporter_module(name: str) -> ModuleType:
    """The module whose ``export`` writes an ``ember export --backend NAME`` directory."""
    if name not in EXPORTERS:
        raise ConfigError(
            f"--backend must be one of {'|'.join(EXPORTERS)} for ember export, got {name!r}"
        )
    return importlib.import_module(str(REGISTRY[name].exporter))


def import_backend(name: str) -> None:
    """Import backend ``name`` and the libraries it runs on, loading no model."""
    found = entry(name)
    importlib.import_module(found.module)
    for library in found.runtime:
        try:
            importlib.import_module(library)
        except ImportError as exc:
            install = f"pip install 'ember[{found.extra}]'" if found.extra else "pip install ember"
            raise MissingDependency(f"the {name} backend needs {library}: {install}") from exc
