"""Backends: each registered once (``registry``), its module imported only when chosen."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ember.backends.registry import (
    BACKEND_NAMES,
    EXPORTERS,
    REGISTRY,
    backend_module,
    entry,
    import_backend,
)
from ember.capabilities import MEDIA_BACKBONES
from ember.errors import ConfigError

if TYPE_CHECKING:
    from ember.backends.base import Backend
    from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

__all__ = ["BACKEND_NAMES", "EXPORTERS", "import_backend", "load_backend"]


def _load(name: str, model: ResolvedModel) -> Backend:
    return backend_module(name).load(model)


def load_backend(model: ResolvedModel) -> Backend:
    # Imported here, not above: ember.config reads the registry through this package,
    # and the chooser reads artifacts, which read ember.config.
    from ember.backends.choice import AUTO, choose_backend

    if model.spec.backend != AUTO:
        if model.backbone in MEDIA_BACKBONES and model.spec.backend != "torch":
            kind = model.kind.name if model.kind else "media"
            if kind not in entry(model.spec.backend).media_kinds:
                served = ["torch", *(e.name for e in REGISTRY.values() if kind in e.media_kinds)]
                raise ConfigError(
                    f"model {model.served_name!r} is a {kind} model, served by --backend "
                    f"{' or '.join(served)} (not {model.spec.backend})"
                )
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
