"""The server store: PostgreSQL + pgvector holds everything, for many processes and hosts.

`PostgresStore` is the `reflective_memory.storage.core.StoreCore` on PostgreSQL: this module
holds its SQL and the capabilities only a server store offers:

- `ServerSearch`: searches run on the server (`server_index`; the collaborator `search`, a
  `reflective_memory.storage.pg_search.PgSearch`, owns embeddings and search);
- `StateHolder`: learned state (reranker weights) shared by all processes, in `state`, a
  `reflective_memory.storage.pg_state.DatabaseStateStore`;
- `NativeAsync`: the engine's `a*` methods await its queries on the event loop through
  psycopg's async pool (`async_io`);
- `SessionBuildLock`: building a session's memories is serialised across processes with an
  advisory lock (`session_build`).

Connections come from a `reflective_memory.storage.pg_database.PgDatabase` shared by the three;
with `read_dsn`, reads go to hot standbys through `reflective_memory.storage.pg_replicas`
(read-your-writes by WAL position). The schema lives in `reflective_memory.storage.pg_schema`.
Deletions remove every row naming the user or session in one transaction; PostgreSQL keeps dead
row versions on disk until VACUUM reclaims them (autovacuum does so in the background), and no
query can read them after the commit.

Needs the `postgres` extra: `pip install 'reflective-memory[postgres]'`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.base import MemoryVectors, time_text
from reflective_memory.storage.bridge import TaskLock
from reflective_memory.storage.checksum import text_crc
from reflective_memory.storage.core import COLUMNS, MemoryRow, Statements, StoreCore, lexical_text
from reflective_memory.storage.pg_async import AsyncRoutes
from reflective_memory.storage.pg_database import PgDatabase, is_postgres_dsn
from reflective_memory.storage.pg_replicas import READ_WAIT_S, PgRoutes
from reflective_memory.storage.pg_schema import migrate
from reflective_memory.storage.pg_search import PgSearch, to_vector
from reflective_memory.storage.pg_state import DatabaseStateStore
from reflective_memory.storage.server_index import build_server_index
from reflective_memory.types import Memory, Turn

if TYPE_CHECKING:
    from reflective_memory.storage.user_index import UserIndex

__all__ = ["PostgresStore", "is_postgres_dsn", "pg_statements"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_OF_SESSION = "user_id=%(u)s AND session_id=%(s)s"
# Memories derived from one session: its own units and notes, and topics that merged it in.
_FROM_SESSION = (
    "(session_id = %(s)s OR (granularity = 'topic' AND "
    "COALESCE(metadata -> 'rmm' -> 'sessions', '[]'::jsonb) ? %(s)s))"
)


def pg_statements(s: str) -> Statements:
    """PostgreSQL's statements for `StoreCore` in schema `s` (a quoted identifier)."""
    edge = f"SELECT ts FROM {s}.turns WHERE {_OF_SESSION} AND ts IS NOT NULL ORDER BY position"
    missing = (
        f"SELECT ss.user_id, ss.session_id FROM {s}.sessions ss WHERE ss.status = 'open'{{}}"
        f" AND ss.n_turns > (SELECT COUNT(*) FROM {s}.memories m WHERE m.user_id = ss.user_id"
        " AND m.session_id = ss.session_id AND m.granularity = 'turn') ORDER BY 1, 2"
    )
    values = f"DELETE FROM {s}.kv WHERE strpos(key, '/') > 0 AND"
    rest = "substr(key, strpos(key, '/') + 1)"
    return Statements(
        open_session=(
            f"INSERT INTO {s}.sessions (user_id, session_id, status, n_turns, first_ts, last_ts,"
            " created_at) VALUES (%(u)s, %(s)s, 'open', 1, %(ts)s, %(ts)s, now())"
            " ON CONFLICT (user_id, session_id) DO UPDATE SET"
            " n_turns = sessions.n_turns + 1, status = 'open',"
            " first_ts = COALESCE(sessions.first_ts, EXCLUDED.first_ts),"
            " last_ts = COALESCE(EXCLUDED.last_ts, sessions.last_ts)"
        ),
        turns_of_user=f"SELECT {COLUMNS.turn} FROM {s}.turns WHERE user_id=%(u)s ORDER BY seq",
        turns_of_session=(
            f"SELECT {COLUMNS.turn} FROM {s}.turns WHERE {_OF_SESSION} ORDER BY position"
        ),
        session=f"SELECT {COLUMNS.session} FROM {s}.sessions WHERE {_OF_SESSION}",
        sessions=(
            f"SELECT {COLUMNS.session} FROM {s}.sessions WHERE user_id=%(u)s"
            " ORDER BY created_at, session_id"
        ),
        sessions_with_status=(
            f"SELECT {COLUMNS.session} FROM {s}.sessions WHERE user_id=%(u)s"
            " AND status=%(status)s ORDER BY created_at, session_id"
        ),
        missing_units=missing.format(""),
        missing_units_of_user=missing.format(" AND ss.user_id = %(u)s"),
        lock_session=f"SELECT 1 FROM {s}.sessions WHERE {_OF_SESSION} FOR UPDATE",
        fence=f"SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM {s}.turns WHERE {_OF_SESSION}",
        delete_kinds=f"DELETE FROM {s}.memories WHERE {_OF_SESSION} AND granularity {{in_ids}}",
        end_session=(
            f"UPDATE {s}.sessions SET status='ended', ended_at=now(), builds = builds + 1"
            f" WHERE {_OF_SESSION}"
        ),
        memories_of_user=(
            f"SELECT {COLUMNS.memory} FROM {s}.memories WHERE user_id=%(u)s ORDER BY seq"
        ),
        memories_by_id=(
            f"SELECT {COLUMNS.memory} FROM {s}.memories WHERE user_id=%(u)s AND id {{in_ids}}"
        ),
        delete_memories=f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND id {{in_ids}}",
        delete_expired=(
            f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND CASE WHEN"
            " jsonb_typeof(metadata -> 'expires_at') = 'number' THEN"
            " (metadata ->> 'expires_at')::float8 <= %(now_s)s ELSE false END"
        ),
        embeddings=(
            "SELECT id, key, embedding, COALESCE(embed_model, ''), key_crc"
            f" FROM {s}.memories WHERE user_id=%(u)s ORDER BY seq"
        ),
        set_keys=(
            f"UPDATE {s}.memories SET key=%(key)s, key_crc=%(crc)s, lex=%(lex)s, embedding=NULL,"
            f" embed_dim=NULL, embed_model=NULL, seq=nextval('{s}.memories_seq')"
            " WHERE user_id=%(u)s AND id=%(id)s"
        ),
        version=f"SELECT version FROM {s}.user_state WHERE user_id=%(u)s",
        count_turns=f"SELECT COUNT(*) FROM {s}.turns WHERE user_id=%(u)s",
        count_sessions=(
            f"SELECT status, COUNT(*) FROM {s}.sessions WHERE user_id=%(u)s GROUP BY status"
        ),
        count_memories=(
            f"SELECT granularity, COUNT(*) FROM {s}.memories WHERE user_id=%(u)s"
            " GROUP BY granularity"
        ),
        users=f"SELECT user_id FROM {s}.sessions UNION SELECT user_id FROM {s}.memories ORDER BY 1",
        set_turn_extra=(
            f"INSERT INTO {s}.turn_extra (user_id, session_id, turn_id, data)"
            " VALUES (%(u)s, %(s)s, %(t)s, %(data)s) ON CONFLICT (user_id, session_id, turn_id)"
            " DO UPDATE SET data = EXCLUDED.data"
        ),
        turn_extra=f"SELECT turn_id, data FROM {s}.turn_extra WHERE {_OF_SESSION}",
        restore_session_times=(
            f"UPDATE {s}.sessions SET created_at=%(created)s, ended_at=%(ended)s"
            f" WHERE {_OF_SESSION}"
        ),
        restore_memory_times=(
            f"UPDATE {s}.memories SET created_at=%(created)s, updated_at=%(updated)s,"
            f" seq=nextval('{s}.memories_seq') WHERE user_id=%(u)s AND id=%(id)s"
        ),
        get_value=f"SELECT value FROM {s}.kv WHERE key=%(k)s",
        set_value=(
            f"INSERT INTO {s}.kv (key, value) VALUES (%(k)s, %(v)s)"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        ),
        delete_user_values=f"{values} starts_with({rest}, %(p)s)",
        delete_session_memories=f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND {_FROM_SESSION}",
        delete_session_values=f"{values} {rest} = %(p)s",
        delete_turn_extra=f"DELETE FROM {s}.turn_extra WHERE {_OF_SESSION} AND turn_id {{in_ids}}",
        delete_turn_memories=(
            f"DELETE FROM {s}.memories WHERE user_id=%(u)s AND {_FROM_SESSION} AND EXISTS"
            " (SELECT 1 FROM jsonb_array_elements_text(turn_ids) AS t(v) WHERE t.v {in_ids})"
        ),
        recount_session=(
            f"UPDATE {s}.sessions SET n_turns = (SELECT COUNT(*) FROM {s}.turns WHERE"
            f" {_OF_SESSION}), status = CASE WHEN EXISTS (SELECT 1 FROM {s}.turns WHERE"
            f" {_OF_SESSION}) THEN 'open' ELSE status END, first_ts = ({edge} LIMIT 1),"
            f" last_ts = ({edge} DESC LIMIT 1) WHERE {_OF_SESSION}"
        ),
        table_format=f"{s}.{{}}",
        param_format="%({})s",
        delete_user_extra=(f"DELETE FROM {s}.blobs WHERE owner=%(u)s",),  # learned state
    )


