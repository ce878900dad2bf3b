"""One time model (issue 49): every stored time is timezone-aware, and a turn without a time
takes its conversation's time (`reflective_memory.sessions.clock`), not the day it is stored.

The wall clock of writes and of the SQLite store is moved by hand (`wall_clock`) where a test
needs minutes or hours to pass.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig, ReflectiveMemory
from reflective_memory.text import parse_timestamp

UTC = timezone.utc
#: A naive time, as logs and benchmarks give them: read as UTC.
T0 = datetime(2025, 3, 1, 9, 30)
UNITS = {"units": {"granularities": ("turn", "segment")}}


@pytest.fixture
def mem() -> Iterator[ReflectiveMemory]:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=MemoryConfig(**UNITS)) as m:
        yield m


def _row(session: str, role: str, text: str, when: object = None) -> dict[str, object]:
    row: dict[str, object] = {"user_id": "ana", "session_id": session, "role": role, "text": text}
    if when is not None:
        row["timestamp"] = when
    return row


def _times(mem: ReflectiveMemory, session: str | None = None) -> list[datetime | None]:
    return [t.timestamp for t in mem.turns("ana", session)]


# -- every stored time is aware -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "want"),
    [
        (T0, T0.replace(tzinfo=UTC)),
        ("2025-03-01T09:30:00", T0.replace(tzinfo=UTC)),
        ("2025-03-01T09:30:00Z", T0.replace(tzinfo=UTC)),
        ("2025/03/01 (Sat) 09:30", T0.replace(tzinfo=UTC)),
        ("9:30 am on 1 March, 2025", T0.replace(tzinfo=UTC)),
        (0, datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_naive_input_is_read_as_utc(given: object, want: datetime) -> None:
    got = parse_timestamp(given)
    assert got == want and got is not None and got.utcoffset() == timedelta(0)


def test_an_offset_given_is_kept() -> None:
    got = parse_timestamp("2025-03-01T11:30:00+02:00")
    assert got is not None and got.utcoffset() == timedelta(hours=2)
    assert got == T0.replace(tzinfo=UTC)  # the same instant as 09:30 UTC


def test_mixed_naive_and_aware_input_is_stored_aware_and_sorts(mem: ReflectiveMemory) -> None:
    east = timezone(timedelta(hours=2))
    mem.add_turns(
        [
            _row("s1", "user", "naive datetime", T0),
            _row(
                "s1",
                "assistant",
                "aware, two hours east",
                datetime(2025, 3, 1, 11, 31, tzinfo=east),
            ),
            _row("s1", "user", "ISO without offset", "2025-03-01T09:32:00"),
            _row("s1", "assistant", "Unix seconds", T0.replace(tzinfo=UTC).timestamp() + 180),
            _row("s1", "user", "no time at all"),
        ]
    )
    times = _times(mem)
    assert all(t is not None and t.tzinfo is not None for t in times)
    assert sorted(times) == times  # type: ignore[type-var]  # naive and aware never mix
    assert times[-1] == times[-2]  # the replayed log stays in its time
    (info,) = mem.store.sessions("ana")
    assert info.first_time == T0.replace(tzinfo=UTC) and info.last_time.tzinfo is not None  # type: ignore[union-attr]
    built = mem.end_session("ana", "s1")
    assert built and all(m.start_time and m.start_time.tzinfo for m in built)
    assert all(m.end_time and m.end_time.tzinfo and m.created_at.tzinfo for m in built)
    r = mem.retrieve("ana", "naive datetime", k=1, now=datetime(2025, 3, 2))  # a naive now
    assert r.hits


def test_the_reported_failure_a_dated_chat_with_undated_answers(mem: ReflectiveMemory) -> None:
    """Before: the answers were stamped today (aware) among naive 2025 times, and sorting the
    times raised `TypeError: can't compare offset-naive and offset-aware datetimes`."""
    for day in range(5):
        said = T0 + timedelta(days=14 * day)
        mem.add_turn("ana", f"s{day}", "user", f"What shall I cook on day {day}?", timestamp=said)
        mem.add_turn("ana", f"s{day}", "assistant", f"Try recipe {day}.")
    times = sorted(_times(mem))  # type: ignore[type-var]
    assert all(t.year == 2025 and t.tzinfo is not None for t in times)  # type: ignore[union-attr]
    for day in range(5):
        asked, answered = _times(mem, f"s{day}")
        assert answered == asked == (T0 + timedelta(days=14 * day)).replace(tzinfo=UTC)


def _write_naive_rows(db: Path) -> None:
    """Rewrite every stored time of a store as an older version wrote them: no offset."""
    with sqlite3.connect(db) as conn:
        for table, cols in (
            ("turns", ("ts",)),
            ("sessions", ("first_ts", "last_ts", "created_at")),
            ("memories", ("start_ts", "end_ts", "created_at", "updated_at")),
        ):
            for col in cols:
                conn.execute(f"UPDATE {table} SET {col} = substr({col}, 1, 19)")
        naive = conn.execute("SELECT ts FROM turns").fetchall()
    assert naive and all(len(ts) == 19 and "+" not in ts for (ts,) in naive)


def test_an_old_store_with_naive_rows_reads_back_aware_utc(tmp_path: Path) -> None:
    cfg = MemoryConfig(**UNITS)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(128), config=cfg) as m:
        m.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.", timestamp=T0)
        m.add_turn("ana", "s1", "assistant", "Beaches are great.", timestamp=T0)
        m.end_session("ana", "s1")
    _write_naive_rows(tmp_path / "memory.sqlite3")
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(128), config=cfg) as m:
        assert _times(m) == [T0.replace(tzinfo=UTC)] * 2
        (info,) = m.store.sessions("ana")
        assert info.first_time == T0.replace(tzinfo=UTC) and info.created_at.tzinfo is not None
        assert all(x.start_time and x.start_time.tzinfo for x in m.store.memories("ana"))
        assert all(x.created_at.tzinfo and x.updated_at.tzinfo for x in m.store.memories("ana"))
        m.add_turn("ana", "s2", "user", "And my cat is Miso.")  # today, aware
        m.add_turn("ana", "s1", "user", "Pixel is five.", timestamp="2025-03-01T09:31:00+00:00")
        assert sorted(_times(m))[0] == T0.replace(tzinfo=UTC)  # type: ignore[type-var]
        assert m.retrieve("ana", "What is my dog called?", k=1).hits


# -- a turn without a time takes its conversation's -----------------------------------------------
def test_a_replayed_session_stays_in_its_time(mem: ReflectiveMemory) -> None:
    mem.add_turn("ana", "s1", "user", "I live in Lyon.", timestamp=T0)
    mem.add_turn("ana", "s1", "assistant", "Lyon is lovely.")
    mem.add_turn("ana", "s1", "user", "Two minutes later.", timestamp=T0 + timedelta(minutes=2))
    mem.add_turn("ana", "s1", "assistant", "Indeed.")
    assert _times(mem) == [
        T0.replace(tzinfo=UTC),
        T0.replace(tzinfo=UTC),
        (T0 + timedelta(minutes=2)).replace(tzinfo=UTC),
        (T0 + timedelta(minutes=2)).replace(tzinfo=UTC),
    ]
    assert mem.turn_time("ana", "s1") == (T0 + timedelta(minutes=2)).replace(tzinfo=UTC)


def test_a_replay_going_on_dates_a_new_session_that_begins_without_a_time(
    mem: ReflectiveMemory,
) -> None:
    """A session whose first turn has no time (a greeting) while the replay goes on takes the
    user's newest time, so the default `now` never jumps to today."""
    mem.add_turn("ana", "s1", "user", "I live in Lyon.", timestamp=T0)
    mem.add_turn("ana", "s2", "assistant", "Welcome back!")  # s1 is open: the replay goes on
    mem.add_turn("ana", "s2", "user", "I moved to Oslo.", timestamp=T0 + timedelta(days=30))
    mem.add_turn("ana", "s2", "assistant", "Big change!")
    assert _times(mem, "s2") == [
        T0.replace(tzinfo=UTC),
        (T0 + timedelta(days=30)).replace(tzinfo=UTC),
        (T0 + timedelta(days=30)).replace(tzinfo=UTC),
    ]
    r = mem.retrieve("ana", "What happened two weeks ago?", k=1)
    assert r.diagnostics["time_frame"]["end"] < "2025-04-01"  # resolved in 2025, not today


