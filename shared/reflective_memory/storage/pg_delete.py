"""Deletion methods of `PostgresStore`, with the same semantics as `SQLiteStore`.

Every delete removes the rows in one transaction: turns, sessions, memories derived from them
(topics that merged a session in, memories citing a deleted turn), turn extras, and for a user
its version row, its `<namespace>/<user_id>/...` kv rows and its own blobs (e.g. a per-user
reranker). PostgreSQL keeps dead row versions on disk until VACUUM reclaims them (autovacuum
does so in the background); no query can read them after the commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reflective_memory.errors import UnknownSessionError
from reflective_memory.types import Turn

__all__ = ["PgDeleteMixin"]

# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = %(s)s OR (granularity = 'topic' AND "
    "COALESCE(metadata -> 'rmm' -> 'sessions', '[]'::jsonb) ? %(s)s))"
)


class PgDeleteMixin:
    """Deletion methods of `PostgresStore` (needs its `_conn`, `_s`, `_bump`, `_turn`)."""

    _s: str
    _TURN_COLS: str
    _conn: Any
    _bump: Any
    _turn: Any

    def _lock_session(self, conn: Any, user_id: str, session_id: str) -> None:
        row = conn.execute(
            f"SELECT 1 FROM {self._s}.sessions WHERE user_id=%s AND session_id=%s FOR UPDATE",
            (user_id, session_id),
        ).fetchone()
        if row is None:
            raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")

    def delete_user(self, user_id: str) -> int:
        """See `MemoryStore.delete_user`.

        Every row naming the user goes: turns, sessions, memories, turn extras, its version
        row, its `<namespace>/<user_id>/...` kv rows and its own blobs (reranker state).
        """
        s = self._s
        with self._conn() as conn:
            n = conn.execute(f"DELETE FROM {s}.turns WHERE user_id=%s", (user_id,)).rowcount
            for table in ("turn_extra", "sessions", "memories", "user_state"):
                conn.execute(f"DELETE FROM {s}.{table} WHERE user_id=%s", (user_id,))
            conn.execute(f"DELETE FROM {s}.blobs WHERE owner=%s", (user_id,))
            conn.execute(
                f"DELETE FROM {s}.kv WHERE strpos(key, '/') > 0 AND "
                "starts_with(substr(key, strpos(key, '/') + 1), %s)",
                (user_id + "/",),
            )
        return int(n)

    def delete_session(self, user_id: str, session_id: str) -> int:
        """See `MemoryStore.delete_session`.

        Removes the session's turns and memories, topic memories that merged it in, and its
        `<namespace>/<user_id>/<session_id>` kv rows.
        """
        s = self._s
        with self._conn() as conn:
            self._lock_session(conn, user_id, session_id)
            conn.execute(
                f"DELETE FROM {s}.sessions WHERE user_id=%s AND session_id=%s",
                (user_id, session_id),
            )
            n = conn.execute(
                f"DELETE FROM {s}.turns WHERE user_id=%s AND session_id=%s", (user_id, session_id)
            ).rowcount
            conn.execute(
                f"DELETE FROM {s}.turn_extra WHERE user_id=%s AND session_id=%s",
                (user_id, session_id),
            )
            conn.execute(
                f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND {_FROM_SESSION}",
                {"u": user_id, "s": session_id},
            )
            conn.execute(
                f"DELETE FROM {s}.kv WHERE strpos(key, '/') > 0 AND "
                "substr(key, strpos(key, '/') + 1) = %s",
                (f"{user_id}/{session_id}",),
            )
            self._bump(conn, user_id)
        return int(n)

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """See `SQLiteStore.delete_turns` (same semantics).

        Memories holding a deleted turn's text (units, notes, topics citing it) go too; if
        turns remain the session is reopened so the next `end_session` rebuilds it.
        """
        s = self._s
        with self._conn() as conn:
            self._lock_session(conn, user_id, session_id)
            sql = (
                f"DELETE FROM {s}.turns WHERE user_id=%s AND session_id=%s"
                + ("" if turn_ids is None else " AND turn_id = ANY(%s)")
                + f" RETURNING {self._TURN_COLS}"
            )
            args: tuple[Any, ...] = (user_id, session_id)
            if turn_ids is not None:
                args += (list(turn_ids),)
            gone = sorted(
                (self._turn(r) for r in conn.execute(sql, args)), key=lambda t: t.position
            )
            if not gone:
                return []
            ids = [t.turn_id for t in gone]
            conn.execute(
                f"DELETE FROM {s}.turn_extra WHERE user_id=%s AND session_id=%s "
                "AND turn_id = ANY(%s)",
                (user_id, session_id, ids),
            )
            conn.execute(
                f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND {_FROM_SESSION} AND "
                "EXISTS (SELECT 1 FROM jsonb_array_elements_text(turn_ids) AS t(v) "
                "WHERE t.v = ANY(%(ids)s))",
                {"u": user_id, "s": session_id, "ids": ids},
            )
            edge = f"SELECT ts FROM {s}.turns WHERE user_id=%s AND session_id=%s AND ts IS NOT NULL"
            conn.execute(
                f"UPDATE {s}.sessions SET n_turns = (SELECT COUNT(*) FROM {s}.turns WHERE"
                " user_id=%s AND session_id=%s),"
                f" status = CASE WHEN EXISTS (SELECT 1 FROM {s}.turns WHERE user_id=%s AND"
                " session_id=%s) THEN 'open' ELSE status END,"
                f" first_ts = ({edge} ORDER BY position LIMIT 1),"
                f" last_ts = ({edge} ORDER BY position DESC LIMIT 1)"
                " WHERE user_id=%s AND session_id=%s",
                (user_id, session_id) * 5,
            )
            self._bump(conn, user_id)
        return gone
