"""Choose the store of record from what the caller gave: a PostgreSQL URI or a store object."""

from __future__ import annotations

from typing import Any

from reflective_memory.errors import InvalidInputError

__all__ = ["open_store", "STORE_METHODS"]

#: Methods a store object must have to back a `ReflectiveMemory`.
STORE_METHODS = (
    "add_turns", "turns", "session", "sessions", "replace_session_memories", "upsert_memories",
    "memories", "embeddings", "set_embeddings", "version", "delete_user", "delete_session",
    "delete_turns", "users", "close", "closed", "delete_memories", "count", "get_value",
    "set_value",
)  # fmt: skip


def open_store(store: Any) -> Any:
    """Return the store for `store`.

    Args:
        store: A `postgresql://...` / `postgres://...` URI (opens a `PostgresStore` with its own
            connection pool) or an object implementing the store contract (used as is).

    Raises:
        InvalidInputError: Any other value, before anything is opened.
    """
    from reflective_memory.storage.postgres import is_postgres_dsn

    if isinstance(store, str):
        if not is_postgres_dsn(store):
            raise InvalidInputError(
                "store must be a 'postgresql://...' URI or a store object; for an embedded "
                f"store pass a directory as `path` (got {store[:40]!r})"
            )
        from reflective_memory.storage.postgres import PostgresStore

        return PostgresStore(store)
    missing = [m for m in STORE_METHODS if not hasattr(store, m)]
    if missing:
        raise InvalidInputError(
            f"store {type(store).__name__} does not implement the store contract "
            f"(missing {', '.join(missing[:5])})"
        )
    return store
