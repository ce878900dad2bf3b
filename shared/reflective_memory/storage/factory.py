"""Choose the store of record from what the caller gave: a PostgreSQL URI or a store object."""

from __future__ import annotations

from typing import Any

from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.base import MemoryStore, missing_members
from reflective_memory.storage.pg_database import is_postgres_dsn

__all__ = ["open_store"]


def open_store(store: Any) -> MemoryStore:
    """Return the store for `store`.

    Args:
        store: A `postgresql://...` / `postgres://...` URI (opens a `PostgresStore` with its own
            connection pool) or an object implementing `MemoryStore` (used as is).

    Raises:
        InvalidInputError: Any other value (naming the missing `MemoryStore` members), before
            anything is opened.
    """
    if isinstance(store, str):
        if not is_postgres_dsn(store):
            raise InvalidInputError(
                "store must be a 'postgresql://...' URI or a store object; for an embedded "
                f"store pass a directory as `path` (got {store[:40]!r})"
            )
        from reflective_memory.storage.postgres import PostgresStore

        return PostgresStore(store)
    if not isinstance(store, MemoryStore):
        missing = missing_members(store, MemoryStore)
        raise InvalidInputError(
            f"store {type(store).__name__} does not implement the store contract "
            f"`reflective_memory.storage.base.MemoryStore` (missing {', '.join(missing)})"
        )
    return store
