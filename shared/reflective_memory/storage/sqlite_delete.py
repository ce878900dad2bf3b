"""Deletion methods of `SQLiteStore`: a user, a session, or some turns, gone from every file.

Every delete removes the rows in one transaction (turns, sessions, memories derived from them:
topics that merged a session in, memories citing a deleted turn; turn extras; for a user its
version row and its `<namespace>/<user_id>/...` kv rows), then checkpoints and truncates the
WAL, so no copy stays on disk when the call returns. `PgDeleteMixin` is the PostgreSQL twin.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

from reflective_memory.errors import UnknownSessionError
from reflective_memory.storage.sqlite_guard import guarded as _guarded
from reflective_memory.types import Turn

__all__ = ["SQLiteDeleteMixin"]

# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = :s OR (granularity = 'topic' AND EXISTS (SELECT 1 FROM "
    "json_each(memories.metadata, '$.rmm.sessions') WHERE json_each.value = :s)))"
)

_EDGE_TS = "SELECT ts FROM turns WHERE user_id=? AND session_id=? AND ts IS NOT NULL"


class SQLiteDeleteMixin:
    """Deletion methods of `SQLiteStore`.

    Needs the store's `conn`, `_lock`, `_tx`, `_bump`, `_scrub`, `session` and `turns`.
    """

    conn: sqlite3.Connection
    _lock: threading.RLock
    _tx: Any
    _bump: Any
    _scrub: Any
    session: Any
    turns: Any

    # -- deletion -------------------------------------------------------------------------
    def _delete_values(self, where: str, args: tuple[Any, ...]) -> None:
        """Delete per-user kv rows: their keys look like `<namespace>/<user_id>/<rest>`."""
        self.conn.execute(f"DELETE FROM kv WHERE instr(key, '/') > 0 AND {where}", args)

    @_guarded
    def delete_user(self, user_id: str) -> int:
        """See `MemoryStore.delete_user`.

        Every row naming the user goes (turns, sessions, memories, turn extras, its version
        row and its `<namespace>/<user_id>/...` kv rows), then the WAL is checkpointed and
        truncated so no copy stays in any file.
        """
        with self._lock:
            with self._tx():
                n = self.conn.execute("DELETE FROM turns WHERE user_id=?", (user_id,)).rowcount
                self.conn.execute("DELETE FROM turn_extra WHERE user_id=?", (user_id,))
                self.conn.execute("DELETE FROM sessions WHERE user_id=?", (user_id,))
                self.conn.execute("DELETE FROM memories WHERE user_id=?", (user_id,))
                self.conn.execute("DELETE FROM user_state WHERE user_id=?", (user_id,))
                self._delete_values(
                    "substr(key, instr(key, '/') + 1, ?) = ?", (len(user_id) + 1, user_id + "/")
                )
            self._scrub()
        return int(n)

    @_guarded
    def delete_session(self, user_id: str, session_id: str) -> int:
        """See `MemoryStore.delete_session`.

        Removes the session's turns and memories, topic memories that merged it in, and its
        `<namespace>/<user_id>/<session_id>` kv rows; the WAL is truncated before returning.
        """
        with self._lock:
            with self._tx():
                if self.session(user_id, session_id) is None:
                    raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
                n = self.conn.execute(
                    "DELETE FROM turns WHERE user_id=? AND session_id=?", (user_id, session_id)
                ).rowcount
                self.conn.execute(
                    "DELETE FROM sessions WHERE user_id=? AND session_id=?", (user_id, session_id)
                )
                self.conn.execute(
                    "DELETE FROM turn_extra WHERE user_id=? AND session_id=?",
                    (user_id, session_id),
                )
                self.conn.execute(
                    f"DELETE FROM memories WHERE user_id=:u AND {_FROM_SESSION}",
                    {"u": user_id, "s": session_id},
                )
                self._delete_values(
                    "substr(key, instr(key, '/') + 1) = ?", (f"{user_id}/{session_id}",)
                )
                self._bump(user_id)
            self._scrub()
        return int(n)

    @_guarded
    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """See `MemoryStore.delete_turns`.

        Unknown turn ids are ignored. The session keeps its other turns (their positions do not
        change) and its row. Memories that hold a deleted turn's text (units, notes, topics
        citing it) are deleted too; if turns remain the session is marked open, so the next
        `end_session` rebuilds its memories from them. The WAL is truncated before returning.
        """
        with self._lock:
            with self._tx():
                if self.session(user_id, session_id) is None:
                    raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
                stored = self.turns(user_id, session_id)
                wanted = None if turn_ids is None else set(turn_ids)
                gone = [t for t in stored if wanted is None or t.turn_id in wanted]
                if not gone:
                    return []
                for i in range(0, len(gone), 500):
                    chunk = [t.turn_id for t in gone[i : i + 500]]
                    marks = ",".join("?" * len(chunk))
                    for table in ("turns", "turn_extra"):
                        self.conn.execute(
                            f"DELETE FROM {table} WHERE user_id=? AND session_id=? "
                            f"AND turn_id IN ({marks})",
                            (user_id, session_id, *chunk),
                        )
                    named = {f"t{j}": tid for j, tid in enumerate(chunk)}
                    self.conn.execute(
                        f"DELETE FROM memories WHERE user_id=:u AND {_FROM_SESSION} AND EXISTS "
                        "(SELECT 1 FROM json_each(memories.turn_ids) WHERE json_each.value IN "
                        f"({','.join(':' + k for k in named)}))",
                        {"u": user_id, "s": session_id, **named},
                    )
                left = len(stored) - len(gone)
                self.conn.execute(
                    "UPDATE sessions SET n_turns=?, "
                    "status = CASE WHEN ? > 0 THEN 'open' ELSE status END, "
                    f"first_ts=({_EDGE_TS} ORDER BY position LIMIT 1), "
                    f"last_ts=({_EDGE_TS} ORDER BY position DESC LIMIT 1) "
                    "WHERE user_id=? AND session_id=?",
                    (left, left, user_id, session_id, user_id, session_id, user_id, session_id),
                )
                self._bump(user_id)
            self._scrub()
        return gone
