"""Backends: each registered once (``registry``), its module imported only when chosen."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ember.backends.registry import BACKEND_NAMES, EXPORTERS, backend_module, import_backend
from ember.errors import ConfigError, one_line
from ember.installed import torch_installed

if TYPE_CHECKING:
    from ember.backends.base import Backend
    from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

__all__ = ["BACKEND_NAMES", "EXPORTERS", "import_backend", "load_backend"]


def _load(name: str, model: ResolvedModel) -> Backend:
    return backend_module(name).load(model)


def _check_serves(model: ResolvedModel, name: str) -> None:
    """Refuse, in one line, a backend asked for that cannot run the model's family, or
    that runs it only on a condition the model's files fail (``Family.conditions``)."""
    family = model.family
    if model.task_adapters and name != "torch":
        raise ConfigError(
            f"model {model.served_name!r} picks LoRA task adapters in its own code "
            f"({', '.join(model.task_adapters)}), which only torch runs: use --backend torch "
            "or auto"
        )
    if not family.runs_on(name):
        served = " or ".join(family.backends)
        raise ConfigError(
            f"model {model.served_name!r} is a {family.name} model, served by --backend "
            f"{served} (not {name}): use --backend {served} or auto"
        )
    family.require_condition(model, name)


def load_backend(model: ResolvedModel) -> Backend:
    # Imported here, not above: ember.config reads the registry through this package,
    # and the chooser reads artifacts, which read ember.config.
    from ember.backends.choice import AUTO, choose_backend

    if model.family.load is not None:  # a model made of parts, each on its own backend
        return model.family.load(model, load_backend)
    if model.runtime.backend != AUTO:
        _check_serves(model, model.runtime.backend)
        return _load(model.runtime.backend, model)
    choice = choose_backend(model)
    log.info("model %s: backend auto -> %s (%s)", model.served_name, choice.backend, choice.reason)
    reason = choice.reason
    try:
        backend = _load(choice.backend, model.on_backend(choice.backend, choice.device))
    except Exception as exc:
        if choice.backend == "torch" or choice.exported or choice.only or choice.shipped:
            raise
        if choice.backend == "onnx" and not torch_installed():
            raise  # torch is not there to fall back on: the failure itself is the news
        # What auto picked for speed failed where another may not: serve, and say why
        # (the int8 fast tier falls back to onnx's int8, as torch has none).
        fallback = "onnx" if choice.backend == "openvino" else "torch"
        failure = one_line(exc)
        log.warning(
            "model %s: %s failed (%s); serving with %s",
            model.served_name,
            choice.backend,
            failure,
            fallback,
        )
        reason = f"{reason}, but {choice.backend} failed ({failure}), so {fallback}"
        backend = _load(fallback, model.on_backend(fallback))
    if choice.only or (choice.exported and choice.backend != "onnx"):
        return _report(backend, reason)
    # An `ember export --backend onnx` float32 graph is the reference the near-exact check
    # compares with, as a graph auto builds is: it gets the same default per CPU.
    from ember.backends.near_exact import settle

    backend, precision = settle(model, backend, reason)
    if precision is None:
        return _report(backend, reason)
    log.info("model %s: auto serves %s", model.served_name, precision)
    return _report(backend, f"{reason}; {precision}")


def _report(backend: Backend, reason: str) -> Backend:
    """The backend with auto's choice, and why, in its details (/v1/models, /info)."""
    details = {**backend.info.details, "chosen": f"auto: {reason}"}
    backend.info = replace(backend.info, details=details)
    return backend
