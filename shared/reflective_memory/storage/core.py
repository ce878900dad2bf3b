"""One storage core under both backends: the store contract's logic, each backend's own SQL.

`StoreCore` implements `reflective_memory.storage.base.MemoryStore` once: the checks of what is
written (one embedding per memory, no NUL in ids or text, a known session, the build's fence),
new memory ids, the order and atomicity of each operation's statements, decoding and checking
rows as they are read (`checksum`), and the records returned. A backend gives it:

- its SQL, as a `Statements` of named-parameter statements (`:u` on SQLite, `%(u)s` on
  PostgreSQL; the parameter names are the core's, listed there); a statement that takes a list
  of ids holds `{in_ids}`, which the backend's `_in` fills in;
- its transactions, `_read` and `_write`, which run a function on a connection (a SQLite
  connection under the store's lock, or a PostgreSQL connection of the primary or a replica);
- the few steps whose SQL shape differs (`_insert_turn`, `_upsert_memory`, `_merge_metadata`,
  `_delete_turn_rows`, `_bump_version`), and `_erased`, called after a deletion committed (SQLite
  truncates its WAL there).

`reflective_memory.storage.sqlite.SQLiteStore` and
`reflective_memory.storage.postgres.PostgresStore` are the two backends.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import numpy as np

from reflective_memory.errors import InvalidInputError, SessionChangedError, UnknownSessionError
from reflective_memory.storage.base import MemoryDraft, SessionInfo, text_time, time_text
from reflective_memory.storage.checksum import check_memory, check_turn, checked_keys, text_crc
from reflective_memory.text import lexical_tokens
from reflective_memory.types import Memory, Turn

__all__ = [
    "COLUMNS",
    "Columns",
    "MemoryRow",
    "Statements",
    "StoreCore",
    "lexical_text",
]

T = TypeVar("T")


class Columns(NamedTuple):
    """The columns of each kind of row, in the order `StoreCore` decodes them."""

    turn: str
    session: str
    memory: str


#: The columns a backend selects for the rows `StoreCore` decodes.
COLUMNS = Columns(
    turn="seq, user_id, session_id, turn_id, position, role, text, ts, text_crc",
    session="user_id, session_id, status, n_turns, first_ts, last_ts, created_at, ended_at",
    memory="id, user_id, session_id, granularity, text, key, turn_ids, created_at, updated_at,"
    " start_ts, end_ts, metadata, text_crc, key_crc",
)

_TURN_FIELDS = ("user_id", "session_id", "turn_id", "role", "text")
# Tables whose rows name a user (besides turns, counted apart), and a session.
_USER_TABLES = ("turn_extra", "sessions", "memories", "user_state")
_SESSION_TABLES = ("sessions", "turn_extra")


def _always(_: object) -> bool:
    return True


def _owner(key: str) -> str | None:
    """The user a kv key belongs to (`<namespace>/<user_id>/...`), or None."""
    parts = key.split("/", 2)
    return parts[1] if len(parts) == 3 else None


def lexical_text(key: str) -> str:
    """A key's lexical tokens (the library tokenizer) joined by spaces."""
    return " ".join(lexical_tokens(key))


class MemoryRow(NamedTuple):
    """One memory as `StoreCore._upsert_memory` writes it."""

    user_id: str
    memory_id: str
    draft: MemoryDraft
    metadata: dict[str, Any]
    vector: np.ndarray
    model: str


