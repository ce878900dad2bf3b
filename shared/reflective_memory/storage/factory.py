"""Choose the store of record from what the caller gave: a PostgreSQL URI or a store object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.base import MemoryStore, missing_members
from reflective_memory.storage.pg_database import is_postgres_dsn

__all__ = ["open_store"]


def open_store(store: Any, *, read_dsn: str | Sequence[str] | None = None) -> MemoryStore:
    """Return the store for `store`.

    Args:
        store: A `postgresql://...` / `postgres://...` URI (opens a `PostgresStore` with its own
            connection pool) or an object implementing `MemoryStore` (used as is).
        read_dsn: With a URI: read replicas of it (`PostgresStore(read_dsn=...)`: reads on a
            hot standby, read-your-writes by WAL position).

    Raises:
        InvalidInputError: Any other value (naming the missing `MemoryStore` members), or
            `read_dsn` without a URI, before anything is opened.
    """
    if read_dsn is not None and not isinstance(store, str):
        raise InvalidInputError(
            "read_dsn goes with a 'postgresql://...' store URI; a store object is opened by "
            "you (give it its replicas: PostgresStore(dsn, read_dsn=...))"
        )
    if isinstance(store, str):
        if not is_postgres_dsn(store):
            raise InvalidInputError(
                "store must be a 'postgresql://...' URI or a store object; for an embedded "
                f"store pass a directory as `path` (got {store[:40]!r})"
            )
        from reflective_memory.storage.postgres import PostgresStore

        return PostgresStore(store, read_dsn=read_dsn)
    if not isinstance(store, MemoryStore):
        missing = missing_members(store, MemoryStore)
        raise InvalidInputError(
            f"store {type(store).__name__} does not implement the store contract "
            f"`reflective_memory.storage.base.MemoryStore` (missing {', '.join(missing)})"
        )
    return store
