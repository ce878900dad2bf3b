"""Time in retrieval (issue 28): a question anchored in time prefers what was said then.

Relative times resolve against `retrieve(now=...)`, by default the user's newest turn; the
phrase itself is not searched as words.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig, ReflectiveMemory

COOKING = [
    ("2025-03-02", "I cooked a mushroom risotto for my parents."),
    ("2025-04-06", "I cooked a lentil curry with lots of ginger."),
    ("2025-04-20", "I cooked pumpkin soup and baked bread."),
    ("2025-05-04", "I cooked a fish stew for the neighbours."),
]


@pytest.fixture
def mem():
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as m:
        for i, (day, text) in enumerate(COOKING):
            m.add_turn("ana", f"s{i}", "user", text, timestamp=f"{day}T19:00:00")
            m.end_session("ana", f"s{i}")
        yield m


def _top(r) -> str:
    return r.hits[0].memory.session_id


def test_relative_time_resolves_against_the_newest_turn_by_default(mem):
    r = mem.retrieve("ana", "What did I cook two weeks ago?", k=2)
    assert _top(r) == "s2"  # 2025-04-20: two weeks before 2025-05-04
    frame = r.diagnostics["time_frame"]
    assert frame["phrase"] == "two weeks ago" and frame["start"] < "2025-04-20" < frame["end"]


def test_now_moves_the_frame(mem):
    asked = datetime(2025, 4, 20, 12, tzinfo=timezone.utc)
    assert _top(mem.retrieve("ana", "What did I cook two weeks ago?", k=2, now=asked)) == "s1"
    r = mem.retrieve("ana", "What did I cook in March?", k=2, now="2025/05/10 (Sat) 10:00")
    assert _top(r) == "s0"


def test_passages_carry_their_dates(mem):
    r = mem.retrieve("ana", "What did I cook last month?", budget_tokens=200)
    assert r.hits and all(h.memory.text.startswith("[2025-") for h in r.hits)
    assert {h.memory.session_id for h in r.hits[:2]} <= {"s1", "s2"}  # April, asked in May


def test_time_frame_false_turns_it_off():
    cfg = MemoryConfig(units={"granularities": ("turn",)}, passages={"time_frame": False})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as m:
        for i, (day, text) in enumerate(COOKING):
            m.add_turn("ana", f"s{i}", "user", text, timestamp=day)
        r = m.retrieve("ana", "What did I cook two weeks ago?", k=2)
        assert "time_frame" not in r.diagnostics


@pytest.mark.parametrize("bad", ["next tuesday-ish", 3.5j, [2025]])
def test_bad_now_is_a_typed_error(mem, bad):
    with pytest.raises(InvalidInputError):
        mem.retrieve("ana", "What did I cook two weeks ago?", now=bad)
