"""Import: the lines of an export written into a store, checked line by line, idempotently.

A user's block of lines is staged, not written, until its `user_end` line has been read and its
counts and checksum match: a malformed line (every record passes the API's own checks,
`reflective_memory.validation`, so a NUL, an empty text or a role that is no speaker label is
refused here, not half-way through a write), a line out of place or an edited block raises
`InvalidFileError` naming the line, and nothing of that user's block is in the store (blocks of
users before it, already verified, stay imported). A block may not name one record twice (a turn
id in its session, a memory id, a session, a value key, a learned state), and a memory's vector
must have the size its model makes: the header's embedder's size for its model, one size per
model otherwise (a cut vector would break every later read of its user).

The staging area is a SQLite file (`staging_folder`): inside the target store's own folder for
an embedded store (same file system, same permissions), else in a private folder of the user's
cache (`$XDG_CACHE_HOME/reflective-memory`, mode 0700), never the system's temporary folder. It
is written with SQLite's `secure_delete`, so a block that is cleared leaves no text in free
pages, and it is locked while an import runs: an import removes the staging files of imports
that died (killed, say) before it starts (`sweep_staging`). Memory stays bounded whatever the
size of a block; the disk holds one block at a time.

What the target already holds is skipped (a turn by session and turn id, a memory by id, a
value or learned state equal to the file's), so importing a file twice adds nothing and an
import stopped half-way (killed, say) finishes when run again. Learned state the
target already holds under the same owner and name is kept, never overwritten.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.jsonfile import FileShape
from reflective_memory.portable.endpoints import Endpoint
from reflective_memory.portable.export import SESSION_VALUE_KEYS, SHARED_OWNERS
from reflective_memory.portable.format import (
    COUNTED,
    Digest,
    check_header,
    check_record,
    decode_vector,
    parse_time,
)
from reflective_memory.storage.base import MemoryDraft, RestoresTimes

__all__ = ["Importer", "ImportReport", "staging_folder", "sweep_staging", "STAGING_PREFIX"]

logger = logging.getLogger(__name__)

_TURN_BATCH = 500
_MEMORY_BATCH = 256
_SESSION_BATCH = 1000
#: The model a memory is stored under until the target's writing has made its vector.
_LATER = "pending"
#: How a staging file's name starts (a hidden file beside the store's database).
STAGING_PREFIX = ".import-staging-"


@dataclass
class ImportReport:
    """What an import wrote and skipped.

    Attributes:
        users: Users met in the file, in order.
        added: Lines written, by kind (`turn`, `memory`, `value`, `state`; `session` counts
            sessions whose state or times were set).
        skipped: Lines whose record the target already held, by kind.
        vectors: Memories written by how their embedding was obtained: `reused` (made by the
            importing embedder, or kept as the file had it when no embedder was given) or
            `recomputed` (embedded again by the importing embedder).
        checksums: Each user's checksum as the file states it (`user_end`).
        embedder: The embedder that wrote the file's vectors, as its header names it.
    """

    users: list[str] = field(default_factory=list)
    added: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    vectors: Counter[str] = field(default_factory=Counter)
    checksums: dict[str, str] = field(default_factory=dict)
    embedder: str | None = None


class Importer:
    """Writes checked export lines into one target (see the module docs).

    Args:
        target: Where to write.
        path: The file's name, for error messages.
        reembed: Embed again with `target.embedder` when another embedder (or none) made the
            file's vector: as the target memory's writing makes them when the target is a
            `ReflectiveMemory` (`Endpoint.vectors`), else from the keys. When False, or without
            an embedder, vectors are stored as the file has them, under the model that made
            them (an index built with another embedder makes them again when it is built).
    """

    def __init__(self, target: Endpoint, *, path: str | Path = "<records>", reembed: bool = True):
        self.target, self.store = target, target.store
        self.shape = FileShape(Path(path))
        #: Where the blocks are staged (see the module docs).
        self.staging = staging_folder(target.store)
        #: The header's embedder: (name, dim), or None.
        self._header_model: tuple[str, int] | None = None
        #: Each model's vector size in the file, and the line that set it.
        self._sizes: dict[str, tuple[int, int]] = {}
        self.embedder = target.embedder if reembed else None
        self.vectors = target.vectors if reembed else None
        self.report = ImportReport()
        self._user: str | None = None
        self._digest = Digest()
        self._stage: _Stage | None = None
        self._turns: list[dict[str, Any]] = []
        self._memories: list[dict[str, Any]] = []
        self._have_turns: set[tuple[str, str]] = set()
        self._extras: dict[str, dict[str, dict[str, Any]]] = {}
        self._ended = False
        self._lines = 0
        self._handlers = {
            "turn": self._turn,
            "memory": self._memory,
            "value": self._value,
            "state": self._state,
        }

    # -- driving ----------------------------------------------------------------------------
    def run(self, records: Iterable[Any]) -> ImportReport:
        """Import parsed lines (the header first); return the report.

        Raises:
            InvalidFileError: A line is malformed, out of place, or the file ends early.
            InvalidInputError: The file carries no vectors and the target has no embedder.
        """
        it = iter(records)
        header = next(it, None)
        if header is None:
            raise self.shape.fail("", "is empty (no header line)")
        header = check_header(self.shape.path, header)
        self._lines = 1
        if header["embedder"] is not None:
            self.report.embedder = header["embedder"]["name"]
            self._header_model = (header["embedder"]["name"], header["embedder"]["dim"])
        if not header["vectors"] and self.target.embedder is None:
            raise InvalidInputError(
                "the file carries no embeddings; import it with an embedder to compute them"
            )
        try:
            for record in it:
                self._lines += 1
                self.feed(check_record(self.shape, f"line {self._lines}", record))
        finally:
            if self._stage is not None:
                self._stage.close()
                self._stage = None
        if not self._ended:
            raise self.shape.fail(
                f"line {self._lines}", "the file ends before its 'end' line (truncated?)"
            )
        logger.info(
            "imported %d users: added %s, skipped %s; vectors %s (the file's by %s)",
            len(self.report.users),
            dict(self.report.added),
            dict(self.report.skipped),
            dict(self.report.vectors),
            self.report.embedder,
        )
        return self.report

    def _fail(self, problem: str) -> Exception:
        return self.shape.fail(f"line {self._lines}", problem)

    def feed(self, record: dict[str, Any]) -> None:
        """Write one checked line (`check_record`) into the target."""
        kind = record["kind"]
        if self._ended:
            raise self._fail("a line after the 'end' line")
        if kind == "user":
            if self._user is not None:
                raise self._fail(f"user {self._user!r} has no 'user_end' line before this one")
            self._start(record["user_id"])
        elif kind == "end":
            if self._user is not None:
                raise self._fail(f"user {self._user!r} has no 'user_end' line")
            if record["users"] != len(self.report.users):
                raise self._fail(
                    f"the file says {record['users']} users but holds {len(self.report.users)}"
                )
            self._ended = True
        elif kind == "state" and self._user is None:
            if record["owner"] not in SHARED_OWNERS:
                raise self._fail(f"state of owner {record['owner']!r} outside its user's lines")
            self._state(record)
        elif self._user is None:
            raise self._fail(f"a {kind} line outside a user's lines")
        elif kind == "user_end":
            self._finish(record)
        else:
            self._digest.add(record)
            self._stage_line(record)

    # -- per user ---------------------------------------------------------------------------
    def _start(self, user_id: str) -> None:
        if user_id in self.report.users:
            raise self._fail(f"user {user_id!r} appears twice")
        self._user, self._digest = user_id, Digest()
        self.report.users.append(user_id)
        if self._stage is None:
            sweep_staging(self.staging)
            self._stage = _Stage(self.staging)
        self._stage.clear()

    def _stage_line(self, record: dict[str, Any]) -> None:
        """Check what one line can tell of its place in the block, then stage it (no write)."""
        user, kind = self._user, record["kind"]
        assert user is not None and self._stage is not None
        session = record.get("session_id")
        if kind == "value":
            session = _value_session(user, record["key"])
            if session is None:
                raise self._fail(
                    f"value key {record['key'][:80]!r} is not one of user {user!r}'s sessions"
                )
        elif kind == "state" and record["owner"] != user:
            raise self._fail(
                f"state of owner {record['owner']!r} inside the lines of user {user!r}"
            )
        elif kind == "memory" and record.get("vector") is not None:
            self._check_size(record["model"], record["vector"])
        earlier = self._stage.add(kind, session, self._lines, record)
        if earlier is not None:
            raise self._fail(
                f"this {kind} line repeats {_named(record)} of line {earlier} (a block names "
                "each record once; the file was edited?)"
            )

    def _check_size(self, model: str, vector: str) -> None:
        """A memory's vector has the size its model makes (the header's, or the file's first)."""
        size = len(base64.b64decode(vector)) // 4
        if self._header_model is not None and model == self._header_model[0]:
            want, why = self._header_model[1], f"the header's embedder {model!r} makes"
        elif model in self._sizes:
            want, line = self._sizes[model]
            why = f"line {line} gave {model!r}"
        else:
            self._sizes[model] = (size, self._lines)
            return
        if size != want:
            raise self.shape.fail(
                f"line {self._lines}.vector",
                f"holds {size} floats, but {why} {want}: a vector cut or edited",
            )

    def _turn(self, record: dict[str, Any]) -> None:
        self._turns.append(record)
        if len(self._turns) >= _TURN_BATCH:
            self._flush_turns()

    def _memory(self, record: dict[str, Any]) -> None:
        if self._turns:  # a user's turns go in before the memories built from them
            self._flush_turns()
        self._memories.append(record)
        if len(self._memories) >= _MEMORY_BATCH:
            self._flush_memories()

    def _value(self, record: dict[str, Any]) -> None:
        if self.store.get_value(record["key"]) == record["value"]:
            self.report.skipped["value"] += 1
            return
        self.store.set_value(record["key"], record["value"])
        self.report.added["value"] += 1

    def _state(self, record: dict[str, Any]) -> None:
        owner, name = record["owner"], record["name"]
        if self._user is not None and owner != self._user:
            raise self._fail(f"state of owner {owner!r} inside the lines of user {self._user!r}")
        state = self.target.state
        if state is None:
            logger.warning("the target keeps no learned state: %s/%s not imported", owner, name)
            self.report.skipped["state"] += 1
            return
        data = base64.b64decode(record["data"])
        got = state.get(owner, name)
        if got is not None:
            if got[1] != data:
                logger.warning("kept the target's own learned state %s/%s", owner, name)
            self.report.skipped["state"] += 1
            return
        state.update(owner, name, lambda _v, old: data if old is None else old)
        self.report.added["state"] += 1

    def _finish(self, record: dict[str, Any]) -> None:
        user = self._user
        if record["user_id"] != user:
            raise self._fail(f"'user_end' of {record['user_id']!r} closes the lines of {user!r}")
        counts = {k: self._digest.counts.get(k, 0) for k in COUNTED}
        if record["counts"] != counts or record["checksum"] != self._digest.hexdigest():
            raise self._fail(
                f"the lines of user {user!r} do not match their count or checksum "
                f"(file says {record['counts']}, read {counts}): the file was cut or edited; "
                "nothing of this user's lines was written"
            )
        assert user is not None and self._stage is not None
        orphan = self._stage.orphan_value()
        if orphan is not None:
            line, key = orphan
            raise self.shape.fail(
                f"line {line}", f"value key {key[:80]!r} is not one of user {user!r}'s sessions"
            )
        self._commit(user, self._stage)
        self.report.checksums[user] = record["checksum"]  # type: ignore[index]
        self._user = None

    def _commit(self, user: str, stage: _Stage) -> None:
        """Write a verified block.

        Turns, memories, values and state go in file order, then the sessions' states and times
        (a session needs its turns stored first).
        """
        self._have_turns = {(t.session_id, t.turn_id) for t in self.store.turns(user)}
        self._extras = {}
        for record in stage.lines(session=False):
            self._handlers[record["kind"]](record)
        self._flush_turns()
        self._flush_memories()
        have = {info.session_id: info for info in self.store.sessions(user)}
        batch: list[dict[str, Any]] = []
        empty = 0
        for record in stage.lines(session=True):
            batch.append(record)
            if len(batch) >= _SESSION_BATCH:
                empty += self._apply_sessions(batch, have)
                batch = []
        empty += self._apply_sessions(batch, have)
        if empty:
            logger.warning("%d sessions of user %r have no turns: not imported", empty, user)

    # -- writing ----------------------------------------------------------------------------
    def _flush_turns(self) -> None:
        user, batch, self._turns = self._user, self._turns, []
        assert user is not None
        new = []
        for r in batch:
            key = (r["session_id"], r["turn_id"])
            if key in self._have_turns:
                self.report.skipped["turn"] += 1
                continue
            self._have_turns.add(key)
            new.append(
                {
                    "user_id": user,
                    "session_id": r["session_id"],
                    "turn_id": r["turn_id"],
                    "role": r["role"],
                    "text": r["text"],
                    "timestamp": parse_time(r.get("timestamp")),
                }
            )
        if new:
            self.store.add_turns(new)
            self.report.added["turn"] += len(new)
        extras: dict[str, dict[str, dict[str, Any]]] = {}
        for r in batch:
            extra = r.get("extra")
            if extra is None:
                continue
            s = r["session_id"]
            if s not in self._extras:
                self._extras[s] = self.store.turn_extra(user, s)
            if self._extras[s].get(r["turn_id"]) != extra:
                extras.setdefault(s, {})[r["turn_id"]] = extra
                self._extras[s][r["turn_id"]] = extra
        for s, by_turn in extras.items():
            self.store.set_turn_extra(user, s, by_turn)

    def _vectors(self, new: list[dict[str, Any]]) -> list[tuple[np.ndarray, str]]:
        """The embedding and model of each new memory: the file's, or re-embedded."""
        emb = self.embedder
        out: list[tuple[np.ndarray, str] | None] = []
        again: list[int] = []
        for i, r in enumerate(new):
            vec = None if r.get("vector") is None else decode_vector(r["vector"])
            if vec is not None and (
                emb is None or (r["model"] == emb.name and len(vec) == int(emb.dim))
            ):
                out.append((vec, r["model"]))
                self.report.vectors["reused"] += 1
            else:
                out.append(None)
                again.append(i)
        if again and self.vectors is not None:  # made once the memories are stored
            assert emb is not None
            for i in again:
                out[i] = (np.zeros(emb.dim, np.float32), _LATER)
        elif again:
            assert emb is not None  # checked at the header: no vectors needs an embedder
            mat = np.asarray(emb.encode([new[i]["key"] for i in again]), dtype=np.float32)
            for i, vec in zip(again, mat, strict=True):
                out[i] = (vec, emb.name)
            self.report.vectors["recomputed"] += len(again)
            logger.info("re-embedded %d memory keys with %s", len(again), emb.name)
        return [v for v in out if v is not None]

    def _vectors_later(self, user: str, stored: list[MemoryDraft]) -> None:
        """Make the vectors of memories stored under `_LATER` as the target's writing makes them.

        Until then they carry no vector of the target's embedder, so an index build would
        make them too (as the same writing does) if this is cut short.
        """
        if not stored or self.vectors is None or self.embedder is None:
            return
        ids, keys = [d.id or "" for d in stored], [d.key for d in stored]
        vecs = np.asarray(self.vectors(user, ids, keys), dtype=np.float32)
        self.store.set_embeddings(user, ids, vecs, self.embedder.name)
        self.report.vectors["recomputed"] += len(ids)
        logger.info("made %d memory vectors with %s", len(ids), self.embedder.name)

    def _flush_memories(self) -> None:
        user, batch, self._memories = self._user, self._memories, []
        assert user is not None
        if not batch:
            return
        have = {m.id: m for m in self.store.memories(user, [r["id"] for r in batch])}
        new = [r for r in batch if r["id"] not in have]
        if len(new) < len(batch):
            self.report.skipped["memory"] += len(batch) - len(new)
        by_model: dict[str, tuple[list[MemoryDraft], list[np.ndarray]]] = {}
        for r, (vec, model) in zip(new, self._vectors(new), strict=True):
            drafts, vecs = by_model.setdefault(model, ([], []))
            drafts.append(_draft(r))
            vecs.append(vec)
        for model, (drafts, vecs) in by_model.items():
            dims = {len(v) for v in vecs}
            for dim in sorted(dims):  # one matrix per vector size
                pick = [i for i, v in enumerate(vecs) if len(v) == dim]
                self.store.upsert_memories(
                    user, [drafts[i] for i in pick], np.stack([vecs[i] for i in pick]), model
                )
        self._vectors_later(user, by_model.get(_LATER, ([], []))[0])
        if new:
            self.report.added["memory"] += len(new)
        if isinstance(self.store, RestoresTimes):
            times = {}
            for r in batch:
                want = (parse_time(r["created_at"]), parse_time(r["updated_at"]))
                old = have.get(r["id"])
                if old is None or (old.created_at, old.updated_at) != want:
                    times[r["id"]] = want
            if times:
                self.store.restore_times(user, {}, times)  # type: ignore[arg-type]

    def _apply_sessions(self, records: list[dict[str, Any]], have: dict[str, Any]) -> int:
        """Set the states and times of `records`' sessions; return how many have no turns."""
        user = self._user
        assert user is not None
        times: dict[str, tuple[datetime, datetime | None]] = {}
        empty = 0
        for r in records:
            s = r["session_id"]
            info = have.get(s)
            if info is None:
                self.report.skipped["session"] += 1
                empty += 1
                continue
            changed = False
            if r["status"] == "ended" and info.status != "ended":
                self.store.replace_session_memories(
                    user, s, (), [], np.zeros((0, 1), np.float32), ""
                )
                changed = True
            elif r["status"] == "open" and info.status != "open":
                logger.warning("session %r of user %r is ended in the target: kept so", s, user)
            want = (parse_time(r["created_at"]), parse_time(r.get("ended_at")))
            if isinstance(self.store, RestoresTimes) and (
                changed or (info.created_at, info.ended_at) != want
            ):
                times[s] = want  # type: ignore[assignment]
                changed = True
            (self.report.added if changed else self.report.skipped)["session"] += 1
        if times:
            self.store.restore_times(user, times, {})  # type: ignore[attr-defined]
        return empty


