"""Reading and editing stored records: turns, memories, sessions, users and deletes."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory.errors import InvalidInputError, UnknownMemoryError
from reflective_memory.storage.base import MemoryDraft, MemoryStore, require_open
from reflective_memory.storage.index import IndexCache
from reflective_memory.types import GRANULARITIES, Memory, Turn
from reflective_memory.validation import (
    check_choice,
    check_id,
    check_ids,
    check_json_object,
    check_optional_id,
    check_text,
)

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder
    from reflective_memory.rmm.feedback import RerankStage

logger = logging.getLogger(__name__)

__all__ = ["Records"]


class Records:
    """A memory's record API: list, read, write and delete turns, memories and users.

    A collaborator of `ReflectiveMemory`. Every change drops what derived state knew of it:
    the user's index cache, and (on deletes) the rerankers' kept retrievals and learned state.

    Args:
        store: The store of record.
        indexes: The users' index caches.
        rerankers: RMM's rerankers (a deleted user's learned state goes with them).
        embedder: Embeds the keys of memories written with `put_memory`.
        embed_keys: Embeds key texts (cut and batched as the write side does).
    """

    def __init__(
        self,
        store: MemoryStore,
        indexes: IndexCache,
        rerankers: RerankStage,
        embedder: Embedder,
        embed_keys: Callable[[list[str]], np.ndarray],
    ) -> None:
        self.store, self.indexes, self.rerank_stage = store, indexes, rerankers
        self.embedder, self._embed_keys = embedder, embed_keys

    def _open(self) -> None:
        require_open(self.store)

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns of a user, or of one session, in order (unknown ids give `[]`)."""
        self._open()
        check_id("user_id", user_id)
        if session_id is not None:
            check_id("session_id", session_id)
        return self.store.turns(user_id, session_id)

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """A user's memories (all of them, or the given ids in that order)."""
        self._open()
        check_id("user_id", user_id)
        if ids is not None:
            ids = check_ids("ids", ids)
        return self.store.memories(user_id, ids)

    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the user's sessions that have turns not yet turned into memories."""
        self._open()
        check_id("user_id", user_id)
        return [s.session_id for s in self.store.sessions(user_id, status="open")]

    def delete_user(self, user_id: str) -> int:
        """Erase a user: turns, memories, caches, reranker data and the id itself.

        Nothing of the user remains in any file of the store when this returns (README,
        "Deleting data"). Returns the number of turns deleted.
        """
        self._open()
        check_id("user_id", user_id)
        n = self.store.delete_user(user_id)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget(user_id)
        return n

    def delete_session(self, user_id: str, session_id: str) -> int:
        """Erase a session's turns and every memory derived from it; return the turns deleted.

        Topic memories that merged the session in are derived from it and go too.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        n = self.store.delete_session(user_id, session_id)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget_retrievals(user_id)
        return n

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """Delete some turns of a session (all of them when `turn_ids` is None).

        Every memory holding a deleted turn's text is erased with it (units, notes, topics); the
        session is reopened while turns remain, and ending it again rebuilds its memories from
        them. Unknown turn ids are ignored.

        Returns:
            The deleted turns, in order.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        if turn_ids is not None:
            turn_ids = check_ids("turn_ids", turn_ids)
        gone = self.store.delete_turns(user_id, session_id, turn_ids)
        if gone:
            self.indexes.invalidate(user_id)
            self.rerank_stage.forget_retrievals(user_id)
        return gone

    def put_memory(
        self,
        user_id: str,
        text: str,
        *,
        memory_id: str | None = None,
        key: str | None = None,
        granularity: str = "item",
        session_id: str = "",
        turn_ids: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
    ) -> Memory:
        """Store (or replace, by id) one memory written directly rather than built from turns.

        Framework stores (a LangGraph `BaseStore`, say) keep their items this way. The memory is
        indexed like any other and found by `retrieve`.

        Args:
            user_id: Owner.
            text: What an LLM should read.
            memory_id: Replace the memory with this id if it exists (else a new id is made).
            key: Text to index (default: `text`).
            granularity: Unit kind; `item` unless it is a `topic` or `note` written elsewhere.
            session_id: Session it came from, if any.
            turn_ids: Source turn ids, if any.
            metadata: JSON-serialisable extra fields.

        Returns:
            The stored memory.
        """
        self._open()
        check_id("user_id", user_id)
        draft = _direct_draft(text, key, granularity, session_id, turn_ids, metadata, memory_id)
        (stored,) = self.store.upsert_memories(
            user_id, [draft], self._embed_keys([draft.key]), self.embedder.name
        )
        return stored

    def get_memory(self, user_id: str, memory_id: str) -> Memory:
        """One memory of a user by id.

        Raises:
            UnknownMemoryError: The user has no memory with that id.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("memory_id", memory_id)
        found = self.store.memories(user_id, [memory_id])
        if not found:
            raise UnknownMemoryError(f"user {user_id!r} has no memory {memory_id!r}")
        return found[0]

    def update_memory_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """Merge top-level fields into the metadata of memories of a user, by memory id.

        A metadata-only write (see `MemoryStore.update_metadata`): nothing is re-embedded and
        the user's index stays valid. Unknown ids are ignored.

        Returns:
            How many memories were updated.
        """
        self._open()
        check_id("user_id", user_id)
        if not isinstance(updates, Mapping):
            raise InvalidInputError("updates must map memory ids to metadata fields")
        checked: dict[str, dict[str, Any]] = {}
        for mid, fields in updates.items():
            check_id("memory_id", mid)
            if not isinstance(fields, Mapping):
                raise InvalidInputError(f"the metadata fields of {mid!r} must be a dict")
            checked[mid] = check_json_object("metadata", dict(fields)) or {}
        return self.store.update_metadata(user_id, checked)

    def delete_memory(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory of a user; return whether it existed (see `delete_memories`)."""
        return self.delete_memories(user_id, [memory_id]) > 0

    def delete_expired(self, user_id: str, now: float) -> int:
        """Delete a user's memories whose metadata `expires_at` is at or before `now`.

        `expires_at` and `now` are seconds since the epoch (the LangGraph store's TTL writes
        them). The deletion is as complete as `delete_memories`'. Returns how many went.
        """
        self._open()
        check_id("user_id", user_id)
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise InvalidInputError(f"now must be seconds since the epoch, got {now!r}")
        n = self.store.delete_expired(user_id, float(now))
        if n:
            self.indexes.invalidate(user_id)
            self.rerank_stage.forget_retrievals(user_id)
        return n

    def delete_memories(self, user_id: str, memory_ids: Sequence[str]) -> int:
        """Delete memories of a user by id, from every file; return how many existed.

        The user's persisted index files and the rerankers' kept retrievals go with them, as
        for `delete_session`.
        """
        self._open()
        check_id("user_id", user_id)
        ids = check_ids("memory_ids", memory_ids)
        if not ids:
            return 0
        n = self.store.delete_memories(user_id, ids)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget_retrievals(user_id)
        return n

    def users(self) -> list[str]:
        """Every user with stored turns or memories."""
        self._open()
        return self.store.users()

    def stats(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions (open ones too) and memories by granularity."""
        self._open()
        check_id("user_id", user_id)
        return self.store.count(user_id)

    # -- async twins ----------------------------------------------------------------------


def _direct_draft(
    text: str,
    key: str | None,
    granularity: str,
    session_id: str,
    turn_ids: Sequence[str],
    metadata: dict[str, Any] | None,
    memory_id: str | None,
) -> MemoryDraft:
    """The draft of a memory written directly, its fields checked (see `Records.put_memory`).

    Raises:
        InvalidInputError: A field is of the wrong type, empty or not encodable.
    """
    check_text("text", text)
    if key is not None:
        check_text("key", key)
    if session_id != "":  # a memory written directly may come from no session
        check_id("session_id", session_id)
    turn_ids = check_ids("turn_ids", turn_ids)
    check_choice("granularity", granularity, GRANULARITIES)
    check_optional_id("memory_id", memory_id)
    check_json_object("metadata", metadata)
    return MemoryDraft(
        session_id=session_id,
        granularity=granularity,
        text=text,
        key=text if key is None else key,
        turn_ids=tuple(turn_ids),
        metadata=dict(metadata) if metadata is not None else {},
        id=memory_id,
    )
