"""The time of a turn said without one: its conversation's time, or the clock when it is live.

A turn stored without a `timestamp` takes the time of its conversation, so one conversation
never mixes the dates it was said on with the day it was stored:

1. the previous turn's time in its session, when that session is *replayed*; in a live
   session the wall clock (never earlier than the previous turn);
2. for a session's first turns: the first time given to that session later in the same write
   (a log or a file session added in one `add_turns`: a greeting before the first dated
   message);
3. else the user's newest turn's time, when its session is replayed, still open and begun
   within the replay window: a replay going on, turn by turn;
4. else the wall clock: a live chat, a user's first turn, a new session after a replay was
   stored and ended (an import, an ingest, a seeded history).

A session is *replayed* when its first turn's time is more than the replay window away from
the time that turn was stored (the session's `created_at`): a back-dated log, a chat export, a
benchmark conversation. A live chat is stamped as it is stored, so its sessions are never
replayed, and a live session never ends on idle because its turns were back-dated; the
previous turn of a replayed session is never the wall clock, so a replay stays in its time.
The window is `sessions.idle_seconds` (a session silent that long is over anyway), or
`DEFAULT_WINDOW_SECONDS` when idle ending is off. Liveness is read from what the store keeps
(`SessionInfo`), so a turn gets the same time alone or in a batch (rule 2 aside).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reflective_memory.sessions.config import SessionConfig
from reflective_memory.storage.base import MemoryStore, SessionInfo

__all__ = ["ConversationClock", "DEFAULT_WINDOW_SECONDS", "replay_window"]

#: The replay window when `sessions.idle_seconds` is None (the default idle time).
DEFAULT_WINDOW_SECONDS = 1800.0


def replay_window(config: SessionConfig) -> float:
    """Seconds between a session's first time and its storing beyond which it is replayed.

    Example:
        >>> replay_window(SessionConfig(idle_seconds=600)), replay_window(SessionConfig(None))
        (600, 1800.0)
    """
    idle = config.idle_seconds
    return DEFAULT_WINDOW_SECONDS if idle is None else idle


@dataclass
class _Times:
    """What is known of one session's times: its first and last turn's, and when it was stored."""

    first: datetime | None
    last: datetime | None
    stored: datetime
    open: bool = True

    @classmethod
    def of(cls, info: SessionInfo) -> _Times:
        return cls(info.first_time, info.last_time, info.created_at, info.status == "open")

    def replayed(self, window: float) -> bool:
        """Whether the session was dated more than `window` seconds away from its storing."""
        if self.first is None:
            return False
        return abs((self.stored - self.first).total_seconds()) > window


def _latest(sessions: Sequence[_Times | None]) -> _Times | None:
    """The session whose last turn is the newest (None when no session has a time)."""
    best, best_time = None, None
    for t in sessions:
        if t is not None and t.last is not None and (best_time is None or t.last > best_time):
            best, best_time = t, t.last
    return best


class ConversationClock:
    """Stamps the turns of one write that come without a time (see the module docstring).

    Args:
        store: The store of record (sessions are read once per write).
        window: The replay window in seconds (`replay_window`).
        now: The wall clock for this write, timezone-aware.
    """

    def __init__(self, store: MemoryStore, window: float, now: datetime) -> None:
        self.store, self.window, self.now = store, window, now
        self._sessions: dict[tuple[str, str], _Times | None] = {}
        self._stored_newest: dict[str, _Times | None] = {}

    def _session(self, user_id: str, session_id: str) -> _Times | None:
        key = (user_id, session_id)
        if key not in self._sessions:
            info = self.store.session(user_id, session_id)
            self._sessions[key] = None if info is None else _Times.of(info)
        return self._sessions[key]

    def _newest(self, user_id: str) -> _Times | None:
        """The user's session with the newest turn time (this write's turns included)."""
        if user_id not in self._stored_newest:
            stored = [_Times.of(s) for s in self.store.sessions(user_id)]
            self._stored_newest[user_id] = _latest(stored)
        mine = [t for (u, _), t in self._sessions.items() if u == user_id]
        return _latest([self._stored_newest[user_id], *mine])

    def time_for(self, user_id: str, session_id: str, ahead: datetime | None = None) -> datetime:
        """The time a turn of this session said now without its own time is stored at.

        Args:
            user_id: The user.
            session_id: The session.
            ahead: The next time given to this session in the same write, if any.
        """
        own = self._session(user_id, session_id)
        if own is not None and own.last is not None:
            if own.replayed(self.window):
                return own.last
            return max(self.now, own.last)
        if ahead is not None:
            return ahead
        newest = self._newest(user_id)
        if (
            newest is not None
            and newest.last is not None
            and newest.open
            and newest.replayed(self.window)
            and (self.now - newest.stored).total_seconds() <= self.window
        ):
            return newest.last
        return self.now

    def stamp(self, records: Sequence[dict[str, Any]]) -> None:
        """Give every record without a `timestamp` its time, in order (in place).

        Each record is a checked turn (`user_id`, `session_id`, an aware `timestamp` or None);
        a record's time counts for the records after it, as if they were added one by one, and
        a session's first records take the first time given to it later in the write.
        """
        ahead: list[datetime | None] = [None] * len(records)
        upcoming: dict[tuple[str, str], datetime] = {}
        for i in range(len(records) - 1, -1, -1):
            key = (records[i]["user_id"], records[i]["session_id"])
            ahead[i] = upcoming.get(key)
            if records[i]["timestamp"] is not None:
                upcoming[key] = records[i]["timestamp"]
        for r, next_given in zip(records, ahead, strict=True):
            user_id, session_id = r["user_id"], r["session_id"]
            if r["timestamp"] is None:
                r["timestamp"] = self.time_for(user_id, session_id, next_given)
            self._said(user_id, session_id, r["timestamp"])

    def _said(self, user_id: str, session_id: str, ts: datetime) -> None:
        """Account for a turn of this write said at `ts`."""
        times = self._session(user_id, session_id)
        if times is None:
            self._sessions[(user_id, session_id)] = _Times(ts, ts, self.now)
            return
        if times.first is None:
            times.first = ts
        times.last = ts
        times.open = True  # a turn reopens an ended session
