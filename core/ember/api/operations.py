"""What each model route does: request body -> engine call -> response body.

Every operation has the same shape, ``(engines, body, limits) -> Reply``, so the
HTTP layer (and the platform adapters' ``/invocations``) run them through one path. A
model route's operation is a dialect's translator (``ember.api.dialects``) wired by
``run``: the dialect decodes and encodes, nothing here knows a body's fields.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar, get_args, get_type_hints

from ember.api.dialects import Translator
from ember.engine import EngineArray, Timings
from ember.errors import PayloadTooLarge
from ember.lanes import claimed, serve

A = TypeVar("A")  # the answer: a dialect's response model
Operation = Callable[[EngineArray, Any, int], Awaitable["Reply[Any]"]]


@dataclass
class Reply(Generic[A]):
    """An operation's answer (serialised by ``ember.api.dialects.dumps``) and its timings."""

    body: A
    timings: Timings


def check_batch(count: int, limit: int, param: str) -> None:
    if count > limit:
        raise PayloadTooLarge(
            f"{count} {param} in one request; --max-client-batch-size allows {limit}",
            param=param,
        )


async def run(translator: Translator, engines: EngineArray, body: Any, limit: int) -> Reply:
    """One model route: the body's inputs held to ``limit``, its lane claim resolved
    against its key's (``ember.lanes``), its model picked, decoded into an engine request,
    run, and the result encoded in the body's dialect."""
    check_batch(translator.count(body), limit, translator.named(body))
    serve(claimed(body.priority, body.service_tier))
    engine = engines.for_task(body.model, translator.pick(body))
    async with engines.serving(engine, body.keep_alive) as engine:  # loaded, held
        result = await translator.call(engine, translator.decode(body, engine))
        return Reply(translator.encode(body, engine, result), result.timings)


def translated(translator: Translator) -> Operation:
    """``translator`` as a route's operation."""
    return partial(run, translator)


def answer_of(operation: Operation) -> Any:
    """The model of what ``operation`` answers, read from the code that builds it: a
    translator's ``encode`` return type, or the ``Reply[...]`` an operation returns. The
    OpenAPI schema documents this, so it cannot drift from what is returned."""
    if isinstance(operation, partial) and operation.func is run:
        return get_type_hints(operation.args[0].encode)["return"]
    (answer,) = get_args(get_type_hints(operation)["return"])
    return answer
