"""Which servers answered a call's reads: a log that a store with several servers fills.

A call that wants to say where its data came from (a `retrieve`, for its diagnostics) opens
`reads_of_call()`; a store that routes reads between servers (PostgreSQL with read replicas,
`reflective_memory.storage.pg_replicas`) notes every read in the open log with `note_read`, and
why a read did not go where it would have. A store with one server notes nothing, and code
outside such a call pays nothing. The log lives in a context variable, so it follows the call
into a bridged coroutine (`reflective_memory.storage.bridge`) and never crosses to another
thread's call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReadLog", "current_reads", "note_read", "reads_of_call"]

#: Most notes kept per call (a retry storm must not grow a call's diagnostics without bound).
_MAX_NOTES = 8


@dataclass
class ReadLog:
    """The reads of one call.

    Attributes:
        servers: Reads per server, named `"<role> <host>:<port>"` (role `primary` or
            `replica`).
        waited_ms: Time spent waiting for a replica to replay this process's writes.
        notes: Why reads went to the primary instead of a replica (lag, an unreachable
            replica), at most a few.
        pinned: The replica the call's reads go to while it stays usable (set by the store).
        behind: The write position the call's replicas did not reach in time (set by the
            store): the call's later reads that need it go to the primary without waiting.
    """

    servers: Counter[str] = field(default_factory=Counter)
    waited_ms: float = 0.0
    notes: list[str] = field(default_factory=list)
    pinned: Any = None
    behind: int | None = None

    def note(self, text: str) -> None:
        """Add a note (the first few of a call are kept, each once)."""
        if text not in self.notes and len(self.notes) < _MAX_NOTES:
            self.notes.append(text)

    def summary(self) -> dict[str, Any]:
        """The log as diagnostics: `servers`, `waited_ms` and `notes` (when there are any)."""
        out: dict[str, Any] = {
            "servers": dict(self.servers),
            "waited_ms": round(self.waited_ms, 3),
        }
        if self.notes:
            out["notes"] = list(self.notes)
        return out


_LOG: ContextVar[ReadLog | None] = ContextVar("reflective_memory_reads", default=None)


def current_reads() -> ReadLog | None:
    """The log of the call running now, or None outside `reads_of_call`."""
    return _LOG.get()


@contextmanager
def reads_of_call() -> Iterator[ReadLog]:
    """Log the reads made inside the block (an enclosing call's log is shared, not replaced)."""
    outer = _LOG.get()
    if outer is not None:
        yield outer
        return
    log = ReadLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def note_read(server: str, *, waited_s: float = 0.0, why: str | None = None) -> None:
    """Record one read answered by `server` in the open log (nothing outside a call).

    Args:
        server: `"<role> <host>:<port>"` of the server that answered.
        waited_s: Seconds this read waited for a replica to catch up.
        why: Why the read went to this server instead of a replica, if it did.
    """
    log = _LOG.get()
    if log is None:
        return
    log.servers[server] += 1
    log.waited_ms += waited_s * 1000.0
    if why is not None:
        log.note(why)
