"""Backend registry: each backend module is imported only when chosen."""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace

from ember.backends.base import Backend, BackendInfo, TokenBatch
from ember.backends.choice import AUTO, choose_backend
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

_MODULES = {
    "torch": "ember.backends.torch_backend",
    "onnx": "ember.backends.onnx_backend",
    "ct2": "ember.backends.ct2_backend",
    "neuron": "ember.backends.neuron_backend",
}

__all__ = ["Backend", "BackendInfo", "TokenBatch", "load_backend"]


def load_backend(model: ResolvedModel) -> Backend:
    name = model.spec.backend
    reason = ""
    if name == AUTO:
        name, reason = choose_backend(model)
        log.info("model %s: backend auto -> %s (%s)", model.served_name, name, reason)
        model = replace(model, spec=replace(model.spec, backend=name))
    if name not in _MODULES:
        raise ConfigError(f"unknown backend {name!r}; choose one of auto, {', '.join(_MODULES)}")
    module = importlib.import_module(_MODULES[name])
    backend = module.load(model)
    if reason:
        details = {**backend.info.details, "chosen": f"auto: {reason}"}
        backend.info = replace(backend.info, details=details)
    return backend