def test_a_batch_dates_a_sessions_first_turns_by_its_first_given_time(
    mem: ReflectiveMemory,
) -> None:
    mem.add_turns(
        [
            _row("s1", "assistant", "Hello, how was your week?"),
            _row("s1", "user", "Busy: I started a pottery class.", T0),
            _row("s1", "assistant", "Pottery is fun."),
            _row("s2", "user", "Another session, no time at all."),
        ]
    )
    assert _times(mem, "s1") == [T0.replace(tzinfo=UTC)] * 3
    assert _times(mem, "s2") == [T0.replace(tzinfo=UTC)]  # the replay goes on


def test_one_by_one_and_in_one_batch_give_the_same_times(wall_clock) -> None:  # noqa: ANN001
    rows = [
        _row("s1", "user", "Dated.", T0),
        _row("s1", "assistant", "Undated answer."),
        _row("s2", "user", "A new session, undated."),
        _row("s2", "assistant", "Its answer, undated."),
        _row("s3", "user", "Dated again.", T0 + timedelta(days=3)),
    ]
    got = []
    for batch in (True, False):
        with ReflectiveMemory(embedder=HashingEmbedder(64), config=MemoryConfig(**UNITS)) as m:
            if batch:
                m.add_turns(rows)
            else:
                for row in rows:
                    m.add_turns([row])
            got.append(_times(m))
    assert got[0] == got[1]
    assert got[0][:4] == [T0.replace(tzinfo=UTC)] * 4


