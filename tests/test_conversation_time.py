"""A session's conversations: its parts between long silences (`turn_votes`, issue 49).

A log kept under one session id spans months; its turns' positions and recency are read in
their own conversation, so it ranks as its sessions would.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.retrieval.features import _position
from reflective_memory.retrieval.turn_votes import conversation_bounds, conversation_time
from reflective_memory.types import Turn

T0 = datetime(2025, 1, 6, 9, tzinfo=timezone.utc)


def _turns(offsets_min: list[float | None]) -> list[Turn]:
    return [
        Turn("u", "log", "user", f"turn {i}", f"log:{i}", i,
             None if m is None else T0 + timedelta(minutes=m))
        for i, m in enumerate(offsets_min)
    ]  # fmt: skip


def test_a_silence_of_over_half_an_hour_starts_a_conversation() -> None:
    turns = _turns([0, 1, 2, None, 3, 60 * 24, 60 * 24 + 1, 60 * 24 * 30])
    assert [conversation_bounds(turns, p) for p in range(len(turns))] == [
        (0, 4), (0, 4), (0, 4), (0, 4), (0, 4), (5, 6), (5, 6), (7, 7),
    ]  # fmt: skip
    assert conversation_time(turns, 3) == T0
    assert conversation_time(turns, 6) == T0 + timedelta(days=1)
    assert [_position(turns, "log", p) for p in (0, 4, 5, 6, 7)] == [0.0, 1.0, 0.0, 1.0, 0.0]
    session = _turns([0, 5, 10, 29])  # one session without a long silence: as before
    assert {conversation_bounds(session, p) for p in range(4)} == {(0, 3)}
    assert _position(session, "log", 2) == 2 / 3


def test_a_log_under_one_session_id_puts_the_newest_home_first() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        said = [
            (0, "I live in Lisbon, in a flat near the river."),
            (60 * 24 * 30, "I bought a new bike for the commute."),
            (60 * 24 * 90, "I moved: I live in Porto now, near the station."),
            (60 * 24 * 91, "The weather has been great this week."),
        ]
        for minutes, text in said:
            mem.add_turn("u", "log", "user", text, timestamp=T0 + timedelta(minutes=minutes))
        mem.end_session("u", "log")
        hits = mem.retrieve("u", "Where do I live now?", k=2).hits
        assert "Porto" in hits[0].memory.text
