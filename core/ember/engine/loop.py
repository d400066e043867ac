"""An event loop on a daemon thread that owns the engines.

The batcher binds to the loop that started it. Plain scripts have no loop, platform
SDKs call from worker threads (Modal, RunPod) or serve ASGI on a loop of their own, so
the engines get one private loop and every caller submits to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return await fn(*args)


class EngineLoop:
    def __init__(self, name: str = "ember-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=name)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Block the calling (non-loop) thread until ``coro`` finishes on the engine loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the engine loop from a coroutine on another loop."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def asgi(self, inner: ASGIApp) -> ASGIApp:
        """Serve ``inner`` on the engine loop to callers on any other loop."""
        engine_loop = self.loop

        async def bridged(scope: Scope, receive: Receive, send: Send) -> None:
            caller = asyncio.get_running_loop()
            if caller is engine_loop:
                await inner(scope, receive, send)
                return

            def on_caller(coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
                return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, caller))

            async def receive_here() -> Message:
                return await on_caller(_call(receive))

            async def send_here(message: Message) -> None:
                await on_caller(_call(send, message))

            done: Future[None] = asyncio.run_coroutine_threadsafe(
                inner(scope, receive_here, send_here), engine_loop
            )
            try:
                await asyncio.wrap_future(done)
            except asyncio.CancelledError:
                done.cancel()  # client went away: stop its work on the engine loop too
                raise

        return bridged

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
