"""Native async I/O for the PostgreSQL store: psycopg's `AsyncConnectionPool` under the same SQL.

`AsyncPgRoute` is the async connection source of one `PgDatabase`. `run(fn, ...)` runs a
synchronous engine call (`retrieve`, `add_turns`, `end_session`, ...) through
`reflective_memory.storage.bridge.run_bridged`: inside it, `PgDatabase.connection` hands out
`BridgedConnection`s of the async pool instead of the sync pool's connections. A bridged
connection looks like a psycopg `Connection` (execute, cursor, transaction, commit, ...) and
awaits each call of the underlying `AsyncConnection` on the event loop, so the statements and
the row decoding of `PostgresStore`, `PgSearch` and `DatabaseStateStore` are the ones the sync
API runs: there is no second copy of any query.

One pool per event loop (a pool belongs to the loop that opened it), opened on first use with
the sizes of the sync pool; `aclose()` closes the running loop's pool, `close()` forgets them all.

Needs the `postgres` extra: `pip install 'reflective-memory[postgres]'`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from reflective_memory.errors import StoreClosedError, StoreUnavailableError
from reflective_memory.storage.bridge import await_io, run_bridged

__all__ = ["AsyncPgRoute", "AsyncRoutes", "BridgedConnection", "BridgedCursor", "PoolSource"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BridgedCursor:
    """A psycopg `AsyncCursor` used like a `Cursor` from bridged synchronous code."""

    def __init__(self, cursor: Any) -> None:
        self._cur = cursor

    def execute(self, query: Any, params: Any = None) -> BridgedCursor:
        """Run a statement; return this cursor (as `Cursor.execute` does)."""
        await_io(self._cur.execute(query, params))
        return self

    def executemany(self, query: Any, params_seq: Any) -> None:
        """Run a statement once per parameter set."""
        await_io(self._cur.executemany(query, params_seq))

    def fetchone(self) -> Any:
        """The next row, or None."""
        return await_io(self._cur.fetchone())

    def fetchall(self) -> list[Any]:
        """The remaining rows."""
        return await_io(self._cur.fetchall())

    @property
    def rowcount(self) -> int:
        """Rows the last statement touched."""
        return int(self._cur.rowcount)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def __enter__(self) -> BridgedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        await_io(self._cur.close())


class BridgedConnection:
    """A psycopg `AsyncConnection` used like a `Connection` from bridged synchronous code.

    Covers what the PostgreSQL store classes call on a connection: `execute`, `cursor`,
    `transaction`, `commit`, `rollback`, `isolation_level`, `adapters` and `info`.
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @property
    def adapters(self) -> Any:
        """The connection's adapters (pgvector's types are registered when it is made)."""
        return self._conn.adapters

    @property
    def info(self) -> Any:
        """The connection's `ConnectionInfo` (the server's host and port)."""
        return self._conn.info

    def execute(self, query: Any, params: Any = None) -> BridgedCursor:
        """Run a statement on a new cursor and return it."""
        return BridgedCursor(await_io(self._conn.execute(query, params)))

    def cursor(self, *, binary: bool = False) -> BridgedCursor:
        """A new cursor (`binary`: results in binary format)."""
        return BridgedCursor(self._conn.cursor(binary=binary))

    def commit(self) -> None:
        """Commit the open transaction."""
        await_io(self._conn.commit())

    def rollback(self) -> None:
        """Roll back the open transaction."""
        await_io(self._conn.rollback())

    @property
    def isolation_level(self) -> Any:
        """The isolation level of the next transactions (None: the server's default)."""
        return self._conn.isolation_level

    @isolation_level.setter
    def isolation_level(self, value: Any) -> None:
        await_io(self._conn.set_isolation_level(value))

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction block, committed on exit (rolled back on an error)."""
        with _entered(self._conn.transaction()) as tx:
            yield tx


@contextmanager
def _entered(manager: Any) -> Iterator[Any]:
    """An async context manager entered and exited from bridged synchronous code."""
    value = await_io(manager.__aenter__())
    try:
        yield value
    except BaseException:
        if not await_io(manager.__aexit__(*sys.exc_info())):
            raise
    else:
        await_io(manager.__aexit__(None, None, None))


class PoolSource(Protocol):
    """What an `AsyncPgRoute` needs of the database it serves (`PgDatabase` is one)."""

    psycopg: Any
    timeout: float

    @property
    def closed(self) -> bool:
        """Whether the database was closed."""
        ...

    def async_pool(self, dsn: str, configure: Any) -> Any:
        """A new, unopened `psycopg_pool.AsyncConnectionPool` sized like the sync pool."""
        ...


class AsyncPgRoute:
    """The async connection pools of one database, and the bridge that runs calls on them.

    Args:
        db: The database (its URI and pool sizes are reused).
        dsn: The connection URI.
    """

    def __init__(self, db: PoolSource, dsn: str) -> None:
        self.db = db
        self._dsn = dsn
        self._pools: dict[asyncio.AbstractEventLoop, Any] = {}

    async def _configure(self, conn: Any) -> None:
        from pgvector.psycopg import register_vector_async

        await register_vector_async(conn)
        await conn.commit()

    async def _pool(self) -> Any:
        """The running loop's pool, opened on first use."""
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._pools if lp.is_closed()]:
            del self._pools[other]  # its loop ended: nothing can close it any more
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = self.db.async_pool(self._dsn, self._configure)
            try:
                await pool.open(wait=True, timeout=self.db.timeout)
            except self.db.psycopg.OperationalError as exc:
                del self._pools[loop]
                raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        return pool

    def loop_pool(self) -> Any | None:
        """The running loop's pool, or None when it has none."""
        return self._pools.get(asyncio.get_running_loop())

    @contextmanager
    def connection(self) -> Iterator[BridgedConnection]:
        """A connection of the running loop's pool, for bridged code (`PgDatabase.connection`).

        The pool is opened here when the call first reaches this database (a read replica
        of a store whose calls run on the primary's route).
        """
        pool = self.loop_pool()
        if pool is None:
            if self.db.closed:
                raise StoreClosedError("the memory store is closed")
            pool = await_io(self._pool())
        with _entered(pool.connection()) as conn:
            yield BridgedConnection(conn)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run synchronous `fn(*args, **kwargs)` with its queries awaited on this loop's pool.

        Raises:
            StoreClosedError: The database was closed (no pool is opened then).
        """
        if self.db.closed:
            raise StoreClosedError("the memory store is closed")
        await self._pool()
        return await run_bridged(self, fn, *args, **kwargs)

    async def aclose(self) -> None:
        """Close the running loop's pool (idempotent)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close(self) -> None:
        """Forget every pool (a pool can only be closed on its own loop: use `aclose` there)."""
        if self._pools:
            logger.debug("dropping %d async pools not closed with aclose()", len(self._pools))
        self._pools.clear()


class AsyncRoutes:
    """The async I/O of a store with several servers: calls run on the primary's route.

    A bridged call asks each server's route for its loop's pool when it first reads there
    (`AsyncPgRoute.connection`); `aclose()` closes them all.

    Args:
        primary: The route of the primary (runs the calls).
        others: The routes of the read replicas.
    """

    def __init__(self, primary: AsyncPgRoute, others: list[AsyncPgRoute]) -> None:
        self.primary = primary
        self.others = list(others)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """See `AsyncPgRoute.run`."""
        return await self.primary.run(fn, *args, **kwargs)

    async def aclose(self) -> None:
        """Close the running loop's pools of every server (idempotent)."""
        for route in [self.primary, *self.others]:
            await route.aclose()
