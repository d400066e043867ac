"""A model that fails to start, said in one line.

An exporter, a network or a library raises its own exception while a model loads or warms
up (the TorchScript tracer's ``RuntimeError: unordered_map::at``, a forward's
``ValueError``); a traceback as the server's last words tells an operator neither which
model nor what to do. The refusal names the model, its family and architecture, the
backend it failed on and the one to use instead; ``--log-level debug`` shows the
traceback.
"""

from __future__ import annotations

from ember.errors import ConfigError, one_line
from ember.models.spec import ResolvedModel


def start_failure(model: ResolvedModel, backend: str, exc: BaseException) -> ConfigError:
    """The one-line refusal of ``model``, which failed on ``backend`` with ``exc``."""
    family = model.family
    what = f"{model.architecture} ({model.model_type})" if model.model_type else model.architecture
    instead = _instead(model, backend)
    return ConfigError(
        f"model {model.served_name!r} ({family.name} model, {what}) failed to start on "
        f"--backend {backend}: {one_line(exc)}; {instead}"
        "--log-level debug shows the traceback"
    )


def _instead(model: ResolvedModel, backend: str) -> str:
    """What to serve it with instead: torch where the family runs on it (what the other
    backends export from), else the family's other backends; nothing for torch itself."""
    family = model.family
    if backend in ("torch", "auto") or model.facts.parts:
        return ""
    if family.runs_on("torch"):
        return "serve it with --backend torch; "
    others = [b for b in family.backends if b != backend]
    return f"serve it with --backend {' or '.join(others)}; " if others else ""
