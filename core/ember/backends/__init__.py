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


def _load(name: str, model: ResolvedModel) -> Backend:
    if name not in _MODULES:
        raise ConfigError(f"unknown backend {name!r}; choose one of auto, {', '.join(_MODULES)}")
    return importlib.import_module(_MODULES[name]).load(model)


def load_backend(model: ResolvedModel) -> Backend:
    if model.spec.backend != AUTO:
        return _load(model.spec.backend, model)
    choice = choose_backend(model)
    log.info("model %s: backend auto -> %s (%s)", model.served_name, choice.backend, choice.reason)
    spec = replace(model.spec, backend=choice.backend, device=choice.device or model.spec.device)
    reason = choice.reason
    try:
        backend = _load(choice.backend, replace(model, spec=spec))
    except Exception as exc:
        if choice.backend == "torch" or choice.exported:
            raise
        # What auto picked for speed failed where torch may not: serve, and say why.
        failure = f"{type(exc).__name__}: {str(exc)[:300]}"
        log.warning(
            "model %s: %s failed (%s); serving with torch",
            model.served_name,
            choice.backend,
            failure,
        )
        reason = f"{reason}, but {choice.backend} failed ({failure}), so torch"
        backend = _load("torch", replace(model, spec=replace(model.spec, backend="torch")))
    details = {**backend.info.details, "chosen": f"auto: {reason}"}
    backend.info = replace(backend.info, details=details)
    return backend
