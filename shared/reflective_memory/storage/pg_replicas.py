"""Reads on PostgreSQL hot standbys, with read-your-writes by WAL position.

`PgRoutes` is where `PostgresStore`, its search (`PgSearch`) and its state store
(`DatabaseStateStore`) run their transactions: `write` on the primary, `read` on a read
replica (a hot standby streaming from the primary) when the store was given `read_dsn`, else
on the primary too.

Read-your-writes. After a write commits, a WAL position at or past the end of its commit record
is kept for each user the write named (`WritePositions`): the primary's insert position
(`pg_current_wal_insert_lsn()`; just past a page header it stands for the page boundary,
`record_end`), or its flush position when that is lower and commits are flushed before they
return (`synchronous_commit` other than `off`), so a read never waits for WAL that other
sessions inserted later and the WAL writer has not flushed yet. A later read for that user
goes to a replica only once the replica has replayed up to it (`pg_last_wal_replay_lsn()`):
the read waits for that at most `read_wait` seconds, polling, and otherwise reads from the
primary. So a turn this process
stored is found by its next `retrieve` on a replica, every time. Writes made by other
processes are seen once the replica has replayed them (streaming replication is asynchronous
to readers), as they would be seen a moment later on the primary.

A replica that cannot be reached (or refuses the read: a conflict with recovery) is skipped
and the read goes to the primary; an unreachable replica is left alone for `RETRY_AFTER_S`
seconds. Nothing of this is silent: every read a call makes is noted in its
`reflective_memory.storage.reads` log (`retrieve` reports it as `diagnostics["reads"]`:
the server that answered each read, the time waited, and why a read left the replicas).

The reads of one call (a `retrieve`) stay on the replica they started on while it serves
them, so the call sees one consistent, never older, state.

Needs the `postgres` extra: `pip install 'reflective-memory[postgres]'`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from reflective_memory.errors import ConfigError, StoreUnavailableError
from reflective_memory.storage.bridge import await_io, bridged
from reflective_memory.storage.pg_database import PgDatabase
from reflective_memory.storage.reads import current_reads, note_read

__all__ = [
    "READ_WAIT_S",
    "RETRY_AFTER_S",
    "PgRoutes",
    "Replica",
    "WritePositions",
    "lsn_value",
    "record_end",
    "server_name",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Default of `PostgresStore(read_wait=...)`: most seconds a read waits for a replica to replay
#: this process's last write (see BENCHMARKS.md, "Read replicas", for the waits measured).
READ_WAIT_S = 0.05
#: Seconds an unreachable replica is left alone before a read tries it again.
RETRY_AFTER_S = 5.0
#: First and longest pause between two checks of a replica's replay position (seconds).
_POLL_FIRST_S, _POLL_MOST_S = 0.0005, 0.008
#: Users whose write positions are kept before the oldest are folded into one floor.
_MAX_TRACKED = 50_000

_WRITTEN_LSN = (
    "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text,"
    " current_setting('synchronous_commit') <> 'off'"
)
_WAL_SIZES = (
    "SELECT current_setting('wal_block_size')::bigint,"
    " (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size')"
)
# The page headers of WAL (a segment's first page has the long one), in bytes.
_SHORT_HEADER, _LONG_HEADER = 24, 40
# A promoted replica (no longer in recovery) has everything it ever received.
_REPLAYED_LSN = (
    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
    " ELSE pg_current_wal_insert_lsn() END)::text"
)

_PRIMARY_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "reflective_memory_primary_reads", default=False
)


def lsn_value(text: str | None) -> int:
    """A WAL position (`'16/B374D848'`) as an int (0 for None)."""
    if not text:
        return 0
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def record_end(lsn: int, block: int, segment: int) -> int:
    """The end of the last WAL record inserted when the insert position is `lsn`.

    An insert position just past a page's header means the record before it ended at the
    page boundary: a standby replays up to the boundary, never past the header, until the
    next record arrives.

    Args:
        lsn: `pg_current_wal_insert_lsn()` as an int.
        block: `wal_block_size` (bytes).
        segment: `wal_segment_size` (bytes).
    """
    if lsn % segment == _LONG_HEADER:
        return lsn - _LONG_HEADER
    if lsn % block == _SHORT_HEADER:
        return lsn - _SHORT_HEADER
    return lsn


def server_name(role: str, conn: Any) -> str:
    """`"<role> <host>:<port>"` of the server `conn` is connected to."""
    info = getattr(conn, "info", None)
    host = getattr(info, "host", None) or "?"
    return f"{role} {host}:{getattr(info, 'port', '?')}"


class WritePositions:
    """The WAL position each user's reads must see: the last write this process made for them.

    Reads that name no user must see every write (`top`). Positions already replayed by every
    replica are forgotten; beyond `limit` users, the oldest positions are folded into one
    floor every read waits for (conservative: a read may wait for a newer position, never an
    older one).

    Args:
        limit: Most users kept apart.
    """

    def __init__(self, limit: int = _MAX_TRACKED) -> None:
        self._by_user: dict[str, int] = {}
        self._floor = 0
        self._top = 0
        self._limit = limit
        self._lock = threading.Lock()

    def wrote(self, user_ids: Collection[str] | None, lsn: int) -> None:
        """Record a write committed at `lsn` for these users (None: no user in particular)."""
        with self._lock:
            self._top = max(self._top, lsn)
            if user_ids is None:
                self._floor = max(self._floor, lsn)
                return
            for u in user_ids:
                self._by_user.pop(u, None)  # re-inserted last: the dict stays in write order
                self._by_user[u] = lsn
            if len(self._by_user) > self._limit:
                for u in list(itertools.islice(self._by_user, len(self._by_user) // 2)):
                    self._floor = max(self._floor, self._by_user.pop(u))

    def need(self, user_id: str | None) -> int:
        """The position a read for `user_id` (None: any user) must see."""
        with self._lock:
            if user_id is None:
                return self._top
            return max(self._floor, self._by_user.get(user_id, 0))

    def replayed(self, lsn: int) -> None:
        """Every replica has replayed up to `lsn`: forget the users whose writes it covers.

        Users are kept in the order of their last write, so the ones covered come first; the
        scan stops at the first one that is not (one recorded a little out of order stays a
        while longer, which costs nothing but room).
        """
        with self._lock:
            for u in list(itertools.takewhile(lambda u: self._by_user[u] <= lsn, self._by_user)):
                del self._by_user[u]

    def __len__(self) -> int:
        return len(self._by_user)


class Replica:
    """One read replica: its connections, the replay position last seen, its health.

    Args:
        db: Its connections (`PgDatabase` of the replica's URI).
    """

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self.seen = 0
        self.down_until = 0.0
        self.why_down = ""

    def usable(self, now: float) -> bool:
        """Whether reads may try it (not marked unreachable, or the pause is over)."""
        return now >= self.down_until


class PgRoutes:
    """The transactions of a PostgreSQL store: writes on the primary, reads on replicas.

    Args:
        primary: The primary's connections.
        replicas: Read replicas' connections (empty: every read goes to the primary).
        read_wait: Most seconds a read waits for a replica to replay this process's last
            write for its user before it reads from the primary instead.

    Raises:
        ConfigError: `read_wait` is negative or not a number.
    """

    def __init__(
        self,
        primary: PgDatabase,
        replicas: Sequence[PgDatabase] = (),
        *,
        read_wait: float = READ_WAIT_S,
    ) -> None:
        if isinstance(read_wait, bool) or not isinstance(read_wait, (int, float)) or read_wait < 0:
            raise ConfigError(f"read_wait must be a number of seconds >= 0, got {read_wait!r}")
        self.primary = primary
        self.replicas = [Replica(db) for db in replicas]
        self.read_wait = float(read_wait)
        self.positions = WritePositions()
        self._next = itertools.count()
        self._wal_sizes: tuple[int, int] | None = None

    # -- writes -----------------------------------------------------------------------------
    def write(self, user_ids: Collection[str] | None, fn: Callable[[Any], T]) -> T:
        """Run `fn(conn)` in a transaction on the primary; note its WAL position for the reads.

        Args:
            user_ids: The users the write touches (None: no user in particular; every later
                read then waits for it).
            fn: The statements.
        """
        with self.primary.connection() as conn:
            try:
                with self.primary.begin(conn):
                    out = fn(conn)
            except Exception:
                # A write refused for what the primary holds (a turn id already taken, e.g. by
                # a retry of a write whose answer was lost) makes the reads that follow see
                # the primary as it is now, so the caller can find what refused it.
                if self.replicas:
                    self._wrote_quietly(user_ids, conn)
                raise
            if self.replicas:
                self.wrote(user_ids, conn)
        return out

    def _wrote_quietly(self, user_ids: Collection[str] | None, conn: Any) -> None:
        try:
            self.wrote(user_ids, conn)
        except Exception as exc:  # noqa: BLE001 - the write's own error is the one to raise
            logger.debug("no WAL position after a failed write: %s", exc)

    def wrote(self, user_ids: Collection[str] | None, conn: Any) -> None:
        """Note the primary's WAL position (read on `conn`, after a commit) for these users."""
        with conn.transaction():
            if self._wal_sizes is None:
                self._wal_sizes = tuple(conn.execute(_WAL_SIZES).fetchone())
            inserted, flushed, durable = conn.execute(_WRITTEN_LSN).fetchone()
        end = record_end(lsn_value(inserted), *self._wal_sizes)
        if durable:  # the commit returned once flushed: no need to wait for WAL inserted since
            end = min(end, lsn_value(flushed))
        self.positions.wrote(None if user_ids is None else set(user_ids), end)

    @contextmanager
    def primary_reads(self) -> Iterator[None]:
        """Send every read made inside the block to the primary (e.g. under a build lock)."""
        token = _PRIMARY_ONLY.set(True)
        try:
            yield
        finally:
            _PRIMARY_ONLY.reset(token)

    # -- reads ------------------------------------------------------------------------------
    def read(
        self, user_id: str | None, fn: Callable[[Any], T], *, repeatable_read: bool = False
    ) -> T:
        """Run `fn(conn)` in a read transaction on a replica that has this process's writes.

        Args:
            user_id: Whose data is read (the read sees every write this process made for
                them); None: no user in particular (the read sees every write).
            fn: The statements (only reads: a replica refuses writes).
            repeatable_read: Read every statement from one snapshot.
        """
        if not self.replicas or _PRIMARY_ONLY.get():
            return self._on_primary(fn, repeatable_read, None)
        need = self.positions.need(user_id)
        log = current_reads()
        if log is not None and log.behind is not None and need >= log.behind:
            return self._on_primary(fn, repeatable_read, None)  # the call waited once already
        deadline = time.monotonic() + self.read_wait
        why = None
        for replica in self._choices():
            try:
                got = self._on_replica(replica, need, deadline, fn, repeatable_read)
            except StoreUnavailableError as exc:
                why = self._failed(replica, exc)
                continue
            if got is not None:
                return got[0]
            why = (
                f"{replica.db.dsn_label} had not replayed this process's last write after "
                f"{self.read_wait * 1000:.0f} ms"
            )
            if log is not None:
                log.behind = need
        return self._on_primary(fn, repeatable_read, why or self._none_usable())

    def _none_usable(self) -> str:
        """Why no replica was tried: the ones left alone and why."""
        now = time.monotonic()
        down = [
            f"{r.why_down}, tried again in {max(0.0, r.down_until - now):.1f} s"
            for r in self.replicas
            if not r.usable(now)
        ]
        return "; ".join(down) or "no read replica is usable"

    def _choices(self) -> list[Replica]:
        """Usable replicas to try, the call's pinned one first, then in turn."""
        now = time.monotonic()
        usable = [r for r in self.replicas if r.usable(now)]
        if not usable:
            return []
        start = next(self._next) % len(usable)
        order = usable[start:] + usable[:start]
        log = current_reads()
        pinned = None if log is None else log.pinned
        if pinned in order:
            order.remove(pinned)
            order.insert(0, pinned)
        return order

    def _on_replica(
        self,
        replica: Replica,
        need: int,
        deadline: float,
        fn: Callable[[Any], T],
        repeatable_read: bool,
    ) -> tuple[T] | None:
        """`(fn(conn),)` read on `replica` once it has replayed `need`; None if it did not."""
        with replica.db.connection() as conn:
            t0 = time.monotonic()
            if need > replica.seen and not self._caught_up(replica, conn, need, deadline):
                return None
            waited = time.monotonic() - t0
            with replica.db.begin(conn, repeatable_read=repeatable_read):
                out = fn(conn)
            log = current_reads()
            if log is not None:
                log.pinned = replica
            note_read(server_name("replica", conn), waited_s=waited)
        return (out,)

    def _caught_up(self, replica: Replica, conn: Any, need: int, deadline: float) -> bool:
        """Wait (until `deadline`) for `replica` to replay `need`; whether it did."""
        pause = _POLL_FIRST_S
        while True:
            (text,) = conn.execute(_REPLAYED_LSN).fetchone()
            conn.rollback()  # the read runs in a transaction of its own, with a new snapshot
            replica.seen = max(replica.seen, lsn_value(text))
            if replica.seen >= need:
                self._forget_replayed()
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MOST_S)

    def _forget_replayed(self) -> None:
        self.positions.replayed(min(r.seen for r in self.replicas))

    def _failed(self, replica: Replica, exc: StoreUnavailableError) -> str:
        """Mark `replica` unreachable unless the read itself was refused; say why."""
        cause = exc.__cause__
        refused = self.primary.psycopg.errors.TransactionRollback
        if isinstance(cause, refused):  # a conflict with recovery: the replica is fine
            return f"{replica.db.dsn_label} cancelled the read ({cause})"
        replica.down_until = time.monotonic() + RETRY_AFTER_S
        replica.why_down = f"{replica.db.dsn_label} is unreachable ({cause or exc})"
        logger.warning(
            "read replica %s; reads go to the primary for %.0f s", replica.why_down, RETRY_AFTER_S
        )
        return replica.why_down

    def _on_primary(self, fn: Callable[[Any], T], repeatable_read: bool, why: str | None) -> T:
        with self.primary.connection() as conn:
            with self.primary.begin(conn, repeatable_read=repeatable_read):
                out = fn(conn)
            if self.replicas:
                note_read(server_name("primary", conn), why=why)
        return out

    # -- lifetime ---------------------------------------------------------------------------
    def open(self) -> None:
        """Start connecting the replicas' pools.

        In the background: a replica that is down is found, and skipped, by the first read
        that needs it.
        """
        for replica in self.replicas:
            replica.db.open(wait=False)

    def close(self) -> None:
        """Close the replicas' pools (the primary's belongs to the store)."""
        for replica in self.replicas:
            replica.db.close()


def _sleep(seconds: float) -> None:
    """Pause: on the event loop inside a bridged call, else in this thread."""
    if bridged():
        await_io(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)
