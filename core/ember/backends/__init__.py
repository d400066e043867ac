"""Backend registry: each backend module is imported only when chosen."""

from __future__ import annotations

import importlib

from ember.backends.base import Backend, BackendInfo, TokenBatch
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

_MODULES = {
    "torch": "ember.backends.torch_backend",
    "onnx": "ember.backends.onnx_backend",
    "ct2": "ember.backends.ct2_backend",
    "neuron": "ember.backends.neuron_backend",
}

__all__ = ["Backend", "BackendInfo", "TokenBatch", "load_backend"]


def load_backend(model: ResolvedModel) -> Backend:
    name = model.spec.backend
    if name not in _MODULES:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(_MODULES)}")
    module = importlib.import_module(_MODULES[name])
    return module.load(model)