@dataclass(frozen=True)
class Statements:
    """A backend's SQL for what `StoreCore` runs, with the core's parameter names.

    Parameters: `u` user id, `s` session id, `now` the store clock's time as text (a server
    may use its own clock instead), `k` a kv key, `v` a JSON value, `n` a length, `p` a prefix.
    Statements run with `executemany` get one mapping per row (names in their docstring).
    `{in_ids}` stands for a condition on a list of ids (`StoreCore._in`).
    """

    open_session: str  # u, s, ts, now: insert an open session of one turn, or count one more
    turns_of_user: str  # u -> COLUMNS.turn by seq
    turns_of_session: str  # u, s -> COLUMNS.turn by position
    session: str  # u, s -> COLUMNS.session
    sessions: str  # u -> COLUMNS.session by created_at, session_id
    sessions_with_status: str  # u, status -> the same
    missing_units: str  # -> (user_id, session_id) of every user
    missing_units_of_user: str  # u -> the same
    lock_session: str  # u, s -> a row when the session exists (held to the end of the write)
    fence: str  # u, s -> (turn count, largest seq)
    delete_kinds: str  # u, s, {in_ids} on granularity
    end_session: str  # u, s, now
    memories_of_user: str  # u -> COLUMNS.memory in mark order
    memories_by_id: str  # u, {in_ids} on id -> COLUMNS.memory
    delete_memories: str  # u, {in_ids} on id
    delete_expired: str  # u, now_s: a number of seconds since the epoch
    embeddings: str  # u -> id, key, embedding, model name, key_crc in mark order
    set_keys: str  # many: u, id, key, crc, lex
    version: str  # u -> version
    count_turns: str  # u -> count
    count_sessions: str  # u -> (status, count)
    count_memories: str  # u -> (granularity, count)
    users: str  # -> user_id
    set_turn_extra: str  # many: u, s, t, data
    turn_extra: str  # u, s -> (turn_id, data)
    restore_session_times: str  # many: u, s, created, ended
    restore_memory_times: str  # many: u, id, created, updated
    get_value: str  # k -> value
    set_value: str  # k, v
    delete_user_values: str  # p = "<user>/", n = len(p): the user's `<ns>/<user>/...` kv rows
    delete_session_memories: str  # u, s: its memories and topics that merged it in
    delete_session_values: str  # p = "<user>/<session>": its kv rows
    delete_turn_extra: str  # u, s, {in_ids} on turn_id
    delete_turn_memories: str  # u, s, {in_ids} on a turn id the memory holds
    recount_session: str  # u, s: turn count, reopened when turns remain, first/last times
    table_format: str = "{}"  # a table's name in statements (e.g. schema-qualified)
    param_format: str = ":{}"  # a named parameter
    delete_user_extra: tuple[str, ...] = ()  # u: the backend's other per-user rows

    def delete_where(self, table: str, *keys: str) -> str:
        """`DELETE FROM table WHERE <key>=<param>...` (keys: `user_id` `u`, `session_id` `s`)."""
        names = {"user_id": "u", "session_id": "s"}
        where = " AND ".join(f"{k}={self.param_format.format(names[k])}" for k in keys)
        return f"DELETE FROM {self.table_format.format(table)} WHERE {where}"


