"""`SessionConfig`: when open sessions end, and what a turn may hold."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.settings import check_bool, check_int, check_number

__all__ = ["SessionConfig"]


@dataclass(frozen=True)
class SessionConfig:
    """When a session ends (and becomes memories) and the largest turn accepted.

    Turns are searchable at once, before their session ends; ending it adds segment, topic and
    note memories.

    Attributes:
        max_turns: A session is ended automatically once it has this many turns, and again at
            every further this many turns (`None`: never).
        idle_seconds: Open sessions of a user whose last turn is older than this (by turn
            timestamps) are ended when that user adds a turn to another session, and opening a
            store directory ends open sessions idle longer than this by the clock (`None`:
            never). Its default is also the silence that cuts a chat log without session ids
            into sessions (`reflective_memory.io.load_conversations`).
        end_on_new_session: A user's first turn in a new session ends that user's other open
            sessions (the conversation moved on), on every surface alike. Turns added later to
            an ended session reopen it; its memories are rebuilt when it ends again.
        max_text_chars: Longest accepted turn text (longer raises `InvalidInputError`).
        conversation_starts: Where a session whose log gave no times (a log imported without
            session ids or times) holds several conversations: `learned`, a model of each gap
            between turns fitted on the dev sets' session starts (`sessions.starts`, read only
            for sessions of at least the model's `min_turns` turns), `off`, or the path of a
            model file written by `reflective-memory bench fit-starts`. The starts split the
            ranker's conversations (position, recency) as a long silence does in a timed log.
    """

    max_turns: int | None = 500
    idle_seconds: float | None = 1800.0
    end_on_new_session: bool = True
    max_text_chars: int = 2_000_000
    conversation_starts: str = "learned"

    def __post_init__(self) -> None:
        check_int("sessions.max_turns", self.max_turns, optional=True)
        check_number("sessions.idle_seconds", self.idle_seconds, 0, open_low=True, optional=True)
        check_int("sessions.max_text_chars", self.max_text_chars)
        check_bool("sessions.end_on_new_session", self.end_on_new_session)
        if not isinstance(self.conversation_starts, str) or not self.conversation_starts.strip():
            raise ConfigError(
                "sessions.conversation_starts must be 'learned', 'off' or a model file, "
                f"got {self.conversation_starts!r}"
            )
