"""Connections to one schema of one PostgreSQL database, shared by the PostgreSQL classes.

`PgDatabase` owns the connection pool (or borrows the caller's), the schema name and the
pgvector type registration. `PostgresStore`, its server-side search (`PgSearch`) and its state
store (`DatabaseStateStore`) all take their connections from one `PgDatabase`.

Needs the `postgres` extra: `pip install 'reflective-memory[postgres]'`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    StoreClosedError,
    StoreUnavailableError,
)
from reflective_memory.storage.bridge import await_io, bridged
from reflective_memory.storage.pg_async import AsyncPgRoute
from reflective_memory.storage.pg_schema import check_schema_name

__all__ = ["PgDatabase", "is_postgres_dsn"]

logger = logging.getLogger(__name__)

_DSN_PREFIXES = ("postgresql://", "postgres://")


def is_postgres_dsn(value: object) -> bool:
    """Whether `value` is a PostgreSQL connection URI (`postgresql://...` or `postgres://...`)."""
    return isinstance(value, str) and value.startswith(_DSN_PREFIXES)


def _import_driver() -> tuple[Any, Any, Any]:
    try:
        import psycopg
        import psycopg_pool
        from pgvector.psycopg import register_vector
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the PostgreSQL store needs psycopg, psycopg_pool and pgvector: "
            "pip install 'reflective-memory[postgres]'"
        ) from exc
    return psycopg, psycopg_pool, register_vector


class PgDatabase:
    """A connection pool and the schema the tables live in.

    The constructor checks the settings and makes the pool; `open()` connects it.

    Args:
        dsn_or_pool: A connection URI (`postgresql://user@host:5432/db`) or an open
            `psycopg_pool.ConnectionPool` you own (it is not closed by `close()`).
        schema: Schema holding the tables.
        pool_min: Connections kept open (URI only).
        pool_max: Most connections (URI only).
        timeout: Seconds to wait for a pooled connection before raising.

    Raises:
        ConfigError: Bad schema name or pool sizes, or the driver is not installed.
        InvalidInputError: `dsn_or_pool` is neither a PostgreSQL URI nor a pool.
        StoreUnavailableError: The server cannot be reached.
    """

    def __init__(
        self,
        dsn_or_pool: Any,
        *,
        schema: str = "reflective_memory",
        pool_min: int = 1,
        pool_max: int = 10,
        timeout: float = 30.0,
    ) -> None:
        self.schema = check_schema_name(schema)
        #: The schema as a quoted SQL identifier, for building statements.
        self.qualified = f'"{self.schema}"'
        for name, val in (("pool_min", pool_min), ("pool_max", pool_max)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ConfigError(f"{name} must be a positive integer, got {val!r}")
        self.timeout = float(timeout)
        self._sizes = (min(pool_min, pool_max), pool_max)
        self.psycopg, self._psycopg_pool, self._register_vector = _import_driver()
        self._own_pool = False
        if is_postgres_dsn(dsn_or_pool):
            self.dsn: str | None = dsn_or_pool
            pool = self._psycopg_pool.ConnectionPool(
                dsn_or_pool,
                min_size=min(pool_min, pool_max),
                max_size=pool_max,
                timeout=self.timeout,
                open=False,
                name="reflective-memory",
            )
            self._own_pool = True
        elif isinstance(dsn_or_pool, self._psycopg_pool.ConnectionPool):
            self.dsn = None
            pool = dsn_or_pool
        else:
            raise InvalidInputError(
                "dsn_or_pool must be a 'postgresql://...' URI or a psycopg_pool.ConnectionPool, "
                f"got {type(dsn_or_pool).__name__}"
            )
        self._pool: Any | None = pool
        #: Native async I/O (psycopg's async pool), for a URI only: a caller's sync pool has no
        #: async twin, so `ReflectiveMemory`'s `a*` methods then run in threads.
        self.async_route = None if self.dsn is None else AsyncPgRoute(self, self.dsn)

    @property
    def dsn_label(self) -> str:
        """The server(s) of the URI as `host:port` (no user or password), for messages."""
        if self.dsn is None:
            return "a caller's pool"
        try:
            parts = self.psycopg.conninfo.conninfo_to_dict(self.dsn)
        except self.psycopg.ProgrammingError:
            return "an unparsable URI"
        hosts = str(parts.get("host") or "localhost").split(",")
        ports = str(parts.get("port") or "5432").split(",")
        ports = ports * len(hosts) if len(ports) == 1 else ports
        return ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))

    def open(self, *, wait: bool = True) -> None:
        """Connect the pool this object made (a caller's pool is used as it is).

        Args:
            wait: Wait until `pool_min` connections are made (else they are made in the
                background, and a server that is down is found by the first call).

        Raises:
            StoreUnavailableError: The server cannot be reached within `timeout`.
        """
        if not self._own_pool:
            return
        pool = self.pool
        try:
            pool.open(wait=wait, timeout=self.timeout)
        except self._psycopg_pool.PoolTimeout as exc:
            self.close()
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc

    @property
    def pool(self) -> Any:
        """The connection pool; raises `StoreClosedError` after `close()`."""
        if self._pool is None:
            raise StoreClosedError("the memory store is closed")
        return self._pool

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._pool is None

    def async_pool(self, dsn: str, configure: Any) -> Any:
        """A new, unopened `psycopg_pool.AsyncConnectionPool` sized like the sync pool."""
        return self._psycopg_pool.AsyncConnectionPool(
            dsn,
            min_size=self._sizes[0],
            max_size=self._sizes[1],
            timeout=self.timeout,
            open=False,
            configure=configure,
            name="reflective-memory-async",
        )

    def close(self) -> None:
        """Close the pool if this object opened it (idempotent); forget the async pools."""
        if self.async_route is not None:
            self.async_route.close()
        pool, self._pool = self._pool, None
        if pool is not None and self._own_pool:
            pool.close()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection without type registration (schema work, advisory locks).

        Inside a bridged call (`reflective_memory.storage.bridge`) it is a connection of this
        database's async pool on the running loop
        (`reflective_memory.storage.pg_async.BridgedConnection`), used the same way.

        A connection found broken (the server went away, or failed over) makes the pool check
        its idle connections at once, so the calls after it get new connections (a multi-host
        URI then reaches the new primary) instead of meeting the dead ones one by one.
        """
        pool, own = self.pool, self.async_route
        on_loop = own is not None and bridged()
        try:
            if on_loop:
                with own.connection() as bridged_conn:  # type: ignore[union-attr]
                    yield bridged_conn
                return
            with pool.connection() as conn:
                yield conn
        except self.psycopg.OperationalError as exc:
            if self._lost_server(exc):
                self._check_idle(own.loop_pool() if on_loop else pool)  # type: ignore[union-attr]
            raise StoreUnavailableError(f"PostgreSQL request failed: {exc}") from exc

    def _lost_server(self, exc: Exception) -> bool:
        """Whether `exc` says the connection or the server is gone (not a query's own error)."""
        errors = self.psycopg.errors
        statement = (errors.TransactionRollback, errors.QueryCanceled, errors.LockNotAvailable)
        return not isinstance(exc, statement) and not isinstance(
            exc, self._psycopg_pool.PoolTimeout
        )

    def _check_idle(self, pool: Any) -> None:
        """Drop the pool's broken idle connections (best effort: a failure here is logged)."""
        if pool is None:
            return
        try:
            if bridged():
                await_io(pool.check())
            else:
                pool.check()
        except Exception as exc:  # noqa: BLE001 - the caller raises the original error
            logger.debug("checking the idle connections failed: %s", exc)

    def with_vectors(self, conn: Any) -> Any:
        """Register pgvector's types on `conn` (once per connection); return it."""
        if conn.adapters.types.get("vector") is None:
            self._register_vector(conn)
            conn.commit()
        return conn

    @contextmanager
    def transaction(self, *, repeatable_read: bool = False) -> Iterator[Any]:
        """A pooled connection with pgvector types; one transaction, committed on exit.

        Args:
            repeatable_read: Read every statement from one snapshot (`REPEATABLE READ`).
        """
        with self.connection() as conn, self.begin(conn, repeatable_read=repeatable_read):
            yield conn

    @contextmanager
    def begin(self, conn: Any, *, repeatable_read: bool = False) -> Iterator[Any]:
        """One transaction on `conn` (a connection of this database), committed on exit."""
        self.with_vectors(conn)
        if not repeatable_read:
            with conn.transaction():
                yield conn
            return
        conn.isolation_level = self.psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                yield conn
        finally:
            conn.isolation_level = None
