"""What an export reads from and an import writes to: a store, its learned state, an embedder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.base import MemoryStore, MemoryVectors, StateHolder
from reflective_memory.storage.state import StateStore

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder
    from reflective_memory.rmm.feedback import RerankStage
    from reflective_memory.sessions.writer import SessionWriter

__all__ = ["Endpoint", "endpoint", "open_endpoint", "STORE_FILE", "STATE_DIR"]

#: The SQLite file of an embedded store's directory.
STORE_FILE = "memory.sqlite3"
#: The learned-state folder of an embedded store's directory.
STATE_DIR = "rerankers"


@runtime_checkable
class _Engine(Protocol):
    """What a `ReflectiveMemory` offers an export or import (its store, embedder and state)."""

    store: MemoryStore
    embedder: Embedder
    rerank_stage: RerankStage
    sessions: SessionWriter


@dataclass(frozen=True)
class Endpoint:
    """A store with its learned state and (for imports) the embedder it is searched with.

    Attributes:
        store: The store of record.
        state: Its learned state, or None when there is none to read or write.
        embedder: The embedder the store's memories are searched with, if known.
        vectors: Makes vectors of stored memories as the memory's writing makes them (a
            `ReflectiveMemory`'s, with its own embedder); None: keys are embedded.
    """

    store: MemoryStore
    state: StateStore | None = None
    embedder: Embedder | None = None
    vectors: MemoryVectors | None = None


def endpoint(
    target: Any, *, state: StateStore | None = None, embedder: Embedder | None = None
) -> Endpoint:
    """The `Endpoint` of a `ReflectiveMemory`, a `MemoryStore` or an `Endpoint`.

    A memory gives its store, its rerankers' state and its embedder; a store gives itself and
    its own state when it keeps one (`StateHolder`, e.g. PostgreSQL). `state` and `embedder`
    override what is found.

    Raises:
        InvalidInputError: `target` is none of those.
    """
    if isinstance(target, Endpoint):
        found = target
    elif isinstance(target, MemoryStore):
        found = Endpoint(target, target.state if isinstance(target, StateHolder) else None)
    elif isinstance(target, _Engine):
        # what feedback taught and waits to be stored is stored first; what this process
        # holds is read again after an import writes the state
        target.rerank_stage.learning.flush()
        found = Endpoint(
            target.store,
            target.rerank_stage.state,
            target.embedder,
            target.sessions.stored_vectors,
        )
    else:
        raise InvalidInputError(
            f"expected a ReflectiveMemory or a MemoryStore, got {type(target).__name__}"
        )
    return Endpoint(
        found.store,
        found.state if state is None else state,
        found.embedder if embedder is None else embedder,
        found.vectors if embedder is None or embedder is found.embedder else None,
    )


def open_endpoint(db: str | Path | None = None, dsn: str | None = None, **pg: Any) -> Endpoint:
    """Open an embedded store directory (`db`) or a PostgreSQL store (`dsn`) with its state.

    No engine is opened, so nothing runs on open (open sessions are not ended, no model loads).
    Close it with `endpoint.store.close()`.

    Args:
        db: An embedded store's directory (created when missing).
        dsn: A `postgresql://...` URI.
        **pg: Options of `PostgresStore` (e.g. `schema`, `read_dsn`: its read replicas).

    Raises:
        InvalidInputError: Neither or both given, or replicas of an embedded store.
    """
    if (db is None) == (dsn is None):
        raise InvalidInputError("give either a store directory or a PostgreSQL DSN")
    if db is not None and pg.get("read_dsn"):
        raise InvalidInputError("read_dsn names replicas of a PostgreSQL store, not a directory")
    if dsn is not None:
        from reflective_memory.storage.postgres import PostgresStore

        return endpoint(PostgresStore(dsn, **pg))
    from reflective_memory.storage.sqlite import SQLiteStore
    from reflective_memory.storage.state import FileStateStore

    directory = Path(db)  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    return Endpoint(SQLiteStore(directory / STORE_FILE), FileStateStore(directory / STATE_DIR))
