"""The embedded store: SQLite (WAL) is the source of truth for turns, sessions and memories.

`SQLiteStore` is the `reflective_memory.storage.core.StoreCore` on one SQLite database: this
module holds its SQL, its connection and transactions, and what only it offers (`KeyListing`,
in-process vectors). Vector and lexical indexes are derived caches (see
`reflective_memory.storage.index`) rebuilt from what is stored here. Deleting a user, a session
or some turns removes the rows in one transaction (turns, sessions, memories derived from them:
topics that merged a session in, memories citing a deleted turn; turn extras; for a user its
version row and its `<namespace>/<user_id>/...` kv rows), then checkpoints and truncates the
WAL, so no copy stays on disk when the call returns.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from reflective_memory.errors import StoreClosedError, StoreCorruptedError
from reflective_memory.storage.base import text_time, time_text
from reflective_memory.storage.checksum import checked_keys, text_crc
from reflective_memory.storage.core import COLUMNS, MemoryRow, Statements, StoreCore
from reflective_memory.storage.sqlite_guard import guarded as _guarded
from reflective_memory.storage.sqlite_schema import SCHEMA as _SCHEMA
from reflective_memory.storage.sqlite_schema import add_checksums, key_memories_by_user
from reflective_memory.types import Turn

__all__ = ["SQLiteStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = :s OR (granularity = 'topic' AND EXISTS (SELECT 1 FROM "
    "json_each(memories.metadata, '$.rmm.sessions') WHERE json_each.value = :s)))"
)
_OF_SESSION = "user_id=:u AND session_id=:s"
_EDGE_TS = f"SELECT ts FROM turns WHERE {_OF_SESSION} AND ts IS NOT NULL ORDER BY position"
_MISSING_UNITS = (
    "SELECT s.user_id, s.session_id FROM sessions s WHERE s.status = 'open'{mine} AND"
    " s.n_turns > (SELECT COUNT(*) FROM memories m WHERE m.user_id = s.user_id AND"
    " m.session_id = s.session_id AND m.granularity = 'turn') ORDER BY 1, 2"
)
_NEXT_ROWID = "rowid=(SELECT MAX(rowid) + 1 FROM memories)"
_OF_USER_VALUES = "DELETE FROM kv WHERE instr(key, '/') > 0 AND substr(key, instr(key, '/') + 1"

#: SQLite's statements for `StoreCore` (`:name` parameters).
SQL = Statements(
    open_session=(
        "INSERT INTO sessions (user_id, session_id, status, n_turns, first_ts, last_ts,"
        " created_at) VALUES (:u, :s, 'open', 1, :ts, :ts, :now) ON CONFLICT(user_id,"
        " session_id) DO UPDATE SET n_turns = n_turns + 1, status = 'open',"
        " first_ts = COALESCE(first_ts, excluded.first_ts),"
        " last_ts = COALESCE(excluded.last_ts, last_ts)"
    ),
    turns_of_user=f"SELECT {COLUMNS.turn} FROM turns WHERE user_id=:u ORDER BY seq",
    turns_of_session=f"SELECT {COLUMNS.turn} FROM turns WHERE {_OF_SESSION} ORDER BY position",
    session=f"SELECT {COLUMNS.session} FROM sessions WHERE {_OF_SESSION}",
    sessions=f"SELECT {COLUMNS.session} FROM sessions WHERE user_id=:u"
    " ORDER BY created_at, session_id",
    sessions_with_status=f"SELECT {COLUMNS.session} FROM sessions WHERE user_id=:u AND"
    " status=:status ORDER BY created_at, session_id",
    missing_units=_MISSING_UNITS.format(mine=""),
    missing_units_of_user=_MISSING_UNITS.format(mine=" AND s.user_id = :u"),
    lock_session=f"SELECT 1 FROM sessions WHERE {_OF_SESSION}",
    fence=f"SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM turns WHERE {_OF_SESSION}",
    delete_kinds=f"DELETE FROM memories WHERE {_OF_SESSION} AND granularity {{in_ids}}",
    end_session=f"UPDATE sessions SET status='ended', ended_at=:now WHERE {_OF_SESSION}",
    memories_of_user=f"SELECT {COLUMNS.memory} FROM memories WHERE user_id=:u ORDER BY rowid",
    # by primary key (user_id, id): a user index would scan the whole history
    # (155 ms against 0.3 ms at 100K memories)
    memories_by_id=f"SELECT {COLUMNS.memory} FROM memories WHERE user_id=:u AND id {{in_ids}}",
    delete_memories="DELETE FROM memories WHERE user_id=:u AND id {in_ids}",
    delete_expired=(
        "DELETE FROM memories WHERE user_id=:u AND json_type(metadata, '$.expires_at')"
        " IN ('integer', 'real') AND json_extract(metadata, '$.expires_at') <= :now_s"
    ),
    embeddings="SELECT id, key, embedding, COALESCE(embed_model, ''), key_crc FROM memories"
    " WHERE user_id=:u ORDER BY rowid",
    set_keys="UPDATE memories SET key=:key, key_crc=:crc, embedding=NULL, embed_model=NULL,"
    f" {_NEXT_ROWID} WHERE user_id=:u AND id=:id",
    version="SELECT version FROM user_state WHERE user_id=:u",
    count_turns="SELECT COUNT(*) FROM turns WHERE user_id=:u",
    count_sessions="SELECT status, COUNT(*) FROM sessions WHERE user_id=:u GROUP BY status",
    count_memories="SELECT granularity, COUNT(*) FROM memories WHERE user_id=:u"
    " GROUP BY granularity",
    users="SELECT user_id FROM sessions UNION SELECT user_id FROM memories ORDER BY 1",
    set_turn_extra="INSERT OR REPLACE INTO turn_extra (user_id, session_id, turn_id, data)"
    " VALUES (:u, :s, :t, :data)",
    turn_extra=f"SELECT turn_id, data FROM turn_extra WHERE {_OF_SESSION}",
    restore_session_times=f"UPDATE sessions SET created_at=:created, ended_at=:ended WHERE"
    f" {_OF_SESSION}",
    restore_memory_times="UPDATE memories SET created_at=:created, updated_at=:updated,"
    f" {_NEXT_ROWID} WHERE user_id=:u AND id=:id",
    get_value="SELECT value FROM kv WHERE key=:k",
    set_value="INSERT OR REPLACE INTO kv (key, value) VALUES (:k, :v)",
    delete_user_values=f"{_OF_USER_VALUES}, :n) = :p",
    delete_session_memories=f"DELETE FROM memories WHERE user_id=:u AND {_FROM_SESSION}",
    delete_session_values=f"{_OF_USER_VALUES}) = :p",
    delete_turn_extra=f"DELETE FROM turn_extra WHERE {_OF_SESSION} AND turn_id {{in_ids}}",
    delete_turn_memories=f"DELETE FROM memories WHERE user_id=:u AND {_FROM_SESSION} AND"
    " EXISTS (SELECT 1 FROM json_each(memories.turn_ids) WHERE json_each.value {in_ids})",
    recount_session=(
        f"UPDATE sessions SET n_turns = (SELECT COUNT(*) FROM turns WHERE {_OF_SESSION}),"
        f" status = CASE WHEN EXISTS (SELECT 1 FROM turns WHERE {_OF_SESSION}) THEN 'open'"
        f" ELSE status END, first_ts = ({_EDGE_TS} LIMIT 1),"
        f" last_ts = ({_EDGE_TS} DESC LIMIT 1) WHERE {_OF_SESSION}"
    ),
)

#: Ids per statement (SQLite allows 999 parameters in older builds).
_CHUNK = 500


def _now() -> datetime:
    return datetime.now(timezone.utc)


def marker_path(path: Path) -> Path:
    """The file that records that a database was created at `path` (see `SQLiteStore`)."""
    return path.with_name(path.name + ".created")


class SQLiteStore(StoreCore):
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

    sql = SQL

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

    # -- the core's hooks -----------------------------------------------------------------
    @_guarded
    def _read(self, user_id: str | None, fn: Callable[[Any], T]) -> T:
        with self._lock:
            return fn(self.conn)

    @_guarded
    def _write(self, user_ids: Collection[str] | None, fn: Callable[[Any], T]) -> T:
        with self._lock, self._tx():
            return fn(self.conn)

    @_guarded
    def _erased(self) -> None:
        with self._lock:
            self._scrub()

    def _clock(self) -> datetime:
        return _now()

    def _bump_version(self, conn: Any, user_id: str) -> None:
        # Versions come from one store-wide clock, so a user id deleted and used again never
        # sees a version it had before (a stale index cache can never match).
        conn.execute("UPDATE store_clock SET value = value + 1 WHERE id = 0")
        conn.execute(
            "INSERT INTO user_state (user_id, version) "
            "VALUES (:u, (SELECT value FROM store_clock WHERE id = 0)) "
            "ON CONFLICT(user_id) DO UPDATE SET version = excluded.version",
            {"u": user_id},
        )

    def _bump(self, user_id: str) -> None:
        """Give the user a new version (inside the caller's `_tx()`)."""
        self._bump_version(self.conn, user_id)

    def _in(self, ids: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            names = {f"i{j}": v for j, v in enumerate(chunk)}
            out.append(("IN (" + ", ".join(":" + k for k in names) + ")", names))
        return out

    def _many(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> None:
        conn.executemany(sql, rows)

    def _json(self, value: Any) -> Any:
        return json.loads(value)

    def _insert_turn(self, conn: Any, p: dict[str, Any]) -> tuple[int, int, str] | None:
        # Next position is one past the largest stored one (positions are not reused after a
        # turn is deleted, so default turn ids never collide).
        (top,) = conn.execute(f"SELECT MAX(position) FROM turns WHERE {_OF_SESSION}", p).fetchone()
        position = 0 if top is None else int(top) + 1
        turn_id = p["tid"] if p["tid"] is not None else f"{p['s']}:{position}"
        try:
            cur = conn.execute(
                "INSERT INTO turns (user_id, session_id, turn_id, position, role, text, ts,"
                " text_crc) VALUES (:u, :s, :turn_id, :position, :role, :text, :ts, :crc)",
                {**p, "turn_id": turn_id, "position": position},
            )
        except sqlite3.IntegrityError:
            return None
        return int(cur.lastrowid or 0), position, turn_id

    def _upsert_memory(self, conn: Any, row: MemoryRow) -> tuple[datetime, datetime]:
        user_id, memory_id, draft, metadata, vector, model = row
        now = _now()
        old = conn.execute(  # an id is the user's own: another's may be the same
            "SELECT created_at FROM memories WHERE user_id=? AND id=?", (user_id, memory_id)
        ).fetchone()
        created = now if old is None else text_time(old[0])
        conn.execute(
            "INSERT OR REPLACE INTO memories (id, user_id, session_id, granularity, text, key,"
            " turn_ids, start_ts, end_ts, created_at, updated_at, metadata, embedding,"
            " embed_model, text_crc, key_crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            " ?, ?)",
            (memory_id, user_id, draft.session_id, draft.granularity, draft.text, draft.key,
             json.dumps(list(draft.turn_ids)), time_text(draft.start_time),
             time_text(draft.end_time), time_text(created), time_text(now),
             json.dumps(metadata, default=str), np.asarray(vector, np.float32).tobytes(), model,
             text_crc(draft.text), text_crc(draft.key)),
        )  # fmt: skip
        return created, now  # type: ignore[return-value]

    def _merge_metadata(
        self, conn: Any, user_id: str, memory_id: str, fields: Mapping[str, Any]
    ) -> bool:
        row = conn.execute(
            "SELECT metadata FROM memories WHERE user_id=? AND id=?", (user_id, memory_id)
        ).fetchone()
        if row is None:
            return False
        meta = {**json.loads(row[0]), **fields}
        conn.execute(
            "UPDATE memories SET metadata=? WHERE user_id=? AND id=?",
            (json.dumps(meta, default=str), user_id, memory_id),
        )
        return True

    def _delete_turn_rows(
        self, conn: Any, user_id: str, session_id: str, turn_ids: Sequence[str] | None
    ) -> list[Turn]:
        p = {"u": user_id, "s": session_id}
        stored = [self._turn(r) for r in conn.execute(self.sql.turns_of_session, p)]
        wanted = None if turn_ids is None else set(turn_ids)
        gone = [t for t in stored if wanted is None or t.turn_id in wanted]
        sql = f"DELETE FROM turns WHERE {_OF_SESSION} AND turn_id {{in_ids}}"
        for _ in self._by_ids(conn, sql, [t.turn_id for t in gone], p):
            pass
        return gone

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

    # -- what only the embedded store offers ----------------------------------------------
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

    def vectors(self, user_id: str, ids: Sequence[str], model: str) -> dict[str, np.ndarray]:
        """Stored embeddings of some memories of a user made by `model` (others left out)."""
        sql = "SELECT id, embedding, embed_model FROM memories WHERE user_id=:u AND id {in_ids}"

        def read(conn: Any) -> list[Any]:
            return [r for c in self._by_ids(conn, sql, list(ids), {"u": user_id}) for r in c]

        return {
            mid: np.frombuffer(blob, dtype=np.float32)
            for mid, blob, m in self._read(user_id, read)
            if blob is not None and m == model
        }

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