def test_a_live_chat_takes_the_wall_clock_even_after_a_pause(wall_clock) -> None:  # noqa: ANN001
    """Live turns are stamped with the clock; after a pause longer than the idle time the next
    one is still (a rule reading "live" as "the previous turn is recent" would back-date it to
    the previous turn, and every turn after it, for good)."""
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=MemoryConfig(**UNITS)) as m:
        start = wall_clock.now
        m.add_turn("ana", "s1", "user", "Hi!")
        wall_clock.advance(seconds=5)
        m.add_turn("ana", "s1", "assistant", "Hello!")
        wall_clock.advance(hours=2)
        m.add_turn("ana", "s1", "user", "Back after lunch.")
        m.add_turn("ana", "s2", "user", "A new chat.")
        assert _times(m) == [start, start + timedelta(seconds=5)] + [wall_clock.now] * 2


def test_a_new_session_after_a_stored_replay_is_live(wall_clock) -> None:  # noqa: ANN001
    """An imported or seeded history (its sessions ended) does not back-date the chat after it."""
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=MemoryConfig(**UNITS)) as m:
        m.add_turn("ana", "old", "user", "I live in Lyon.", timestamp=T0)
        m.end_session("ana", "old")
        assert m.add_turn("ana", "new", "user", "Hello again!").timestamp == wall_clock.now
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=MemoryConfig(**UNITS)) as m:
        m.add_turn("ana", "old", "user", "I live in Lyon.", timestamp=T0)  # left open
        wall_clock.advance(hours=1)  # longer than sessions.idle_seconds: the replay is over
        assert m.add_turn("ana", "new", "user", "Hello again!").timestamp == wall_clock.now


def test_turn_time_gives_the_time_a_turn_would_get(mem: ReflectiveMemory) -> None:
    assert mem.turn_time("ana", "s1", "2025-03-01T09:30:00") == T0.replace(tzinfo=UTC)
    before = datetime.now(UTC)
    assert before <= mem.turn_time("ana", "s1") <= datetime.now(UTC)  # a new user: now
    with pytest.raises(InvalidInputError, match="no known format"):
        mem.turn_time("ana", "s1", "next tuesday-ish")
    with pytest.raises(InvalidInputError):
        mem.turn_time("", "s1")


def test_idle_ending_in_a_live_chat_without_times(wall_clock) -> None:  # noqa: ANN001
    """Two live sessions without times, a turn every ten minutes for two hours: neither ends
    on idle; once one is silent longer than `idle_seconds`, the other's next turn ends it."""
    cfg = MemoryConfig(sessions={"end_on_new_session": False, "idle_seconds": 1800}, **UNITS)
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=cfg) as m:
        for i in range(12):
            m.add_turn("ana", "work" if i % 2 else "home", "user", f"Message {i}.")
            wall_clock.advance(minutes=10)
        assert sorted(m.open_sessions("ana")) == ["home", "work"]
        for i in range(3):
            m.add_turn("ana", "home", "user", f"Only home now {i}.")
            wall_clock.advance(minutes=10)
        assert sorted(m.open_sessions("ana")) == ["home", "work"]  # work: 30 minutes at most
        wall_clock.advance(minutes=5)
        m.add_turn("ana", "home", "user", "Still here.")
        assert m.open_sessions("ana") == ["home"]  # work idle for 45 minutes: ended
        assert m.store.session("ana", "work").status == "ended"  # type: ignore[union-attr]
