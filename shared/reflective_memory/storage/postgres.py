"""The server store: PostgreSQL + pgvector holds everything, for many processes and hosts.

`PostgresStore` implements `reflective_memory.storage.base.MemoryStore` over a psycopg 3
connection pool, with four optional capabilities of the store contract:

- `ServerSearch`: searches run on the server (`server_index`; the collaborator `search`, a
  `reflective_memory.storage.pg_search.PgSearch`, owns embeddings and search);
- `StateHolder`: learned state (reranker weights) shared by all processes, in `state`, a
  `reflective_memory.storage.pg_state.DatabaseStateStore`;
- `NativeAsync`: the engine's `a*` methods await its queries on the event loop through
  psycopg's async pool (`async_io`, a `reflective_memory.storage.pg_async.AsyncPgRoute`);
- `SessionBuildLock`: building a session's memories is serialised across processes with an
  advisory lock (`session_build`).

Connections come from a `reflective_memory.storage.pg_database.PgDatabase` shared by the three;
the schema lives in `reflective_memory.storage.pg_schema`. Deletions remove every row naming the
user or session in one transaction; PostgreSQL keeps dead row versions on disk until VACUUM
reclaims them (autovacuum does so in the background), and no query can read them after the
commit.

Needs the `postgres` extra: `pip install 'reflective-memory[postgres]'`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory.errors import InvalidInputError, SessionChangedError, UnknownSessionError
from reflective_memory.storage.base import (
    MemoryDraft,
    MemoryVectors,
    SessionInfo,
    text_time,
    time_text,
)
from reflective_memory.storage.bridge import TaskLock
from reflective_memory.storage.checksum import (
    check_memory,
    check_turn,
    checked_keys,
    text_crc,
)
from reflective_memory.storage.pg_async import AsyncPgRoute
from reflective_memory.storage.pg_database import PgDatabase, is_postgres_dsn
from reflective_memory.storage.pg_schema import migrate
from reflective_memory.storage.pg_search import PgSearch, to_vector
from reflective_memory.storage.pg_state import DatabaseStateStore, delete_owner_rows
from reflective_memory.storage.server_index import build_server_index
from reflective_memory.text import lexical_tokens
from reflective_memory.types import Memory, Turn

if TYPE_CHECKING:
    from reflective_memory.storage.user_index import UserIndex

__all__ = ["PostgresStore", "is_postgres_dsn"]

logger = logging.getLogger(__name__)

# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = %(s)s OR (granularity = 'topic' AND "
    "COALESCE(metadata -> 'rmm' -> 'sessions', '[]'::jsonb) ? %(s)s))"
)


def _lex(key: str) -> str:
    """The key's lexical tokens (the library tokenizer), as the text the tsvector is built on."""
    return " ".join(lexical_tokens(key))


