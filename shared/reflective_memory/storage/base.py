"""The store contract: what the engine needs from storage, whichever backend holds it.

`MemoryStore` is the protocol every store implements; `MemoryDraft` and `SessionInfo` are the
records that cross it. A store may also offer optional capabilities, each a protocol the engine
checks once with `isinstance`:

- `SessionBuildLock`: building a session's memories is serialised across processes;
- `ServerSearch`: searches run on the database server instead of in-process indexes;
- `StateHolder`: the store keeps learned state (a `StateStore`) for every process it serves;
- `TurnUnitAudit`: the store finds open sessions with turns whose `turn` unit is missing (a
  process died between committing a turn and indexing it) in one query.
- `RestoresTimes`: the store can set the bookkeeping times of imported records (export/import);
- `KeyListing`: the store lists the memories written since a row mark, so an index that only
  gained memories reads just those.

The contract names no implementation: every store, ours or a third party's, passes the
contract tests shipped in `reflective_memory.testing`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from reflective_memory.errors import StoreClosedError
from reflective_memory.storage.state import StateStore
from reflective_memory.text import as_utc
from reflective_memory.types import Memory, Turn

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder
    from reflective_memory.storage.user_index import UserIndex

__all__ = [
    "MemoryStore",
    "MemoryVectors",
    "SessionBuildLock",
    "ServerSearch",
    "KeyListing",
    "StateHolder",
    "TurnUnitAudit",
    "RestoresTimes",
    "NativeAsync",
    "MemoryDraft",
    "SessionInfo",
    "session_fence",
    "missing_members",
    "require_open",
    "time_text",
    "text_time",
]


def time_text(value: datetime | None) -> str | None:
    """A time as the stores keep it: ISO-8601 text with its offset (naive is read as UTC)."""
    return None if value is None else as_utc(value).isoformat()


def text_time(value: str | datetime | None) -> datetime | None:
    """A stored time read back, timezone-aware.

    A row an older version wrote without an offset is read as UTC, so old data never mixes
    naive and aware times with new.
    """
    if value is None:
        return None
    return as_utc(value if isinstance(value, datetime) else datetime.fromisoformat(value))


#: Makes vectors for stored memories that have none of the current embedder, as writing makes
#: them: `(user_id, ids, keys) -> (len(ids), dim)` float32 (`SessionWriter.stored_vectors`).
MemoryVectors = Callable[[str, list[str], list[str]], np.ndarray]


def session_fence(turns: Sequence[Turn]) -> tuple[int, int]:
    """What a session build consumed: `(number of turns, largest turn seq)`.

    Any turn added to the session raises the largest seq, any deletion lowers the count, so a
    store compares this pair inside the transaction that stores the build.
    """
    return len(turns), max((int(t.seq) for t in turns), default=0)


@dataclass
class MemoryDraft:
    """A memory about to be stored (id, times and embedding are filled in by the store).

    Attributes:
        session_id: Source session.
        granularity: Unit kind.
        text: Raw text for the LLM.
        key: Indexed text.
        turn_ids: Source turn ids (callers' ids).
        start_time: First source turn time.
        end_time: Last source turn time.
        metadata: Extra fields.
        id: Optional fixed id (else a new one is made).
    """

    session_id: str
    granularity: str
    text: str
    key: str
    turn_ids: tuple[str, ...]
    start_time: datetime | None = None
    end_time: datetime | None = None
    metadata: dict[str, Any] | None = None
    id: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    """A session's bookkeeping row."""

    user_id: str
    session_id: str
    status: str
    n_turns: int
    first_time: datetime | None
    last_time: datetime | None
    created_at: datetime
    ended_at: datetime | None


@runtime_checkable
class MemoryStore(Protocol):
    """What the engine and its adapters need from storage; every store implements all of it."""

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (later calls raise `StoreClosedError`)."""
        ...

    def add_turns(self, turns: Sequence[dict[str, Any]]) -> list[Turn]:
        """Commit turns durably; return them as stored."""
        ...

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns of a user (optionally one session), in order."""
        ...

    def session(self, user_id: str, session_id: str) -> SessionInfo | None:
        """A session's row, or None."""
        ...

    def sessions(self, user_id: str, status: str | None = None) -> list[SessionInfo]:
        """A user's sessions."""
        ...

    def replace_session_memories(
        self,
        user_id: str,
        session_id: str,
        granularities: Sequence[str],
        drafts: Sequence[MemoryDraft],
        embeddings: np.ndarray,
        embed_model: str,
        *,
        fence: tuple[int, int] | None = None,
    ) -> list[Memory]:
        """Atomically replace a session's memories of the given kinds and mark it ended.

        `drafts` may also hold memories of other kinds (e.g. topics); those are inserted or
        replaced by id in the same transaction. With `fence` (see `session_fence`), the
        session's current `(turn count, largest seq)` is compared with it inside the
        transaction; on a mismatch nothing is written and `SessionChangedError` is raised.
        """
        ...

    def upsert_memories(
        self, user_id: str, drafts: Sequence[MemoryDraft], embeddings: np.ndarray, embed_model: str
    ) -> list[Memory]:
        """Insert or update memories by id."""
        ...

    def delete_memories(self, user_id: str, ids: Sequence[str]) -> int:
        """Delete memories of a user by id (others' ids are ignored); return how many went."""
        ...

    def delete_expired(self, user_id: str, now: float) -> int:
        """Delete the user's memories whose metadata `expires_at` is at or before `now`.

        `expires_at` is seconds since the epoch (a JSON number; other values never expire).
        One statement decides and deletes, so an expiry moved forward concurrently is either
        seen or waits; the deletion is as complete as `delete_memories`'. Returns how many went.
        """
        ...

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """A user's memories (all, or these ids in this order; unknown ids are skipped)."""
        ...

    def update_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """Merge top-level fields into the metadata of some memories of a user (by id).

        A metadata-only write: text, key, embedding, `updated_at` and the user's `version` stay
        as they were, so no index is rebuilt and nothing is re-embedded (a LangGraph item's
        expiry is refreshed this way). Others' and unknown ids are ignored.

        Returns:
            How many memories were updated.
        """
        ...

    def embeddings(
        self, user_id: str
    ) -> tuple[list[str], list[str], list[bytes | None], list[str]]:
        """Ids, keys, raw embedding blobs and model names of a user's memories."""
        ...

    def vectors(self, user_id: str, ids: Sequence[str], model: str) -> dict[str, np.ndarray]:
        """Stored embeddings (by `model`) of the given memories; others are left out."""
        ...

    def set_embeddings(self, user_id: str, ids: Sequence[str], emb: np.ndarray, model: str) -> None:
        """Store (re)computed embeddings without changing the user's version."""
        ...

    def version(self, user_id: str) -> int:
        """A counter that changes whenever the user's memories change; 0 for an unknown user.

        A version is never repeated for a user id, even after `delete_user` and reuse of the id
        (derived caches are keyed by it).
        """
        ...

    def delete_user(self, user_id: str) -> int:
        """Delete everything of a user, its id included, from every file before returning.

        Returns the number of turns deleted.
        """
        ...

    def delete_session(self, user_id: str, session_id: str) -> int:
        """Delete a session's turns and every memory derived from it, from every file.

        Topics that merged the session in are derived from it too. Returns the number of turns
        deleted.
        """
        ...

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """Delete some (or all) turns of a session and the memories holding their text.

        The session is reopened when turns remain. Returns the deleted turns.
        """
        ...

    def count(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's things.

        Keys: `turns`, `sessions`, `open_sessions`, `memories` and
        `memories_by_granularity` (granularity to count).
        """
        ...

    def users(self) -> list[str]:
        """Every user with stored turns or memories."""
        ...

    def set_turn_extra(
        self, user_id: str, session_id: str, extras: dict[str, dict[str, Any]]
    ) -> None:
        """Attach JSON data to stored turns (by turn id); deleted together with the turns."""
        ...

    def turn_extra(self, user_id: str, session_id: str) -> dict[str, dict[str, Any]]:
        """The extra data of a session's turns, by turn id."""
        ...

    def get_value(self, key: str) -> Any | None:
        """A JSON value stored by `set_value`, or None.

        Keys shaped `<namespace>/<user_id>/...` belong to the user: `delete_user` deletes them,
        and `delete_session` deletes `<namespace>/<user_id>/<session_id>`.
        """
        ...

    def set_value(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value durably (see `get_value` for per-user keys)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


@runtime_checkable
class SessionBuildLock(Protocol):
    """A store shared by several processes that serialises building one session's memories."""

    def session_build(
        self, user_id: str, session_id: str
    ) -> AbstractContextManager[list[Memory] | None]:
        """Hold the cross-process lock for building one session's memories.

        The context yields None when the caller should build, or the session's stored memories
        when another process built them while this one waited (the session is ended and no turn
        was added since).
        """
        ...


@runtime_checkable
class ServerSearch(Protocol):
    """A store that searches on its server: indexes are snapshots, nothing is built locally."""

    def server_index(
        self,
        user_id: str,
        embedder: Embedder,
        vectors: MemoryVectors | None = None,
        before: UserIndex | None = None,
    ) -> UserIndex:
        """A `UserIndex` of the user's current memories whose searches run on the server.

        Memories without an embedding of `embedder` are embedded and stored first: by
        `vectors` when given, else from their keys. `before`, the user's previous index,
        lets a snapshot read only what was written since.
        """
        ...


@runtime_checkable
class KeyListing(Protocol):
    """A store that lists a user's memory ids and keys without reading their embeddings.

    An index that only gained memories since its last version reads the embeddings of the
    new ones alone.
    """

    def memory_keys(
        self, user_id: str, after: int = 0
    ) -> tuple[list[str], list[str], list[int], int]:
        """The memories of a user from row mark `after` on, and how many there are.

        Returns ids, keys and row marks of the memories whose mark is `after` or above, in
        mark order (the order of `MemoryStore.embeddings`), and the user's memory count. A
        memory gets a new mark, above every other, whenever its row is written (a rewrite,
        a new key); while the memory at mark `after` stands, no new memory gets a mark at or
        below it.
        """
        ...

    def row_mark(self, user_id: str, memory_id: str) -> int | None:
        """The row mark of one memory (None when the user has no such memory)."""
        ...


@runtime_checkable
class StateHolder(Protocol):
    """A store that keeps learned state (reranker weights) for every process it serves.

    The state of a user (owner: the user id) is deleted by the store's `delete_user`.
    """

    @property
    def state(self) -> StateStore:
        """The store's `StateStore`."""
        ...


@runtime_checkable
class TurnUnitAudit(Protocol):
    """A store that finds sessions whose turns are not all indexed, in one query."""

    def sessions_missing_turn_units(self, user_id: str | None = None) -> list[tuple[str, str]]:
        """`(user_id, session_id)` of open sessions with more turns than `turn` units.

        Each turn of an open session has a `turn` unit once `add_turns` indexed it; a session
        with fewer lost some to a crash in between. The cost grows with the open sessions (of
        `user_id`, or of every user when it is None), never with ended history.
        """
        ...


@runtime_checkable
class RestoresTimes(Protocol):
    """A store that can set the times it keeps itself, so an imported record keeps its own.

    `reflective_memory.portable` imports sessions and memories through the `MemoryStore`
    writes, which stamp them with the time of the import; a store offering this capability is
    then given back the exported times.
    """

    def restore_times(
        self,
        user_id: str,
        sessions: Mapping[str, tuple[datetime, datetime | None]],
        memories: Mapping[str, tuple[datetime, datetime]],
    ) -> None:
        """Set `(created_at, ended_at)` of sessions and `(created_at, updated_at)` of memories.

        Ids the user does not have are ignored; the user's version changes when a memory's
        times do (rankings read them).
        """
        ...


@runtime_checkable
class NativeAsync(Protocol):
    """A store whose I/O can be awaited on an event loop (`ReflectiveMemory`'s `a*` methods).

    `async_io()` returns an object with `async run(fn, *args, **kwargs)` that runs synchronous
    engine code with the store's queries awaited on the running loop, and `async aclose()`
    that closes the loop's connections; or None when this store has none (e.g. it was given
    a caller's sync pool).
    """

    def async_io(self) -> Any | None:
        """The store's async connection route, or None."""
        ...


def missing_members(obj: object, protocol: type) -> list[str]:
    """The public members of `protocol` that `obj` lacks (for error messages), sorted."""
    names = [n for n in vars(protocol) if not n.startswith("_")]
    return sorted(n for n in names if not hasattr(obj, n))


def require_open(store: MemoryStore) -> None:
    """Raise `StoreClosedError` when `store` was closed."""
    if store.closed:
        raise StoreClosedError("this ReflectiveMemory is closed; open a new one")
