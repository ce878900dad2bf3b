"""Storage: the store contract, the embedded SQLite store and the derived search indexes.

- `base`: the `MemoryStore` protocol, the optional capabilities (`SessionBuildLock`,
  `ServerSearch`, `StateHolder`, `TurnUnitAudit`) and the records that cross them.
- `state`: the `StateStore` protocol for learned state and `FileStateStore` (files or memory).
- `checksum`: CRC-32 of stored text (written with each row, checked on read) and the seal of
  files and blobs.
- `sqlite`: `SQLiteStore`, the embedded default (SQLite in WAL mode is the truth).
- `index`: per-user dense (FAISS) and lexical (BM25) indexes, caches rebuilt from the store.
- `postgres`: `PostgresStore`, the server backend on PostgreSQL + pgvector for many processes
  and hosts, composed of `pg_database.PgDatabase` (connections), `pg_search.PgSearch`
  (embeddings and server-side search, `server_index`) and `pg_state.DatabaseStateStore`
  (learned state); the schema is in `pg_schema` (the `postgres` extra; not imported here).
  `factory.open_store` picks the store from a URI or an object.

The contract tests every store passes ship as `reflective_memory.testing`.
"""

from reflective_memory.storage.base import (
    MemoryDraft,
    MemoryStore,
    ServerSearch,
    SessionBuildLock,
    SessionInfo,
    StateHolder,
    TurnUnitAudit,
)
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.storage.state import FileStateStore, StateStore

__all__ = [
    "MemoryStore",
    "SessionBuildLock",
    "ServerSearch",
    "StateHolder",
    "TurnUnitAudit",
    "StateStore",
    "FileStateStore",
    "MemoryDraft",
    "SessionInfo",
    "SQLiteStore",
]