class PostgresStore:
    """`MemoryStore` on PostgreSQL with pgvector.

    Every acknowledged write is committed (PostgreSQL's default `synchronous_commit=on` makes it
    durable). No state that can go stale is kept in the process: callers cache derived indexes by
    `version(user_id)`, which every memory change bumps in the same transaction.

    Args:
        dsn_or_pool: A connection URI (`postgresql://user@host:5432/db`) or an open
            `psycopg_pool.ConnectionPool` you own (it is not closed by `close()`).
        schema: Schema holding the tables (created when `create` is True).
        create: Create or migrate the schema on first connect (`reflective-memory db init`
            does the same ahead of time).
        pool_min: Connections kept open (URI only).
        pool_max: Most connections (URI only); ending sessions concurrently holds one extra
            connection per build for its lock.
        timeout: Seconds to wait for a pooled connection before raising.
        hnsw_threshold: Users with more stored memories than this are searched through the
            HNSW index with iterative scans; smaller ones exactly (`None`: always exact).
        ef_search: HNSW search breadth (raised to the number of results asked for, at most
            1000).
        max_scan_tuples: Upper bound of rows an iterative HNSW scan visits.

    Attributes:
        db: The connections and schema (`PgDatabase`).
        search: Embeddings and server-side search (`PgSearch`).
        state: Learned state shared by every process (`DatabaseStateStore`).

    Raises:
        ConfigError: A setting is out of range.
        InvalidInputError: `dsn_or_pool` is neither a PostgreSQL URI nor a pool.
        StoreUnavailableError: The server cannot be reached.
    """

    def __init__(
        self,
        dsn_or_pool: Any,
        *,
        schema: str = "reflective_memory",
        create: bool = True,
        pool_min: int = 1,
        pool_max: int = 10,
        timeout: float = 30.0,
        hnsw_threshold: int | None = 50_000,
        ef_search: int = 64,
        max_scan_tuples: int = 50_000,
    ) -> None:
        self.db = PgDatabase(
            dsn_or_pool, schema=schema, pool_min=pool_min, pool_max=pool_max, timeout=timeout
        )
        self.schema = self.db.schema
        self._s = self.db.qualified
        # A build holds its lock's connection and takes another: at most half the pool builds at
        # once, so concurrent builds (threads or coroutines) cannot take every connection.
        self._builds = TaskLock(slots=max(1, pool_max // 2))
        try:
            self.search = PgSearch(
                self.db,
                hnsw_threshold=hnsw_threshold,
                ef_search=ef_search,
                max_scan_tuples=max_scan_tuples,
            )
            self.state = DatabaseStateStore(self.db)
            self.db.open()
            if create:
                with self.db.connection() as conn:
                    migrate(conn, self.db.schema)
        except BaseException:
            self.db.close()
            raise

    # -- plumbing -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self.db.closed

    def close(self) -> None:
        """Close the pool if this store opened it (idempotent)."""
        self.db.close()

    def async_io(self) -> AsyncPgRoute | None:
        """See `NativeAsync`: the async pool route (None when given a caller's pool)."""
        return self.db.async_route

    def _bump(self, conn: Any, user_id: str) -> None:
        conn.execute(
            f"INSERT INTO {self._s}.user_state (user_id, version) "
            f"VALUES (%s, nextval('{self._s}.version_seq')) "
            "ON CONFLICT (user_id) DO UPDATE SET version = EXCLUDED.version",
            (user_id,),
        )

    # -- turns and sessions ---------------------------------------------------------------
    def add_turns(self, turns: Sequence[dict[str, Any]]) -> list[Turn]:
        """Commit turns (dicts with user_id, session_id, role, text, timestamp, turn_id).

        One transaction for all; a duplicate `turn_id` within a session raises
        `InvalidInputError` and commits none of them. Positions are allocated under the
        session row's lock, so concurrent writers to one session never collide.
        """
        s = self._s
        for t in turns:
            for field in ("user_id", "session_id", "turn_id", "role", "text"):
                if "\x00" in (t.get(field) or ""):
                    raise InvalidInputError(f"{field} contains a NUL character (0x00)")
        out: list[Turn] = []
        with self.db.transaction() as conn:
            for t in turns:
                user_id, session_id = t["user_id"], t["session_id"]
                ts = text_time(t.get("timestamp"))
                conn.execute(
                    f"INSERT INTO {s}.sessions (user_id, session_id, status, n_turns, first_ts,"
                    " last_ts, created_at) VALUES (%s, %s, 'open', 1, %s, %s, now()) "
                    "ON CONFLICT (user_id, session_id) DO UPDATE SET"
                    " n_turns = sessions.n_turns + 1, status = 'open',"
                    " first_ts = COALESCE(sessions.first_ts, EXCLUDED.first_ts),"
                    " last_ts = COALESCE(EXCLUDED.last_ts, sessions.last_ts)",
                    (user_id, session_id, time_text(ts), time_text(ts)),
                )
                # A new statement, so its snapshot sees every turn committed before the
                # session row's lock (taken just above) was granted.
                turn_id = t.get("turn_id")
                row = conn.execute(
                    f"INSERT INTO {s}.turns (user_id, session_id, position, turn_id, role, text,"
                    " ts, text_crc) SELECT %s, %s, p, COALESCE(%s, %s || ':' || p), %s, %s, %s, %s"
                    f" FROM (SELECT COALESCE(MAX(position) + 1, 0) AS p FROM {s}.turns"
                    "  WHERE user_id=%s AND session_id=%s) AS next"
                    " ON CONFLICT DO NOTHING RETURNING seq, position, turn_id",
                    (user_id, session_id, turn_id, session_id, t["role"], t["text"], time_text(ts),
                     text_crc(t["text"]), user_id, session_id),
                ).fetchone()  # fmt: skip
                if row is None:
                    raise InvalidInputError(
                        f"turn_id {turn_id!r} already exists in session {session_id!r} "
                        f"of user {user_id!r}"
                    )
                seq, position, turn_id = row
                out.append(
                    Turn(user_id, session_id, t["role"], t["text"], turn_id, position, ts, seq)
                )
        return out

    _TURN_COLS = "seq, user_id, session_id, turn_id, position, role, text, ts, text_crc"

    @staticmethod
    def _turn(row: Sequence[Any]) -> Turn:
        seq, user_id, session_id, turn_id, position, role, text, ts, crc = row
        check_turn(text, crc, user_id, session_id, turn_id)
        return Turn(user_id, session_id, role, text, turn_id, position, text_time(ts), int(seq))

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """See `MemoryStore.turns`."""
        with self.db.transaction() as conn:
            if session_id is None:
                rows = conn.execute(
                    f"SELECT {self._TURN_COLS} FROM {self._s}.turns WHERE user_id=%s ORDER BY seq",
                    (user_id,),
                ).fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {self._TURN_COLS} FROM {self._s}.turns WHERE user_id=%s AND "
                    "session_id=%s ORDER BY position",
                    (user_id, session_id),
                ).fetchall()
        return [self._turn(r) for r in rows]

    _SESSION_COLS = "user_id, session_id, status, n_turns, first_ts, last_ts, created_at, ended_at"

    @staticmethod
    def _session(row: Sequence[Any]) -> SessionInfo:
        u, s, status, n, first, last, created, ended = row
        return SessionInfo(u, s, status, int(n), text_time(first), text_time(last), created, ended)

    def session(self, user_id: str, session_id: str) -> SessionInfo | None:
        """See `MemoryStore.session`."""
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT {self._SESSION_COLS} FROM {self._s}.sessions "
                "WHERE user_id=%s AND session_id=%s",
                (user_id, session_id),
            ).fetchone()
        return None if row is None else self._session(row)

    def sessions(self, user_id: str, status: str | None = None) -> list[SessionInfo]:
        """See `MemoryStore.sessions`."""
        sql = f"SELECT {self._SESSION_COLS} FROM {self._s}.sessions WHERE user_id=%s"
        args: tuple[Any, ...] = (user_id,)
        if status is not None:
            sql += " AND status=%s"
            args += (status,)
        with self.db.transaction() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, session_id", args).fetchall()
        return [self._session(r) for r in rows]

    def sessions_missing_turn_units(self, user_id: str | None = None) -> list[tuple[str, str]]:
        """See `TurnUnitAudit.sessions_missing_turn_units`."""
        s = self._s
        mine = "" if user_id is None else " AND ss.user_id = %s"
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"SELECT ss.user_id, ss.session_id FROM {s}.sessions ss WHERE ss.status = 'open'"
                f"{mine} AND ss.n_turns > (SELECT COUNT(*) FROM {s}.memories m WHERE m.user_id ="
                " ss.user_id AND m.session_id = ss.session_id AND m.granularity = 'turn')"
                " ORDER BY 1, 2",
                () if user_id is None else (user_id,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def session_builds(self, user_id: str, session_id: str) -> int:
        """How many times a session's memories were built (0 for an unknown session)."""
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT builds FROM {self._s}.sessions WHERE user_id=%s AND session_id=%s",
                (user_id, session_id),
            ).fetchone()
        return 0 if row is None else int(row[0])

    @contextmanager
    def session_build(self, user_id: str, session_id: str) -> Iterator[list[Memory] | None]:
        """Hold the cross-process lock for building one session's memories.

        Yields None when the caller should build, or the session's stored memories when it is
        already ended with no turn added since (another process built it while this one waited).
        The lock is a PostgreSQL session-level advisory lock on a connection held for the block;
        it is released when the block exits, or by the server if this process dies. At most
        `pool_max // 2` builds of this store run at once (each needs two connections).
        """
        key = f"session-build\x1f{self.schema}\x1f{user_id}\x1f{session_id}"
        with self._builds, self.db.connection() as conn:
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            conn.commit()
            try:
                info = self.session(user_id, session_id)
                if info is not None and info.status == "ended":
                    yield self.session_memories(user_id, session_id)
                else:
                    yield None
            finally:
                conn.rollback()
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
                conn.commit()

    # -- memories -------------------------------------------------------------------------
    def _insert_memories(
        self,
        conn: Any,
        user_id: str,
        drafts: Sequence[MemoryDraft],
        embeddings: np.ndarray,
        model: str,
    ) -> list[Memory]:
        if len(drafts) != len(embeddings):
            raise InvalidInputError("one embedding per memory is required")
        s = self._s
        for d in drafts:
            if any("\x00" in x for x in (d.text, d.key, d.session_id, d.id or "", *d.turn_ids)):
                raise InvalidInputError("memory text, key or ids contain a NUL character (0x00)")
        out: list[Memory] = []
        for d, vec in zip(drafts, embeddings, strict=True):
            mid = d.id if d.id is not None else f"{d.granularity}-{uuid.uuid4().hex[:16]}"
            meta = d.metadata if d.metadata is not None else {}
            v = np.asarray(vec, dtype=np.float32).reshape(-1)
            created, updated = conn.execute(
                f"INSERT INTO {s}.memories AS m (user_id, id, session_id, granularity, text, key,"
                " lex, turn_ids, start_ts, end_ts, created_at, updated_at, metadata, embedding,"
                " embed_dim, embed_model, text_crc, key_crc) VALUES (%s, %s, %s, %s, %s, %s, %s,"
                " %s, %s, %s, clock_timestamp(), clock_timestamp(), %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (user_id, id) DO UPDATE SET session_id = EXCLUDED.session_id,"
                " granularity = EXCLUDED.granularity, text = EXCLUDED.text, key = EXCLUDED.key,"
                " text_crc = EXCLUDED.text_crc, key_crc = EXCLUDED.key_crc,"
                " lex = EXCLUDED.lex, turn_ids = EXCLUDED.turn_ids,"
                " start_ts = EXCLUDED.start_ts, end_ts = EXCLUDED.end_ts,"
                f" updated_at = EXCLUDED.updated_at, metadata = EXCLUDED.metadata,"
                " embedding = EXCLUDED.embedding, embed_dim = EXCLUDED.embed_dim,"
                f" embed_model = EXCLUDED.embed_model, seq = nextval('{s}.memories_seq') "
                "RETURNING m.created_at, m.updated_at",
                (
                    user_id,
                    mid,
                    d.session_id,
                    d.granularity,
                    d.text,
                    d.key,
                    _lex(d.key),
                    json.dumps(list(d.turn_ids)),
                    time_text(d.start_time),
                    time_text(d.end_time),
                    json.dumps(meta, default=str),
                    v,
                    int(v.shape[0]),
                    model,
                    text_crc(d.text),
                    text_crc(d.key),
                ),  # fmt: skip
            ).fetchone()
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
                    updated,
                    text_time(d.start_time),
                    text_time(d.end_time),
                    dict(meta),
                )  # fmt: skip
            )
        self._bump(conn, user_id)
        return out

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
        """See `MemoryStore.replace_session_memories` (also counts the session's builds).

        The session row is locked first, so turns added or deleted concurrently (which lock
        it too) either committed before the fence is read or wait until this build commits.
        """
        s = self._s
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT 1 FROM {s}.sessions WHERE user_id=%s AND session_id=%s FOR UPDATE",
                (user_id, session_id),
            ).fetchone()
            if row is None:
                raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
            if fence is not None:
                n, top = conn.execute(
                    f"SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM {s}.turns "
                    "WHERE user_id=%s AND session_id=%s",
                    (user_id, session_id),
                ).fetchone()
                if (int(n), int(top)) != tuple(fence):
                    raise SessionChangedError(
                        f"session {session_id!r} of user {user_id!r} changed during the build"
                    )
            conn.execute(
                f"DELETE FROM {s}.memories WHERE user_id=%s AND session_id=%s "
                "AND granularity = ANY(%s)",
                (user_id, session_id, list(granularities)),
            )
            out = self._insert_memories(conn, user_id, drafts, embeddings, embed_model)
            conn.execute(
                f"UPDATE {s}.sessions SET status='ended', ended_at=now(), builds = builds + 1 "
                "WHERE user_id=%s AND session_id=%s",
                (user_id, session_id),
            )
        return out

    def upsert_memories(
        self, user_id: str, drafts: Sequence[MemoryDraft], embeddings: np.ndarray, embed_model: str
    ) -> list[Memory]:
        """See `MemoryStore.upsert_memories`."""
        with self.db.transaction() as conn:
            return self._insert_memories(conn, user_id, drafts, embeddings, embed_model)

    def delete_memories(self, user_id: str, ids: Iterable[str]) -> int:
        """Delete memories of a user by id; return how many were deleted."""
        ids = list(ids)
        if not ids:
            return 0
        with self.db.transaction() as conn:
            n = conn.execute(
                f"DELETE FROM {self._s}.memories WHERE user_id=%s AND id = ANY(%s)",
                (user_id, ids),
            ).rowcount
            self._bump(conn, user_id)
        return int(n)

    def delete_expired(self, user_id: str, now: float) -> int:
        """See `MemoryStore.delete_expired`."""
        with self.db.transaction() as conn:
            n = conn.execute(
                f"DELETE FROM {self._s}.memories WHERE user_id=%s AND CASE WHEN "
                "jsonb_typeof(metadata -> 'expires_at') = 'number' THEN "
                "(metadata ->> 'expires_at')::float8 <= %s ELSE false END",
                (user_id, float(now)),
            ).rowcount
            if n:
                self._bump(conn, user_id)
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
            mid, u, s, g, text, key, tuple(tids), created, updated,
            text_time(start), text_time(end), meta,
        )  # fmt: skip

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """See `MemoryStore.memories`."""
        with self.db.transaction() as conn:
            if ids is None:
                rows = conn.execute(
                    f"SELECT {self._MEM_COLS} FROM {self._s}.memories WHERE user_id=%s "
                    "ORDER BY seq",
                    (user_id,),
                ).fetchall()
                return [self._memory(r) for r in rows]
            ids = list(ids)
            rows = conn.execute(
                f"SELECT {self._MEM_COLS} FROM {self._s}.memories WHERE user_id=%s "
                "AND id = ANY(%s)",
                (user_id, ids),
            ).fetchall()
        found = {r[0]: self._memory(r) for r in rows}
        return [found[i] for i in ids if i in found]

    def update_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """See `MemoryStore.update_metadata` (one transaction; the version is not bumped)."""
        rows = [(json.dumps(dict(v), default=str), user_id, mid) for mid, v in updates.items()]
        if not rows:
            return 0
        n = 0
        with self.db.transaction() as conn:
            for row in rows:
                n += conn.execute(
                    f"UPDATE {self._s}.memories SET metadata = metadata || %s::jsonb "
                    "WHERE user_id=%s AND id=%s",
                    row,
                ).rowcount
        return n

    def session_memories(self, user_id: str, session_id: str) -> list[Memory]:
        """A session's memories, in storage order."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"SELECT {self._MEM_COLS} FROM {self._s}.memories WHERE user_id=%s "
                "AND session_id=%s ORDER BY seq",
                (user_id, session_id),
            ).fetchall()
        return [self._memory(r) for r in rows]

    def embeddings(
        self, user_id: str
    ) -> tuple[list[str], list[str], list[bytes | None], list[str]]:
        """See `MemoryStore.embeddings`."""
        with self.db.transaction() as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(
                "SELECT id, key, embedding, COALESCE(embed_model, ''), key_crc "
                f"FROM {self._s}.memories WHERE user_id=%s ORDER BY seq",
                (user_id,),
            ).fetchall()
        blobs = [None if r[2] is None else to_vector(r[2]).tobytes() for r in rows]
        keys = checked_keys(user_id, [(r[0], r[1], r[4]) for r in rows])
        return [r[0] for r in rows], keys, blobs, [r[3] for r in rows]

    def vectors(self, user_id: str, ids: Sequence[str], model: str) -> dict[str, np.ndarray]:
        """See `MemoryStore.vectors` (read by `search`)."""
        return self.search.vectors(user_id, ids, model)

    def set_embeddings(self, user_id: str, ids: Sequence[str], emb: np.ndarray, model: str) -> None:
        """See `MemoryStore.set_embeddings` (written by `search`)."""
        self.search.set_embeddings(user_id, ids, emb, model)

    def server_index(
        self,
        user_id: str,
        embedder: Any,
        vectors: MemoryVectors | None = None,
        before: UserIndex | None = None,
    ) -> UserIndex:
        """See `ServerSearch.server_index`: a `UserIndex` searched on the server by `search`."""
        return build_server_index(self.search, user_id, embedder, vectors, before)

    def set_keys(self, user_id: str, ids: Sequence[str], keys: Sequence[str]) -> None:
        """Replace the indexed key of memories (their embeddings are cleared and recomputed)."""
        with self.db.transaction() as conn:
            with conn.cursor() as cur:
                cur.executemany(
                    f"UPDATE {self._s}.memories SET key=%s, key_crc=%s, lex=%s, embedding=NULL,"
                    f" embed_dim=NULL, embed_model=NULL, seq=nextval('{self._s}.memories_seq')"
                    " WHERE user_id=%s AND id=%s",
                    [(k, text_crc(k), _lex(k), user_id, i) for i, k in zip(ids, keys, strict=True)],
                )
            self._bump(conn, user_id)

    def version(self, user_id: str) -> int:
        """See `MemoryStore.version`."""
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT version FROM {self._s}.user_state WHERE user_id=%s", (user_id,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def count(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions and memories by granularity."""
        s = self._s
        with self.db.transaction() as conn:
            n_turns = conn.execute(
                f"SELECT COUNT(*) FROM {s}.turns WHERE user_id=%s", (user_id,)
            ).fetchone()[0]
            sess = dict(
                conn.execute(
                    f"SELECT status, COUNT(*) FROM {s}.sessions WHERE user_id=%s GROUP BY status",
                    (user_id,),
                ).fetchall()
            )
            mems = dict(
                conn.execute(
                    f"SELECT granularity, COUNT(*) FROM {s}.memories WHERE user_id=%s "
                    "GROUP BY granularity",
                    (user_id,),
                ).fetchall()
            )
        return {
            "turns": int(n_turns),
            "sessions": int(sum(sess.values())),
            "open_sessions": int(sess.get("open", 0)),
            "memories": int(sum(mems.values())),
            "memories_by_granularity": {k: int(v) for k, v in mems.items()},
        }

    def users(self) -> list[str]:
        """See `MemoryStore.users`."""
        s = self._s
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"SELECT user_id FROM {s}.sessions UNION SELECT user_id FROM {s}.memories "
                "ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    # -- per-turn extra data (adapters keep framework message fields here) ----------------
    def set_turn_extra(
        self, user_id: str, session_id: str, extras: dict[str, dict[str, Any]]
    ) -> None:
        """See `MemoryStore.set_turn_extra`."""
        if not extras:
            return
        with self.db.transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self._s}.turn_extra (user_id, session_id, turn_id, data) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (user_id, session_id, turn_id) "
                "DO UPDATE SET data = EXCLUDED.data",
                [
                    (user_id, session_id, tid, json.dumps(data, default=str))
                    for tid, data in extras.items()
                ],
            )

    def turn_extra(self, user_id: str, session_id: str) -> dict[str, dict[str, Any]]:
        """See `MemoryStore.turn_extra`."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"SELECT turn_id, data FROM {self._s}.turn_extra WHERE user_id=%s "
                "AND session_id=%s",
                (user_id, session_id),
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    def restore_times(
        self,
        user_id: str,
        sessions: Mapping[str, tuple[datetime, datetime | None]],
        memories: Mapping[str, tuple[datetime, datetime]],
    ) -> None:
        """See `reflective_memory.storage.base.RestoresTimes`."""
        s = self._s
        with self.db.transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                f"UPDATE {s}.sessions SET created_at=%s, ended_at=%s "
                "WHERE user_id=%s AND session_id=%s",
                [(c, e, user_id, sid) for sid, (c, e) in sessions.items()],
            )
            cur.executemany(
                f"UPDATE {s}.memories SET created_at=%s, updated_at=%s,"
                f" seq=nextval('{s}.memories_seq') WHERE user_id=%s AND id=%s",
                [(c, u, user_id, mid) for mid, (c, u) in memories.items()],
            )
            if memories:
                self._bump(conn, user_id)

    # -- small key/value area for components (reflection reports, adapters' markers) ------
    def get_value(self, key: str) -> Any | None:
        """See `MemoryStore.get_value`."""
        with self.db.transaction() as conn:
            row = conn.execute(f"SELECT value FROM {self._s}.kv WHERE key=%s", (key,)).fetchone()
        return None if row is None else row[0]

    def set_value(self, key: str, value: Any) -> None:
        """See `MemoryStore.set_value`."""
        text = json.dumps(value)
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO {self._s}.kv (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (key, text),
            )

    # -- deletion -------------------------------------------------------------------------
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
        with self.db.transaction() as conn:
            n = conn.execute(f"DELETE FROM {s}.turns WHERE user_id=%s", (user_id,)).rowcount
            for table in ("turn_extra", "sessions", "memories", "user_state"):
                conn.execute(f"DELETE FROM {s}.{table} WHERE user_id=%s", (user_id,))
            delete_owner_rows(conn, s, user_id)  # its learned state (`state`)
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
        with self.db.transaction() as conn:
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
        """See `MemoryStore.delete_turns`.

        Memories holding a deleted turn's text (units, notes, topics citing it) go too; if
        turns remain the session is reopened so the next `end_session` rebuilds it.
        """
        s = self._s
        with self.db.transaction() as conn:
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
