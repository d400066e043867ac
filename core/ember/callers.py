"""Who is calling, for the layers below the HTTP edge: the API key a request came with
(``ember.api.keys``) is set here for the request's task, so the engine can refuse a model
the key may not use and report what the request cost, without passing the key along.

A contract on the ground floor: the engine imports this module, never the HTTP layer."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol


class Caller(Protocol):
    """What the engine asks of the request's key."""

    def may_use(self, model: str) -> bool:
        """Whether the key may use ``model``: the model listings show only those."""

    def check_model(self, model: str) -> None:
        """Raise ``ember.errors.Forbidden`` if the key may not use ``model``."""

    def charge(self, inputs: int, tokens: int) -> None:
        """Count what one engine call served (after the fact) against the key's usage and
        its inputs/tokens rate limits."""


# None outside a request, and for requests on a server without API keys.
CALLER: ContextVar[Caller | None] = ContextVar("ember_caller", default=None)


def may_use(model: str) -> bool:
    """Whether the request's key may use ``model`` (any model without a key)."""
    caller = CALLER.get()
    return caller is None or caller.may_use(model)


def charge(inputs: int, tokens: int) -> None:
    """Report an engine call's inputs and tokens to the request's key, if it has one."""
    caller = CALLER.get()
    if caller is not None:
        caller.charge(inputs, tokens)