class StoreCore(ABC):
    """The store contract's logic over a backend's SQL (see the module docstring).

    A backend sets `sql` and implements the abstract hooks below; the public methods are the
    contract.
    """

    sql: Statements

    # -- the backend's hooks ----------------------------------------------------------------
    @abstractmethod
    def _read(self, user_id: str | None, fn: Callable[[Any], T]) -> T:
        """Run `fn(conn)` in a read transaction (`user_id`: whose writes it must see)."""

    @abstractmethod
    def _write(self, user_ids: Collection[str] | None, fn: Callable[[Any], T]) -> T:
        """Run `fn(conn)` in a write transaction, committed when it returns."""

    def _erased(self) -> None:  # noqa: B027 (a hook with nothing to do by default)
        """A deletion committed: make sure no copy of the deleted rows stays in a file.

        Nothing by default (a backend whose files keep no copy of deleted rows).
        """

    @abstractmethod
    def _clock(self) -> datetime:
        """The store's time for bookkeeping columns a backend fills from its parameters."""

    @abstractmethod
    def _bump_version(self, conn: Any, user_id: str) -> None:
        """Give the user a new version (in the transaction of `conn`)."""

    @abstractmethod
    def _in(self, ids: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """`{in_ids}` conditions and their parameters for `ids`, one per statement to run."""

    @abstractmethod
    def _many(self, conn: Any, sql: str, rows: list[dict[str, Any]]) -> None:
        """Run `sql` once per parameter mapping."""

    @abstractmethod
    def _json(self, value: Any) -> Any:
        """A JSON column's value as Python data."""

    @abstractmethod
    def _insert_turn(self, conn: Any, p: dict[str, Any]) -> tuple[int, int, str] | None:
        """Insert a turn at the next position of its session.

        `p` holds `u`, `s`, `tid` (None: the backend makes `<session>:<position>`), `role`,
        `text`, `ts` and `crc`. Returns `(seq, position, turn_id)`, or None when the turn id is
        taken in the session.
        """

    @abstractmethod
    def _upsert_memory(self, conn: Any, row: MemoryRow) -> tuple[datetime, datetime]:
        """Insert or replace one memory; its `(created_at, updated_at)` as stored."""

    @abstractmethod
    def _merge_metadata(
        self, conn: Any, user_id: str, memory_id: str, fields: Mapping[str, Any]
    ) -> bool:
        """Merge top-level `fields` into one memory's metadata; whether it exists."""

    @abstractmethod
    def _delete_turn_rows(
        self, conn: Any, user_id: str, session_id: str, turn_ids: Sequence[str] | None
    ) -> list[Turn]:
        """Delete some (None: all) turns of a session; the deleted turns by position."""

    # -- rows -------------------------------------------------------------------------------
    @staticmethod
    def _turn(row: Sequence[Any]) -> Turn:
        seq, user_id, session_id, turn_id, position, role, text, ts, crc = row
        check_turn(text, crc, user_id, session_id, turn_id)
        return Turn(user_id, session_id, role, text, turn_id, position, text_time(ts), int(seq))

    @staticmethod
    def _session(row: Sequence[Any]) -> SessionInfo:
        u, s, status, n, first, last, created, ended = row
        times = (text_time(first), text_time(last), text_time(created), text_time(ended))
        return SessionInfo(u, s, status, int(n), *times)  # type: ignore[arg-type]

    def _memory(self, row: Sequence[Any]) -> Memory:
        mid, u, s, g, text, key, tids, created, updated, start, end, meta, tcrc, kcrc = row
        check_memory(text, key, tcrc, kcrc, u, mid)
        return Memory(
            mid, u, s, g, text, key, tuple(self._json(tids)), text_time(created),  # type: ignore[arg-type]
            text_time(updated), text_time(start), text_time(end), self._json(meta),  # type: ignore[arg-type]
        )  # fmt: skip

    def _rows(self, user_id: str | None, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """All rows of one read statement."""
        return self._read(user_id, lambda conn: conn.execute(sql, params).fetchall())

    def _by_ids(
        self, conn: Any, template: str, ids: Sequence[str], params: Mapping[str, Any]
    ) -> Iterable[Any]:
        """Run `template` once per id chunk; the cursors, in order."""
        for clause, more in self._in(ids):
            yield conn.execute(template.format(in_ids=clause), {**params, **more})

    def _erase(self, user_id: str, fn: Callable[[Any], T], changed: Callable[[T], Any] = bool) -> T:
        """Run a deletion of the user's rows, then `_erased()` unless `changed(result)` is false.

        A deletion whose result does not say whether anything went (a count of the turns
        alone, while memories and values go too) passes `_always`.
        """
        out = self._write((user_id,), fn)
        if changed(out):
            self._erased()
        return out

    def _require_session(self, conn: Any, user_id: str, session_id: str) -> None:
        if conn.execute(self.sql.lock_session, {"u": user_id, "s": session_id}).fetchone() is None:
            raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")

    # -- turns and sessions -----------------------------------------------------------------
    def add_turns(self, turns: Sequence[dict[str, Any]]) -> list[Turn]:
        """Commit turns (dicts with user_id, session_id, role, text, timestamp, turn_id).

        One transaction for all; a duplicate `turn_id` within a session raises
        `InvalidInputError` and commits none of them. No id or text may hold a NUL.
        """
        for t in turns:
            for name in _TURN_FIELDS:
                if "\x00" in (t.get(name) or ""):
                    raise InvalidInputError(f"{name} contains a NUL character (0x00)")

        def write(conn: Any) -> list[Turn]:
            out: list[Turn] = []
            for t in turns:
                ts = text_time(t.get("timestamp"))
                p = {"u": t["user_id"], "s": t["session_id"], "tid": t.get("turn_id"),
                     "role": t["role"], "text": t["text"], "ts": time_text(ts),
                     "crc": text_crc(t["text"]), "now": time_text(self._clock())}  # fmt: skip
                conn.execute(self.sql.open_session, p)
                got = self._insert_turn(conn, p)
                if got is None:
                    raise InvalidInputError(
                        f"turn_id {p['tid']!r} already exists in session {p['s']!r} "
                        f"of user {p['u']!r}"
                    )
                seq, position, turn_id = got
                out.append(Turn(p["u"], p["s"], p["role"], p["text"], turn_id, position, ts, seq))
            return out

        return self._write({t["user_id"] for t in turns}, write)

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """See `MemoryStore.turns`."""
        if session_id is None:
            rows = self._rows(user_id, self.sql.turns_of_user, {"u": user_id})
        else:
            rows = self._rows(user_id, self.sql.turns_of_session, {"u": user_id, "s": session_id})
        return [self._turn(r) for r in rows]

    def session(self, user_id: str, session_id: str) -> SessionInfo | None:
        """See `MemoryStore.session`."""
        rows = self._rows(user_id, self.sql.session, {"u": user_id, "s": session_id})
        return self._session(rows[0]) if rows else None

    def sessions(self, user_id: str, status: str | None = None) -> list[SessionInfo]:
        """See `MemoryStore.sessions`."""
        sql = self.sql.sessions if status is None else self.sql.sessions_with_status
        return [
            self._session(r) for r in self._rows(user_id, sql, {"u": user_id, "status": status})
        ]

    def sessions_missing_turn_units(self, user_id: str | None = None) -> list[tuple[str, str]]:
        """See `TurnUnitAudit.sessions_missing_turn_units`."""
        sql = self.sql.missing_units if user_id is None else self.sql.missing_units_of_user
        return [(r[0], r[1]) for r in self._rows(user_id, sql, {"u": user_id})]

    # -- memories ---------------------------------------------------------------------------
    def _put_memories(
        self,
        conn: Any,
        user_id: str,
        drafts: Sequence[MemoryDraft],
        embeddings: np.ndarray,
        model: str,
    ) -> list[Memory]:
        if len(drafts) != len(embeddings):
            raise InvalidInputError("one embedding per memory is required")
        for d in drafts:
            if any("\x00" in x for x in (d.text, d.key, d.session_id, d.id or "", *d.turn_ids)):
                raise InvalidInputError("memory text, key or ids contain a NUL character (0x00)")
        out: list[Memory] = []
        for d, vec in zip(drafts, embeddings, strict=True):
            mid = d.id if d.id is not None else f"{d.granularity}-{uuid.uuid4().hex[:16]}"
            meta = d.metadata if d.metadata is not None else {}
            row = MemoryRow(user_id, mid, d, meta, np.asarray(vec, np.float32), model)
            created, updated = self._upsert_memory(conn, row)
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
        self._bump_version(conn, user_id)
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
        """See `MemoryStore.replace_session_memories`.

        The session row is locked first, so turns added or deleted concurrently (which take
        it too) either committed before the fence is read or wait until this build commits.
        """
        p = {"u": user_id, "s": session_id, "now": time_text(self._clock())}

        def write(conn: Any) -> list[Memory]:
            self._require_session(conn, user_id, session_id)
            if fence is not None:
                n, top = conn.execute(self.sql.fence, p).fetchone()
                if (int(n), int(top)) != tuple(fence):
                    raise SessionChangedError(
                        f"session {session_id!r} of user {user_id!r} changed during the build"
                    )
            for _ in self._by_ids(conn, self.sql.delete_kinds, list(granularities), p):
                pass
            out = self._put_memories(conn, user_id, drafts, embeddings, embed_model)
            conn.execute(self.sql.end_session, p)
            return out

        return self._write((user_id,), write)

    def upsert_memories(
        self, user_id: str, drafts: Sequence[MemoryDraft], embeddings: np.ndarray, embed_model: str
    ) -> list[Memory]:
        """See `MemoryStore.upsert_memories`."""
        return self._write(
            (user_id,), lambda c: self._put_memories(c, user_id, drafts, embeddings, embed_model)
        )

    def delete_memories(self, user_id: str, ids: Iterable[str]) -> int:
        """Delete memories of a user by id; return how many were deleted."""
        ids = list(ids)
        if not ids:
            return 0

        def write(conn: Any) -> int:
            n = sum(
                c.rowcount
                for c in self._by_ids(conn, self.sql.delete_memories, ids, {"u": user_id})
            )
            self._bump_version(conn, user_id)
            return int(n)

        return self._erase(user_id, write, _always)

    def delete_expired(self, user_id: str, now: float) -> int:
        """See `MemoryStore.delete_expired`."""

        def write(conn: Any) -> int:
            n = conn.execute(self.sql.delete_expired, {"u": user_id, "now_s": float(now)}).rowcount
            if n:
                self._bump_version(conn, user_id)
            return int(n)

        return self._erase(user_id, write)

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """See `MemoryStore.memories`."""
        if ids is None:
            return [
                self._memory(r)
                for r in self._rows(user_id, self.sql.memories_of_user, {"u": user_id})
            ]
        ids = list(ids)

        def read(conn: Any) -> list[Any]:
            p = {"u": user_id}
            return [r for c in self._by_ids(conn, self.sql.memories_by_id, ids, p) for r in c]

        found = {r[0]: self._memory(r) for r in self._read(user_id, read)}
        return [found[i] for i in ids if i in found]

    def update_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """See `MemoryStore.update_metadata` (one transaction; the version is not bumped)."""
        if not updates:
            return 0
        return self._write(
            (user_id,),
            lambda c: sum(self._merge_metadata(c, user_id, m, f) for m, f in updates.items()),
        )

    def embeddings(
        self, user_id: str
    ) -> tuple[list[str], list[str], list[bytes | None], list[str]]:
        """See `MemoryStore.embeddings`."""
        rows = self._vector_rows(user_id, self.sql.embeddings, {"u": user_id})
        keys = checked_keys(user_id, [(r[0], r[1], r[4]) for r in rows])
        return [r[0] for r in rows], keys, [self._blob(r[2]) for r in rows], [r[3] for r in rows]

    def _vector_rows(self, user_id: str, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """The rows of a read holding embeddings (a backend may read them in binary)."""
        return self._rows(user_id, sql, params)

    def _blob(self, value: Any) -> bytes | None:
        """A stored embedding as float32 bytes."""
        return value

    def set_keys(self, user_id: str, ids: Sequence[str], keys: Sequence[str]) -> None:
        """Replace the indexed key of memories (their embeddings are cleared and recomputed)."""
        rows = [
            {"u": user_id, "id": i, "key": k, "crc": text_crc(k), "lex": lexical_text(k)}
            for i, k in zip(ids, keys, strict=True)
        ]

        def write(conn: Any) -> None:
            self._many(conn, self.sql.set_keys, rows)
            self._bump_version(conn, user_id)

        self._write((user_id,), write)

    def version(self, user_id: str) -> int:
        """See `MemoryStore.version`."""
        rows = self._rows(user_id, self.sql.version, {"u": user_id})
        return int(rows[0][0]) if rows else 0

    def count(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions and memories by granularity."""
        p = {"u": user_id}

        def read(conn: Any) -> tuple[int, dict[str, int], dict[str, int]]:
            (n,) = conn.execute(self.sql.count_turns, p).fetchone()
            sess = dict(conn.execute(self.sql.count_sessions, p).fetchall())
            return int(n), sess, dict(conn.execute(self.sql.count_memories, p).fetchall())

        n_turns, sess, mems = self._read(user_id, read)
        return {
            "turns": n_turns,
            "sessions": int(sum(sess.values())),
            "open_sessions": int(sess.get("open", 0)),
            "memories": int(sum(mems.values())),
            "memories_by_granularity": {k: int(v) for k, v in mems.items()},
        }

    def users(self) -> list[str]:
        """See `MemoryStore.users`."""
        return [r[0] for r in self._rows(None, self.sql.users, {})]

    # -- per-turn extra data (adapters keep framework message fields here) ------------------
    def set_turn_extra(
        self, user_id: str, session_id: str, extras: dict[str, dict[str, Any]]
    ) -> None:
        """See `MemoryStore.set_turn_extra`."""
        if not extras:
            return
        rows = [
            {"u": user_id, "s": session_id, "t": tid, "data": json.dumps(data, default=str)}
            for tid, data in extras.items()
        ]
        self._write((user_id,), lambda conn: self._many(conn, self.sql.set_turn_extra, rows))

    def turn_extra(self, user_id: str, session_id: str) -> dict[str, dict[str, Any]]:
        """See `MemoryStore.turn_extra`."""
        rows = self._rows(user_id, self.sql.turn_extra, {"u": user_id, "s": session_id})
        return {r[0]: self._json(r[1]) for r in rows}

    def restore_times(
        self,
        user_id: str,
        sessions: Mapping[str, tuple[datetime, datetime | None]],
        memories: Mapping[str, tuple[datetime, datetime]],
    ) -> None:
        """See `reflective_memory.storage.base.RestoresTimes`."""
        srows = [
            {"u": user_id, "s": s, "created": time_text(c), "ended": time_text(e)}
            for s, (c, e) in sessions.items()
        ]
        mrows = [
            {"u": user_id, "id": m, "created": time_text(c), "updated": time_text(u)}
            for m, (c, u) in memories.items()
        ]

        def write(conn: Any) -> None:
            self._many(conn, self.sql.restore_session_times, srows)
            self._many(conn, self.sql.restore_memory_times, mrows)
            if mrows:
                self._bump_version(conn, user_id)

        self._write((user_id,), write)

    # -- small key/value area for components (reflection reports, adapters' markers) --------
    def get_value(self, key: str) -> Any | None:
        """See `MemoryStore.get_value`."""
        rows = self._rows(_owner(key), self.sql.get_value, {"k": key})
        return self._json(rows[0][0]) if rows else None

    def set_value(self, key: str, value: Any) -> None:
        """See `MemoryStore.set_value`."""
        p = {"k": key, "v": json.dumps(value)}
        owner = _owner(key)
        self._write(None if owner is None else (owner,), lambda c: c.execute(self.sql.set_value, p))

    # -- deletion ---------------------------------------------------------------------------
    def delete_user(self, user_id: str) -> int:
        """See `MemoryStore.delete_user`.

        Every row naming the user goes (turns, sessions, memories, turn extras, its version
        row, its `<namespace>/<user_id>/...` kv rows and whatever else the backend keeps per
        user), and no copy stays in any file of the store when it returns.
        """
        p = {"u": user_id, "p": user_id + "/", "n": len(user_id) + 1}

        def write(conn: Any) -> int:
            n = conn.execute(self.sql.delete_where("turns", "user_id"), p).rowcount
            for table in _USER_TABLES:
                conn.execute(self.sql.delete_where(table, "user_id"), p)
            for sql in (*self.sql.delete_user_extra, self.sql.delete_user_values):
                conn.execute(sql, p)
            return int(n)

        return self._erase(user_id, write, _always)

    def delete_session(self, user_id: str, session_id: str) -> int:
        """See `MemoryStore.delete_session`.

        Removes the session's turns and memories, topic memories that merged it in, and its
        `<namespace>/<user_id>/<session_id>` kv rows.
        """
        p = {"u": user_id, "s": session_id, "p": f"{user_id}/{session_id}"}

        def write(conn: Any) -> int:
            self._require_session(conn, user_id, session_id)
            n = conn.execute(self.sql.delete_where("turns", "user_id", "session_id"), p).rowcount
            for table in _SESSION_TABLES:
                conn.execute(self.sql.delete_where(table, "user_id", "session_id"), p)
            for sql in (self.sql.delete_session_memories, self.sql.delete_session_values):
                conn.execute(sql, p)
            self._bump_version(conn, user_id)
            return int(n)

        return self._erase(user_id, write, _always)

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """See `MemoryStore.delete_turns`.

        Unknown turn ids are ignored. The session keeps its other turns (their positions do not
        change) and its row. Memories that hold a deleted turn's text (units, notes, topics
        citing it) are deleted too; if turns remain the session is marked open, so the next
        `end_session` rebuilds its memories from them.
        """
        p = {"u": user_id, "s": session_id}

        def write(conn: Any) -> list[Turn]:
            self._require_session(conn, user_id, session_id)
            gone = self._delete_turn_rows(conn, user_id, session_id, turn_ids)
            if not gone:
                return []
            ids = [t.turn_id for t in gone]
            for sql in (self.sql.delete_turn_extra, self.sql.delete_turn_memories):
                for _ in self._by_ids(conn, sql, ids, p):
                    pass
            conn.execute(self.sql.recount_session, p)
            self._bump_version(conn, user_id)
            return gone

        return self._erase(user_id, write)
