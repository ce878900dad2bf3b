"""The embedded store: SQLite (WAL) is the source of truth for turns, sessions and memories.

`SQLiteStore` implements `reflective_memory.storage.base.MemoryStore`. Vector and
lexical indexes are derived caches (see `reflective_memory.storage.index`) rebuilt from what is
stored here. Deleting a user, a session or some turns removes the rows in one transaction (turns,
sessions, memories derived from them: topics that merged a session in, memories citing a deleted
turn; turn extras; for a user its version row and its `<namespace>/<user_id>/...` kv rows), then
checkpoints and truncates the WAL, so no copy stays on disk when the call returns.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import (
    InvalidInputError,
    SessionChangedError,
    StoreClosedError,
    StoreCorruptedError,
    UnknownSessionError,
)
from reflective_memory.storage.base import MemoryDraft, SessionInfo, text_time, time_text
from reflective_memory.storage.checksum import (
    check_memory,
    check_turn,
    checked_keys,
    text_crc,
)
from reflective_memory.storage.sqlite_guard import guarded as _guarded
from reflective_memory.storage.sqlite_schema import SCHEMA as _SCHEMA
from reflective_memory.storage.sqlite_schema import add_checksums, key_memories_by_user
from reflective_memory.types import Memory, Turn

__all__ = ["SQLiteStore"]

logger = logging.getLogger(__name__)

# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = :s OR (granularity = 'topic' AND EXISTS (SELECT 1 FROM "
    "json_each(memories.metadata, '$.rmm.sessions') WHERE json_each.value = :s)))"
)

_EDGE_TS = "SELECT ts FROM turns WHERE user_id=? AND session_id=? AND ts IS NOT NULL"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def marker_path(path: Path) -> Path:
    """The file that records that a database was created at `path` (see `SQLiteStore`)."""
    return path.with_name(path.name + ".created")


class SQLiteStore:
    """`MemoryStore` on one SQLite database in WAL mode.

    Turns are committed with `synchronous=FULL` before `add_turns` returns, so an acknowledged
    turn survives a crash of the process (and of the machine). One connection is shared by all
    threads behind a lock.

    Deletions are real: `secure_delete` zeroes freed pages and every delete ends with a WAL
    checkpoint that truncates the WAL, so deleted text is in no file when the call returns.

    A damaged database raises `StoreCorruptedError`, at open or at any later call. A database
    file that was created once (its `<name>.created` marker exists) but is now missing or empty
    raises it too instead of opening as an empty store.

    Args:
        path: Database file, or `None` for an in-memory database.
        must_exist: The caller knows a database was stored here (e.g. derived index files
            exist): a missing or empty file is `StoreCorruptedError`.
    """

    def __init__(self, path: str | Path | None = None, *, must_exist: bool = False) -> None:
        self.path = None if path is None else Path(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        if self.path is not None:
            had = marker_path(self.path).exists() or must_exist
            empty = not self.path.exists() or self.path.stat().st_size == 0
            if had and empty:
                raise StoreCorruptedError(
                    f"the memory database {str(self.path)!r} is missing or empty although this "
                    "directory held a store; restore it from a backup or move the directory away"
                )
        self._open()
        if self.path is not None:
            marker = marker_path(self.path)
            if not marker.exists():
                marker.write_text("reflective-memory store\n")

    @_guarded
    def _open(self) -> None:
        target = ":memory:" if self.path is None else str(self.path)
        conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=30.0)
        try:
            if self.path is not None:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA secure_delete=ON")
            conn.executescript(_SCHEMA)
            add_checksums(conn)
            key_memories_by_user(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    # -- plumbing -------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection; raises `StoreClosedError` after `close()`."""
        if self._conn is None:
            raise StoreClosedError("the memory store is closed")
        return self._conn

    def _tx(self) -> _Tx:
        return _Tx(self)

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._conn is not None:
                try:
                    if self.path is not None:
                        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # closing must not fail on a damaged file
                    logger.warning("checkpoint at close failed: %s", exc)
                finally:
                    self._conn.close()
                    self._conn = None

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._conn is None

    def _bump(self, user_id: str) -> None:
        # Versions come from one store-wide clock, so a user id deleted and used again never
        # sees a version it had before (a stale index cache can never match).
        self.conn.execute("UPDATE store_clock SET value = value + 1 WHERE id = 0")
        self.conn.execute(
            "INSERT INTO user_state (user_id, version) "
            "VALUES (?, (SELECT value FROM store_clock WHERE id = 0)) "
            "ON CONFLICT(user_id) DO UPDATE SET version = excluded.version",
            (user_id,),
        )

    def _scrub(self) -> None:
        """Move every committed page into the database file and truncate the WAL to 0 bytes."""
        if self.path is None:
            return
        for attempt in range(25):
            busy, _, _ = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            time.sleep(0.02 * (attempt + 1))  # another connection is reading: let it finish
        logger.warning("WAL checkpoint stayed busy; deleted data may remain in the WAL")

    # -- turns and sessions ---------------------------------------------------------------
    @_guarded
    def add_turns(self, turns: Sequence[dict[str, Any]]) -> list[Turn]:
        """Commit turns (dicts with user_id, session_id, role, text, timestamp, turn_id).

        All turns are committed in one transaction; a duplicate `turn_id` within a session
        raises `InvalidInputError` and commits none of them.
        """
        out: list[Turn] = []
        with self._lock, self._tx():
            conn = self.conn
            for t in turns:
                user_id, session_id = t["user_id"], t["session_id"]
                row = conn.execute(
                    "SELECT n_turns, status FROM sessions WHERE user_id=? AND session_id=?",
                    (user_id, session_id),
                ).fetchone()
                # Next position is one past the largest stored one (positions are not reused
                # after a turn is deleted, so default turn ids never collide).
                top = conn.execute(
                    "SELECT MAX(position) FROM turns WHERE user_id=? AND session_id=?",
                    (user_id, session_id),
                ).fetchone()[0]
                position = 0 if top is None else int(top) + 1
                turn_id = t.get("turn_id")
                if turn_id is None:
                    turn_id = f"{session_id}:{position}"
                ts = text_time(t.get("timestamp"))
                try:
                    cur = conn.execute(
                        "INSERT INTO turns (user_id, session_id, turn_id, position, role, text,"
                        " ts, text_crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            user_id,
                            session_id,
                            turn_id,
                            position,
                            t["role"],
                            t["text"],
                            time_text(ts),
                            text_crc(t["text"]),
                        ),  # fmt: skip
                    )
                except sqlite3.IntegrityError as exc:
                    raise InvalidInputError(
                        f"turn_id {turn_id!r} already exists in session {session_id!r} "
                        f"of user {user_id!r}"
                    ) from exc
                now = time_text(_now())
                if row is None:
                    conn.execute(
                        "INSERT INTO sessions (user_id, session_id, status, n_turns, first_ts,"
                        " last_ts, created_at) VALUES (?, ?, 'open', 1, ?, ?, ?)",
                        (user_id, session_id, time_text(ts), time_text(ts), now),
                    )
                else:
                    conn.execute(
                        "UPDATE sessions SET n_turns = n_turns + 1, status = 'open', "
                        "first_ts = COALESCE(first_ts, ?), last_ts = COALESCE(?, last_ts) "
                        "WHERE user_id=? AND session_id=?",
                        (time_text(ts), time_text(ts), user_id, session_id),
                    )
                out.append(
                    Turn(
                        user_id=user_id,
                        session_id=session_id,
                        role=t["role"],
                        text=t["text"],
                        turn_id=turn_id,
                        position=position,
                        timestamp=ts,
                        seq=int(cur.lastrowid or 0),
                    )
                )
        return out

    @staticmethod
    def _turn(row: Sequence[Any]) -> Turn:
        seq, user_id, session_id, turn_id, position, role, text, ts, crc = row
        check_turn(text, crc, user_id, session_id, turn_id)
        return Turn(user_id, session_id, role, text, turn_id, position, text_time(ts), seq)

    @_guarded
    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """See `MemoryStore.turns`."""
        cols = "seq, user_id, session_id, turn_id, position, role, text, ts, text_crc"
        with self._lock:
            if session_id is None:
                rows = self.conn.execute(
                    f"SELECT {cols} FROM turns WHERE user_id=? ORDER BY seq", (user_id,)
                ).fetchall()
            else:
                rows = self.conn.execute(
                    f"SELECT {cols} FROM turns WHERE user_id=? AND session_id=? ORDER BY position",
                    (user_id, session_id),
                ).fetchall()
        return [self._turn(r) for r in rows]

    @_guarded
    def sessions_missing_turn_units(self, user_id: str | None = None) -> list[tuple[str, str]]:
        """See `TurnUnitAudit.sessions_missing_turn_units`."""
        mine = "" if user_id is None else " AND s.user_id = ?"
        with self._lock:
            rows = self.conn.execute(
                "SELECT s.user_id, s.session_id FROM sessions s WHERE s.status = 'open'"
                f"{mine} AND s.n_turns > (SELECT COUNT(*) FROM memories m WHERE m.user_id ="
                " s.user_id AND m.session_id = s.session_id AND m.granularity = 'turn')"
                " ORDER BY 1, 2",
                () if user_id is None else (user_id,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    @staticmethod
    def _session(row: Sequence[Any]) -> SessionInfo:
        u, s, status, n, first, last, created, ended = row
        times = (text_time(first), text_time(last), text_time(created), text_time(ended))
        return SessionInfo(u, s, status, n, *times)  # type: ignore[arg-type]

    @_guarded
    def session(self, user_id: str, session_id: str) -> SessionInfo | None:
        """See `MemoryStore.session`."""
        with self._lock:
            row = self.conn.execute(
                "SELECT user_id, session_id, status, n_turns, first_ts, last_ts, created_at,"
                " ended_at FROM sessions WHERE user_id=? AND session_id=?",
                (user_id, session_id),
            ).fetchone()
        return None if row is None else self._session(row)

    @_guarded
    def sessions(self, user_id: str, status: str | None = None) -> list[SessionInfo]:
        """See `MemoryStore.sessions`."""
        sql = (
            "SELECT user_id, session_id, status, n_turns, first_ts, last_ts, created_at, ended_at"
            " FROM sessions WHERE user_id=?"
        )
        args: tuple[Any, ...] = (user_id,)
        if status is not None:
            sql += " AND status=?"
            args += (status,)
        with self._lock:
            rows = self.conn.execute(sql + " ORDER BY created_at, session_id", args).fetchall()
        return [self._session(r) for r in rows]

    # -- memories -------------------------------------------------------------------------
    def _insert_memories(
        self, user_id: str, drafts: Sequence[MemoryDraft], embeddings: np.ndarray, model: str
    ) -> list[Memory]:
        if len(drafts) != len(embeddings):
            raise InvalidInputError("one embedding per memory is required")
        now = _now()
        out: list[Memory] = []
        for d, vec in zip(drafts, embeddings, strict=True):
            mid = d.id if d.id is not None else f"{d.granularity}-{uuid.uuid4().hex[:16]}"
            meta = d.metadata if d.metadata is not None else {}
            old = self.conn.execute(  # an id is the user's own: another's may be the same
                "SELECT created_at FROM memories WHERE user_id=? AND id=?", (user_id, mid)
            ).fetchone()
            created = now if old is None else text_time(old[0])
            self.conn.execute(
                "INSERT OR REPLACE INTO memories (id, user_id, session_id, granularity, text, key,"
                " turn_ids, start_ts, end_ts, created_at, updated_at, metadata, embedding,"
                " embed_model, text_crc, key_crc)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    mid,
                    user_id,
                    d.session_id,
                    d.granularity,
                    d.text,
                    d.key,
                    json.dumps(list(d.turn_ids)),
                    time_text(d.start_time),
                    time_text(d.end_time),
                    time_text(created),
                    time_text(now),
                    json.dumps(meta, default=str),
                    np.asarray(vec, dtype=np.float32).tobytes(),
                    model,
                    text_crc(d.text),
                    text_crc(d.key),
                ),
            )
            out.append(
                Memory(
                    mid,
                    user_id,
                    d.session_id,
                    d.granularity,
                    d.text,
                    d.key,
                    tuple(d.turn_ids),
                    created,
                    now,
                    text_time(d.start_time),
                    text_time(d.end_time),
                    dict(meta),  # type: ignore[arg-type]
                )
            )
        self._bump(user_id)
        return out

    @_guarded
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
        """See `MemoryStore.replace_session_memories`."""
        with self._lock, self._tx():
            if self.session(user_id, session_id) is None:
                raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
            if fence is not None:
                n, top = self.conn.execute(
                    "SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM turns "
                    "WHERE user_id=? AND session_id=?",
                    (user_id, session_id),
                ).fetchone()
                if (int(n), int(top)) != tuple(fence):
                    raise SessionChangedError(
                        f"session {session_id!r} of user {user_id!r} changed during the build"
                    )
            marks = ",".join("?" * len(granularities))
            self.conn.execute(
                "DELETE FROM memories WHERE user_id=? AND session_id=? "
                f"AND granularity IN ({marks})",
                (user_id, session_id, *granularities),
            )
            out = self._insert_memories(user_id, drafts, embeddings, embed_model)
            self.conn.execute(
                "UPDATE sessions SET status='ended', ended_at=? WHERE user_id=? AND session_id=?",
                (time_text(_now()), user_id, session_id),
            )
            self._bump(user_id)
        return out

    @_guarded
    def upsert_memories(
        self, user_id: str, drafts: Sequence[MemoryDraft], embeddings: np.ndarray, embed_model: str
    ) -> list[Memory]:
        """See `MemoryStore.upsert_memories`."""
        with self._lock, self._tx():
            return self._insert_memories(user_id, drafts, embeddings, embed_model)

    @_guarded
    def delete_memories(self, user_id: str, ids: Iterable[str]) -> int:
        """Delete memories of a user by id; return how many were deleted (WAL scrubbed)."""
        ids = list(ids)
        if not ids:
            return 0
        with self._lock:
            with self._tx():
                marks = ",".join("?" * len(ids))
                n = self.conn.execute(
                    f"DELETE FROM memories WHERE user_id=? AND id IN ({marks})", (user_id, *ids)
                ).rowcount
                self._bump(user_id)
            self._scrub()
        return int(n)

    @_guarded
    def delete_expired(self, user_id: str, now: float) -> int:
        """See `MemoryStore.delete_expired` (the WAL is scrubbed when anything went)."""
        with self._lock:
            with self._tx():
                n = self.conn.execute(
                    "DELETE FROM memories WHERE user_id=? AND json_type(metadata, '$.expires_at')"
                    " IN ('integer', 'real') AND json_extract(metadata, '$.expires_at') <= ?",
                    (user_id, float(now)),
                ).rowcount
                if n:
                    self._bump(user_id)
            if n:
                self._scrub()
        return int(n)

    _MEM_COLS = (
        "id, user_id, session_id, granularity, text, key, turn_ids, created_at, updated_at,"
        " start_ts, end_ts, metadata, text_crc, key_crc"
    )

    @staticmethod
    def _memory(row: Sequence[Any]) -> Memory:
        mid, u, s, g, text, key, tids, created, updated, start, end, meta, tcrc, kcrc = row
        check_memory(text, key, tcrc, kcrc, u, mid)
        return Memory(
            mid,
            u,
            s,
            g,
            text,
            key,
            tuple(json.loads(tids)),
            text_time(created),
            text_time(updated),  # type: ignore[arg-type]
            text_time(start),
            text_time(end),
            json.loads(meta),
        )

    @_guarded
    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """See `MemoryStore.memories`."""
        with self._lock:
            if ids is None:
                rows = self.conn.execute(
                    f"SELECT {self._MEM_COLS} FROM memories WHERE user_id=? ORDER BY rowid",
                    (user_id,),
                ).fetchall()
                return [self._memory(r) for r in rows]
            found: dict[str, Memory] = {}
            ids = list(ids)
            # by primary key (user_id, id): a user index would scan the whole history
            # (155 ms against 0.3 ms at 100K memories)
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for r in self.conn.execute(
                    f"SELECT {self._MEM_COLS} FROM memories WHERE user_id=? AND id IN ({marks})",
                    (user_id, *chunk),
                ):
                    found[r[0]] = self._memory(r)
        return [found[i] for i in ids if i in found]

    @_guarded
    def update_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """See `MemoryStore.update_metadata` (one transaction; the version is not bumped)."""
        ids = list(updates)
        if not ids:
            return 0
        n = 0
        with self._lock, self._tx():
            for mid in ids:
                row = self.conn.execute(
                    "SELECT metadata FROM memories WHERE user_id=? AND id=?", (user_id, mid)
                ).fetchone()
                if row is None:
                    continue
                meta = {**json.loads(row[0]), **updates[mid]}
                self.conn.execute(
                    "UPDATE memories SET metadata=? WHERE user_id=? AND id=?",
                    (json.dumps(meta, default=str), user_id, mid),
                )
                n += 1
        return n

    @_guarded
    def embeddings(
        self, user_id: str
    ) -> tuple[list[str], list[str], list[bytes | None], list[str]]:
        """See `MemoryStore.embeddings`."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT id, key, embedding, COALESCE(embed_model, ''), key_crc FROM memories "
                "WHERE user_id=? ORDER BY rowid",
                (user_id,),
            ).fetchall()
        return (
            [r[0] for r in rows],
            checked_keys(user_id, [(r[0], r[1], r[4]) for r in rows]),
            [r[2] for r in rows],
            [r[3] for r in rows],
        )

    @_guarded
    def memory_keys(
        self, user_id: str, after: int = 0
    ) -> tuple[list[str], list[str], list[int], int]:
        """See `KeyListing.memory_keys`.

        The mark is the rowid: a rewrite (`INSERT OR REPLACE`, `set_keys`, `restore_times`)
        moves it above every other. SQLite hands out the highest rowid plus one, so a deleted
        highest row's rowid can come back; while the row at `after` stands, none at or below
        it can.
        """
        with self._lock:
            rows = self.conn.execute(
                "SELECT id, key, rowid, key_crc FROM memories WHERE user_id=? AND rowid >= ? "
                "ORDER BY rowid",
                (user_id, after),
            ).fetchall()
            (total,) = self.conn.execute(
                "SELECT COUNT(*) FROM memories WHERE user_id=?", (user_id,)
            ).fetchone()
        keys = checked_keys(user_id, [(r[0], r[1], r[3]) for r in rows])
        return [r[0] for r in rows], keys, [r[2] for r in rows], int(total)

    @_guarded
    def row_mark(self, user_id: str, memory_id: str) -> int | None:
        """See `KeyListing.row_mark` (the rowid)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT rowid FROM memories WHERE user_id=? AND id=?", (user_id, memory_id)
            ).fetchone()
        return None if row is None else int(row[0])

    @_guarded
    def vectors(self, user_id: str, ids: Sequence[str], model: str) -> dict[str, np.ndarray]:
        """Stored embeddings of some memories of a user made by `model` (others left out)."""
        out: dict[str, np.ndarray] = {}
        ids = list(ids)
        with self._lock:
            for s in range(0, len(ids), 500):
                chunk = ids[s : s + 500]
                marks = ",".join("?" * len(chunk))
                for mid, blob, m in self.conn.execute(
                    f"SELECT id, embedding, embed_model FROM memories WHERE user_id=? "
                    f"AND id IN ({marks})",  # by primary key (see `memories`)
                    (user_id, *chunk),
                ):
                    if blob is not None and m == model:
                        out[mid] = np.frombuffer(blob, dtype=np.float32)
        return out

    @_guarded
    def set_embeddings(self, user_id: str, ids: Sequence[str], emb: np.ndarray, model: str) -> None:
        """See `MemoryStore.set_embeddings`."""
        with self._lock, self._tx():
            self.conn.executemany(
                "UPDATE memories SET embedding=?, embed_model=? WHERE user_id=? AND id=?",
                [
                    (np.asarray(v, dtype=np.float32).tobytes(), model, user_id, i)
                    for i, v in zip(ids, emb, strict=True)
                ],
            )

    @_guarded
    def set_keys(self, user_id: str, ids: Sequence[str], keys: Sequence[str]) -> None:
        """Replace the indexed key of memories (their embeddings are cleared and recomputed)."""
        with self._lock, self._tx():
            self.conn.executemany(
                "UPDATE memories SET key=?, key_crc=?, embedding=NULL, embed_model=NULL, "
                "rowid=(SELECT MAX(rowid) + 1 FROM memories) WHERE user_id=? AND id=?",
                [(k, text_crc(k), user_id, i) for i, k in zip(ids, keys, strict=True)],
            )
            self._bump(user_id)

    @_guarded
    def version(self, user_id: str) -> int:
        """See `MemoryStore.version`."""
        with self._lock:
            row = self.conn.execute(
                "SELECT version FROM user_state WHERE user_id=?", (user_id,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    @_guarded
    def count(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions and memories by granularity."""
        with self._lock:
            conn = self.conn
            n_turns = conn.execute("SELECT COUNT(*) FROM turns WHERE user_id=?", (user_id,))
            n_turns = int(n_turns.fetchone()[0])
            sess = dict(
                conn.execute(
                    "SELECT status, COUNT(*) FROM sessions WHERE user_id=? GROUP BY status",
                    (user_id,),
                ).fetchall()
            )
            mems = dict(
                conn.execute(
                    "SELECT granularity, COUNT(*) FROM memories WHERE user_id=? "
                    "GROUP BY granularity",
                    (user_id,),
                ).fetchall()
            )
        return {
            "turns": n_turns,
            "sessions": int(sum(sess.values())),
            "open_sessions": int(sess.get("open", 0)),
            "memories": int(sum(mems.values())),
            "memories_by_granularity": {k: int(v) for k, v in mems.items()},
        }

    # -- per-turn extra data (adapters keep framework message fields here) ----------------
    @_guarded
    def set_turn_extra(
        self, user_id: str, session_id: str, extras: dict[str, dict[str, Any]]
    ) -> None:
        """Attach JSON data to stored turns (by turn id); deleted together with the turns."""
        if not extras:
            return
        with self._lock, self._tx():
            self.conn.executemany(
                "INSERT OR REPLACE INTO turn_extra (user_id, session_id, turn_id, data) "
                "VALUES (?, ?, ?, ?)",
                [
                    (user_id, session_id, tid, json.dumps(data, default=str))
                    for tid, data in extras.items()
                ],
            )

    @_guarded
    def turn_extra(self, user_id: str, session_id: str) -> dict[str, dict[str, Any]]:
        """The extra data of a session's turns, by turn id."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT turn_id, data FROM turn_extra WHERE user_id=? AND session_id=?",
                (user_id, session_id),
            ).fetchall()
        return {r[0]: json.loads(r[1]) for r in rows}

    @_guarded
    def restore_times(
        self,
        user_id: str,
        sessions: Mapping[str, tuple[datetime, datetime | None]],
        memories: Mapping[str, tuple[datetime, datetime]],
    ) -> None:
        """See `reflective_memory.storage.base.RestoresTimes`."""
        with self._lock, self._tx():
            self.conn.executemany(
                "UPDATE sessions SET created_at=?, ended_at=? WHERE user_id=? AND session_id=?",
                [(time_text(c), time_text(e), user_id, s) for s, (c, e) in sessions.items()],
            )
            self.conn.executemany(
                "UPDATE memories SET created_at=?, updated_at=?, "
                "rowid=(SELECT MAX(rowid) + 1 FROM memories) WHERE user_id=? AND id=?",
                [(time_text(c), time_text(u), user_id, m) for m, (c, u) in memories.items()],
            )
            if memories:
                self._bump(user_id)

    @_guarded
    def users(self) -> list[str]:
        """See `MemoryStore.users`."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT user_id FROM sessions UNION SELECT user_id FROM memories ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    # -- small key/value area for components (reranker config, rubric, ...) ----------------
    @_guarded
    def get_value(self, key: str) -> Any | None:
        """Read a JSON value stored by `set_value`, or None."""
        with self._lock:
            row = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    @_guarded
    def set_value(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value durably."""
        with self._lock, self._tx():
            self.conn.execute(
                "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, json.dumps(value))
            )

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


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT/ROLLBACK; nests (inner blocks join the outer transaction)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.outer = False

    def __enter__(self) -> None:
        conn = self.store.conn
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
            self.outer = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.outer:
            return
        conn = self.store.conn
        if exc_type is None:
            conn.execute("COMMIT")
        else:
            conn.execute("ROLLBACK")
