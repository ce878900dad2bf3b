"""Storage: the store contract, the embedded SQLite store and the derived search indexes.

- `base`: the `MemoryStore` protocol and the records that cross it.
- `sqlite`: `SQLiteStore`, the embedded default (SQLite in WAL mode is the truth).
- `index`: per-user dense (FAISS) and lexical (BM25) indexes, caches rebuilt from the store.
- `postgres` (+ `pg_schema`, `pg_search`, `pg_state`, `server_index`): `PostgresStore`, the
  server backend on PostgreSQL + pgvector for many processes and hosts (the `postgres` extra;
  not imported here). `factory.open_store` picks the store from a URI or an object.
"""

from reflective_memory.storage.base import MemoryDraft, MemoryStore, SessionInfo
from reflective_memory.storage.sqlite import SQLiteStore

__all__ = ["MemoryStore", "MemoryDraft", "SessionInfo", "SQLiteStore"]