def _value_session(user: str, key: str) -> str | None:
    """The session of `user` whose value `key` is (`SESSION_VALUE_KEYS`), or None."""
    candidates = []
    prefix = f"rmm.reflection/{user}/"
    if key.startswith(prefix):
        candidates.append(key[len(prefix) :])
    marks = "llamaindex_reflective:marks:"
    if key.startswith(marks):
        try:
            pair = json.loads(key[len(marks) :])
        except ValueError:
            pair = None
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str):
            candidates.append(pair[1])
    for session in candidates:
        if any(key_of(user, session) == key for key_of in SESSION_VALUE_KEYS):
            return session
    return None


def staging_folder(store: Any) -> Path:
    """Where an import into `store` stages its blocks (see the module docs).

    The folder of an embedded store's database; else (PostgreSQL, an in-memory store) the
    private folder `reflective-memory` of the user's cache (`$XDG_CACHE_HOME`, else
    `~/.cache`), created with mode 0700.
    """
    from reflective_memory.storage.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore) and store.path is not None:
        return store.path.parent
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    folder = (Path(cache) if cache else Path.home() / ".cache") / "reflective-memory"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def sweep_staging(folder: Path) -> int:
    """Remove the staging files of imports that died (their lock is free); return how many.

    A running import holds its staging file's lock, so its file is left alone. Without
    `fcntl` (Windows) nothing is removed.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return 0
    removed = 0
    for path in sorted(folder.glob(STAGING_PREFIX + "*")):
        try:
            with path.open("rb") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink()
                removed += 1
        except OSError:  # held by a running import, or gone meanwhile
            continue
    if removed:
        logger.warning(
            "removed %d staging files of imports that stopped half-way from %s", removed, folder
        )
    return removed


def _named(record: dict[str, Any]) -> str:
    """The record a line names, in words (for the error of a repeated one)."""
    kind = record["kind"]
    if kind == "turn":
        return f"turn {record['turn_id']!r} of session {record['session_id']!r}"
    if kind == "memory":
        return f"memory {record['id']!r}"
    if kind == "session":
        return f"session {record['session_id']!r}"
    if kind == "value":
        return f"value {record['key'][:80]!r}"
    return f"state {record['owner']!r}/{record['name']!r}"


def _identity(record: dict[str, Any]) -> str:
    """What a line names: two lines of a block naming the same are one record written twice."""
    kind = record["kind"]
    keys = {
        "turn": ("session_id", "turn_id"),
        "memory": ("id",),
        "session": ("session_id",),
        "value": ("key",),
        "state": ("owner", "name"),
    }[kind]
    return json.dumps([kind, *(record[k] for k in keys)], ensure_ascii=False)


class _Stage:
    """A user block's checked lines, on disk until it is verified (see the module docs).

    Args:
        folder: Where the staging file is made (`staging_folder`).
    """

    def __init__(self, folder: Path) -> None:
        fd, self.path = tempfile.mkstemp(prefix=STAGING_PREFIX, suffix=".sqlite3", dir=folder)
        self._lock = os.fdopen(fd, "rb")  # held open: its lock says this import is alive
        try:
            import fcntl

            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not on POSIX
            pass
        self.db = sqlite3.connect(self.path)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA secure_delete=ON")  # cleared blocks leave no text behind
        self.db.execute(
            "CREATE TABLE line (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, session TEXT, "
            "at INTEGER NOT NULL, ident TEXT NOT NULL UNIQUE, body TEXT NOT NULL)"
        )

    def clear(self) -> None:
        """Forget the staged lines (a new block)."""
        self.db.execute("DROP INDEX IF EXISTS line_session")
        self.db.execute("DELETE FROM line")

    def add(self, kind: str, session: str | None, at: int, record: dict[str, Any]) -> int | None:
        """Stage one line (`at`: its line number); the earlier line naming the same, if any."""
        body = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        ident = _identity(record)
        try:
            self.db.execute(
                "INSERT INTO line (kind, session, at, ident, body) VALUES (?, ?, ?, ?, ?)",
                (kind, session, at, ident, body),
            )
        except sqlite3.IntegrityError:
            row = self.db.execute("SELECT at FROM line WHERE ident = ?", (ident,)).fetchone()
            return int(row[0])
        return None

    def orphan_value(self) -> tuple[int, str] | None:
        """(line, key) of a value whose session has no session line in the block, if any."""
        self.db.execute("CREATE INDEX IF NOT EXISTS line_session ON line (kind, session)")
        row = self.db.execute(
            "SELECT v.at, v.body FROM line v WHERE v.kind = 'value' AND NOT EXISTS "
            "(SELECT 1 FROM line s WHERE s.kind = 'session' AND s.session = v.session) "
            "ORDER BY v.seq LIMIT 1"
        ).fetchone()
        return None if row is None else (row[0], json.loads(row[1])["key"])

    def lines(self, *, session: bool) -> Iterator[dict[str, Any]]:
        """The staged session lines (`session`) or all the others, in file order."""
        op = "=" if session else "!="
        cursor = self.db.execute(f"SELECT body FROM line WHERE kind {op} 'session' ORDER BY seq")
        while rows := cursor.fetchmany(500):
            for (body,) in rows:
                yield json.loads(body)

    def close(self) -> None:
        """Close and delete the staging file."""
        self.db.close()
        Path(self.path).unlink(missing_ok=True)
        self._lock.close()


def _draft(r: dict[str, Any]) -> MemoryDraft:
    return MemoryDraft(
        session_id=r["session_id"],
        granularity=r["granularity"],
        text=r["text"],
        key=r["key"],
        turn_ids=tuple(r["turn_ids"]),
        start_time=parse_time(r.get("start_time")),
        end_time=parse_time(r.get("end_time")),
        metadata=r["metadata"],
        id=r["id"],
    )