def _replica_dsns(read_dsn: str | Sequence[str] | None) -> list[str]:
    """The replicas' URIs of `PostgresStore(read_dsn=...)`, checked."""
    if read_dsn is None:
        return []
    dsns = [read_dsn] if isinstance(read_dsn, str) else read_dsn
    if not isinstance(dsns, (list, tuple)) or not all(is_postgres_dsn(d) for d in dsns):
        raise InvalidInputError(
            "read_dsn must be a 'postgresql://...' URI or a list of them, got "
            f"{read_dsn if isinstance(read_dsn, str) else type(read_dsn).__name__!r}"[:200]
        )
    return list(dsns)


class PostgresStore(StoreCore):
    """`MemoryStore` on PostgreSQL with pgvector.

    Every acknowledged write is committed (PostgreSQL's default `synchronous_commit=on` makes it
    durable). No state that can go stale is kept in the process: callers cache derived indexes by
    `version(user_id)`, which every memory change bumps in the same transaction.

    Args:
        dsn_or_pool: A connection URI (`postgresql://user@host:5432/db`, or several hosts:
            `postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write` follows a
            failover) or an open `psycopg_pool.ConnectionPool` you own (it is not closed by
            `close()`).
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
        read_dsn: Read replicas: the URI of a hot standby of this database, or a list of them
            (each pooled like the primary). Reads go to a replica, writes to the primary;
            a read waits for the replica to replay this process's last write for its user
            (read-your-writes) at most `read_wait` seconds, else reads from the primary
            (`reflective_memory.storage.pg_replicas`).
        read_wait: Most seconds a read waits for a replica to catch up (see `read_dsn`).
        replica_timeout: Seconds a read waits for a replica's connection before it reads
            from the primary and leaves that replica alone for a few seconds.

    Attributes:
        db: The primary's connections and the schema (`PgDatabase`).
        routes: Where transactions run: writes on the primary, reads on replicas (`PgRoutes`).
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
        read_dsn: str | Sequence[str] | None = None,
        read_wait: float = READ_WAIT_S,
        replica_timeout: float = 2.0,
    ) -> None:
        reads = _replica_dsns(read_dsn)
        pool: dict[str, Any] = {"schema": schema, "pool_min": pool_min, "pool_max": pool_max}
        self.db = PgDatabase(dsn_or_pool, timeout=timeout, **pool)
        replicas = [PgDatabase(dsn, timeout=replica_timeout, **pool) for dsn in reads]
        self.routes = PgRoutes(self.db, replicas, read_wait=read_wait)
        self.schema = self.db.schema
        self._s = self.db.qualified
        self.sql = pg_statements(self._s)
        # A build holds its lock's connection and takes another: at most half the pool builds at
        # once, so concurrent builds (threads or coroutines) cannot take every connection.
        self._builds = TaskLock(slots=max(1, pool_max // 2))
        try:
            self.search = PgSearch(
                self.routes,
                hnsw_threshold=hnsw_threshold,
                ef_search=ef_search,
                max_scan_tuples=max_scan_tuples,
            )
            self.state = DatabaseStateStore(self.routes)
            self.db.open()
            self.routes.open()
            if create:
                with self.db.connection() as conn:
                    migrate(conn, self.db.schema)
                    if replicas:  # the replicas serve reads once they have the schema
                        self.routes.wrote(None, conn)
        except BaseException:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self.db.closed

    def close(self) -> None:
        """Close the pools this store opened (idempotent)."""
        self.routes.close()
        self.db.close()

    def async_io(self) -> AsyncRoutes | None:
        """See `NativeAsync`: the async pool routes (None when given a caller's pool)."""
        route = self.db.async_route
        if route is None:
            return None
        return AsyncRoutes(
            route, [r.db.async_route for r in self.routes.replicas if r.db.async_route]
        )

    # -- the core's hooks -----------------------------------------------------------------
    def _read(self, user_id: str | None, fn: Callable[[Any], T]) -> T:
        return self.routes.read(user_id, fn)

    def _write(self, user_ids: Collection[str] | None, fn: Callable[[Any], T]) -> T:
        return self.routes.write(user_ids, fn)

    def _clock(self) -> datetime:
        return datetime.now().astimezone()  # unused: the server's now() fills its columns

    def _bump_version(self, conn: Any, user_id: str) -> None:
        conn.execute(
            f"INSERT INTO {self._s}.user_state (user_id, version) "
            f"VALUES (%(u)s, nextval('{self._s}.version_seq')) "
            "ON CONFLICT (user_id) DO UPDATE SET version = EXCLUDED.version",
            {"u": user_id},
        )

    def _in(self, ids: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        return [("= ANY(%(ids)s)", {"ids": list(ids)})] if ids else []

    def _many(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def _json(self, value: Any) -> Any:
        return value  # jsonb comes back decoded

    def _vector_rows(self, user_id: str, sql: str, params: Mapping[str, Any]) -> list[Any]:
        def read(conn: Any) -> list[Any]:
            with conn.cursor(binary=True) as cur:
                return list(cur.execute(sql, params).fetchall())

        return self._read(user_id, read)

    def _blob(self, value: Any) -> bytes | None:
        return None if value is None else to_vector(value).tobytes()

    def _insert_turn(self, conn: Any, p: dict[str, Any]) -> tuple[int, int, str] | None:
        # A new statement after `open_session`, so its snapshot sees every turn committed
        # before the session row's lock (taken there) was granted.
        s = self._s
        row = conn.execute(
            f"INSERT INTO {s}.turns (user_id, session_id, position, turn_id, role, text, ts,"
            " text_crc) SELECT %(u)s, %(s)s, p, COALESCE(%(tid)s, %(s)s || ':' || p), %(role)s,"
            f" %(text)s, %(ts)s, %(crc)s FROM (SELECT COALESCE(MAX(position) + 1, 0) AS p FROM"
            f" {s}.turns WHERE {_OF_SESSION}) AS next ON CONFLICT DO NOTHING"
            " RETURNING seq, position, turn_id",
            p,
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), row[2])

    def _upsert_memory(self, conn: Any, row: MemoryRow) -> tuple[datetime, datetime]:
        user_id, memory_id, draft, metadata, vector, model = row
        s = self._s
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
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
            " updated_at = EXCLUDED.updated_at, metadata = EXCLUDED.metadata,"
            " embedding = EXCLUDED.embedding, embed_dim = EXCLUDED.embed_dim,"
            f" embed_model = EXCLUDED.embed_model, seq = nextval('{s}.memories_seq') "
            "RETURNING m.created_at, m.updated_at",
            (user_id, memory_id, draft.session_id, draft.granularity, draft.text, draft.key,
             lexical_text(draft.key), json.dumps(list(draft.turn_ids)),
             time_text(draft.start_time), time_text(draft.end_time),
             json.dumps(metadata, default=str), v, int(v.shape[0]), model,
             text_crc(draft.text), text_crc(draft.key)),
        ).fetchone()  # fmt: skip
        return created, updated

    def _merge_metadata(
        self, conn: Any, user_id: str, memory_id: str, fields: Mapping[str, Any]
    ) -> bool:
        return bool(
            conn.execute(
                f"UPDATE {self._s}.memories SET metadata = metadata || %s::jsonb "
                "WHERE user_id=%s AND id=%s",
                (json.dumps(dict(fields), default=str), user_id, memory_id),
            ).rowcount
        )

    def _delete_turn_rows(
        self, conn: Any, user_id: str, session_id: str, turn_ids: Sequence[str] | None
    ) -> list[Turn]:
        sql = f"DELETE FROM {self._s}.turns WHERE {_OF_SESSION}"
        p: dict[str, Any] = {"u": user_id, "s": session_id, "ids": list(turn_ids or ())}
        if turn_ids is not None:
            sql += " AND turn_id = ANY(%(ids)s)"
        rows = conn.execute(f"{sql} RETURNING {COLUMNS.turn}", p).fetchall()
        return sorted((self._turn(r) for r in rows), key=lambda t: t.position)

    # -- what only the server store offers ------------------------------------------------
    def session_builds(self, user_id: str, session_id: str) -> int:
        """How many times a session's memories were built (0 for an unknown session)."""
        rows = self._rows(
            user_id,
            f"SELECT builds FROM {self._s}.sessions WHERE {_OF_SESSION}",
            {"u": user_id, "s": session_id},
        )
        return int(rows[0][0]) if rows else 0

    @contextmanager
    def session_build(self, user_id: str, session_id: str) -> Iterator[list[Memory] | None]:
        """Hold the cross-process lock for building one session's memories.

        Yields None when the caller should build, or the session's stored memories when it is
        already ended with no turn added since (another process built it while this one waited).
        The lock is a PostgreSQL session-level advisory lock on a connection held for the block;
        it is released when the block exits, or by the server if this process dies. At most
        `pool_max // 2` builds of this store run at once (each needs two connections). Every
        read inside the block goes to the primary.
        """
        key = f"session-build\x1f{self.schema}\x1f{user_id}\x1f{session_id}"
        # The build reads from the primary what another process may have just written.
        with self._builds, self.db.connection() as conn, self.routes.primary_reads():
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

    def session_memories(self, user_id: str, session_id: str) -> list[Memory]:
        """A session's memories, in storage order."""
        rows = self._rows(
            user_id,
            f"SELECT {COLUMNS.memory} FROM {self._s}.memories WHERE {_OF_SESSION} ORDER BY seq",
            {"u": user_id, "s": session_id},
        )
        return [self._memory(r) for r in rows]

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
