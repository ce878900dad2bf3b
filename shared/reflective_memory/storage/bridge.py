"""Run the synchronous core as a coroutine whose database I/O is awaited on the event loop.

The engine's algorithms (the retrieval pipeline, the session writer) are synchronous and call the
store between CPU steps. `run_bridged(fn, route)` runs such a call inside a greenlet on the event
loop's own thread; every query the PostgreSQL store makes inside it (`PgDatabase.connection`)
asks `current_route()` for a connection and gets one of the async pool
(`reflective_memory.storage.pg_async`), whose calls hand their awaitables to `await_io`: the
greenlet switches back to the coroutine, which awaits them on the loop and switches back with
the result. So the same SQL and row decoding serve both the sync and the async API, no thread
is used, and other coroutines run while a query waits. This is the technique of SQLAlchemy's
asyncio extension.

Locks that are held across store calls must let other greenlets of the same thread run:
`TaskLock` is a lock owned by a greenlet (or a thread) that waits by yielding to the loop when
it is taken inside a bridge.

Needs `greenlet` (part of the `postgres` extra) for the bridge; `TaskLock` works without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

try:
    import greenlet  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    greenlet = None  # type: ignore[assignment]

from reflective_memory.errors import ConfigError

__all__ = ["TaskLock", "await_io", "bridged", "current_route", "run_bridged"]

T = TypeVar("T")

if greenlet is not None:

    class _Bridge(greenlet.greenlet):  # type: ignore[misc,name-defined]
        """The greenlet running one bridged call; `route` serves its database connections."""

        def __init__(self, fn: Callable[..., Any], parent: Any, route: Any) -> None:
            super().__init__(fn, parent)
            self.route = route


def _bridge() -> Any | None:
    """The bridge greenlet running now, or None (plain thread, or no greenlet installed)."""
    if greenlet is None:
        return None
    current = greenlet.getcurrent()
    return current if isinstance(current, _Bridge) else None


def current_route() -> object | None:
    """The connection source of the bridged call running now (None outside a bridge)."""
    bridge = _bridge()
    return None if bridge is None else bridge.route


def bridged() -> bool:
    """Whether the code running now is a bridged call on an event loop (see `run_bridged`).

    CPU-heavy steps check it to hand their work to a worker thread (`await_io(
    asyncio.to_thread(...))`), so the loop stays free for the other coroutines meanwhile.
    """
    return _bridge() is not None


def await_io(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` on the loop from synchronous code running inside `run_bridged`.

    Raises:
        RuntimeError: Not inside a bridged call.
    """
    bridge = _bridge()
    if bridge is None:
        raise RuntimeError("await_io called outside run_bridged")
    return bridge.parent.switch(awaitable)  # type: ignore[no-any-return]


async def run_bridged(route: Any, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the synchronous `fn(*args, **kwargs)` as a coroutine, its I/O awaited on this loop.

    Args:
        route: What `current_route()` returns inside the call (the async connection source).
        fn: Synchronous code; it runs on the loop's thread between its awaited queries.
        *args: Positional arguments of `fn`.
        **kwargs: Keyword arguments of `fn`.

    Raises:
        ConfigError: `greenlet` is not installed.
    """
    if greenlet is None:
        raise ConfigError("native async needs greenlet: pip install 'reflective-memory[postgres]'")
    bridge = _Bridge(lambda: fn(*args, **kwargs), greenlet.getcurrent(), route)
    bridge.gr_context = contextvars.copy_context()
    pending = bridge.switch()
    while not bridge.dead:
        try:
            value = await pending
        except BaseException:  # noqa: BLE001 - handed to the bridged code, which may catch it
            pending = bridge.throw(*sys.exc_info())
        else:
            pending = bridge.switch(value)
    return pending  # type: ignore[no-any-return]


class TaskLock:
    """A lock for critical sections that make store calls: owners are threads or bridges.

    In threads it is a plain (optionally re-entrant) lock. Inside a bridged call several
    greenlets share the loop's thread, so a thread lock would either deadlock (the holder waits
    for I/O the blocked thread can never run) or let them all in (a re-entrant one); here a
    waiter awaits a future on its loop, which `release` (from any thread) resolves.

    Args:
        reentrant: The owner may acquire it again (released as many times).
        slots: How many owners may hold it at once (a semaphore; not with `reentrant`).

    Raises:
        ConfigError: `slots` is not a positive int, or above 1 with `reentrant`.
    """

    def __init__(self, *, reentrant: bool = False, slots: int = 1) -> None:
        if not isinstance(slots, int) or slots < 1 or (reentrant and slots > 1):
            raise ConfigError(f"slots must be 1 with reentrant, else >= 1; got {slots!r}")
        self._lock = threading.Semaphore(slots)
        self._guard = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._reentrant = reentrant
        self._owner: Any = None
        self._depth = 0

    def acquire(self) -> None:
        """Wait until this thread or bridge holds the lock (or one of its slots)."""
        bridge = _bridge()
        me = threading.get_ident() if bridge is None else bridge
        if self._reentrant and self._owner == me:
            self._depth += 1
            return
        if bridge is None:
            self._lock.acquire()
        else:
            while not self._lock.acquire(blocking=False) and not self._wait():
                pass
        if self._reentrant:
            self._owner, self._depth = me, 1

    def _wait(self) -> bool:
        """Wait (inside a bridge) for a release; True when the lock was taken meanwhile."""
        loop = asyncio.get_running_loop()
        waiter = (loop, loop.create_future())
        with self._guard:
            self._waiters.append(waiter)
        try:
            if self._lock.acquire(blocking=False):  # released since the failed try
                return True
            await_io(waiter[1])
            return False
        except BaseException:
            self._wake()  # a wake-up meant for this waiter goes to the next one
            raise
        finally:
            self._forget(waiter)

    def _forget(self, waiter: tuple[Any, Any]) -> None:
        with self._guard:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        """Resolve the oldest waiter's future (on its own loop)."""
        while True:
            with self._guard:
                if not self._waiters:
                    return
                loop, future = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, future)
                return
            except RuntimeError:  # its loop is closed: nobody waits there any more
                continue

    def release(self) -> None:
        """Release once (a re-entrant lock is free when every acquire was released)."""
        if self._reentrant:
            self._depth -= 1
            if self._depth:
                return
            self._owner = None
        self._lock.release()
        self._wake()

    def __enter__(self) -> TaskLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
