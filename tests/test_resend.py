"""Re-sending a turn is safe (issue 29): same ids and content store nothing new and return the
stored turn; a turn committed but never indexed (a crash in between) is indexed on the retry."""

from __future__ import annotations

import pytest
from reflective_memory import HashingEmbedder, InvalidInputError, ReflectiveMemory
from reflective_memory.retrieval.units import turn_unit_id


@pytest.fixture
def mem(tmp_path):
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder()) as m:
        yield m


def test_a_resent_turn_is_a_no_op_returning_the_stored_turn(mem):
    first = mem.add_turn("ana", "s1", "user", "I keep bees on the roof.", turn_id="m-1")
    again = mem.add_turn("ana", "s1", "user", "I keep bees on the roof.", turn_id="m-1")
    assert again == first and len(mem.turns("ana", "s1")) == 1
    with pytest.raises(InvalidInputError, match="already exists"):
        mem.add_turn("ana", "s1", "user", "I keep wasps on the roof.", turn_id="m-1")
    with pytest.raises(InvalidInputError, match="already exists"):
        mem.add_turn("ana", "s1", "assistant", "I keep bees on the roof.", turn_id="m-1")
    assert len(mem.turns("ana", "s1")) == 1


def test_a_batch_mixing_resent_and_new_turns_keeps_its_order(mem):
    mem.add_turn("ana", "s1", "user", "First.", turn_id="a")
    out = mem.add_turns(
        [
            {
                "user_id": "ana",
                "session_id": "s1",
                "role": "user",
                "text": "First.",
                "turn_id": "a",
            },
            {
                "user_id": "ana",
                "session_id": "s1",
                "role": "user",
                "text": "Second.",
                "turn_id": "b",
            },
        ]
    )
    assert [t.turn_id for t in out] == ["a", "b"]
    assert [t.text for t in mem.turns("ana", "s1")] == ["First.", "Second."]


def test_a_retry_indexes_a_turn_whose_indexing_was_lost(mem):
    # what a kill between the turn's commit and its indexing leaves behind
    [t] = mem.store.add_turns(
        [
            {
                "user_id": "ana",
                "session_id": "s1",
                "role": "user",
                "text": "My locker code is zanzibar.",
                "timestamp": None,
                "turn_id": "m-7",
            }
        ]
    )
    assert not mem.store.memories("ana", [turn_unit_id("ana", "s1", "m-7")])
    assert not mem.retrieve("ana", "zanzibar", k=3).hits  # stored but not searchable
    again = mem.add_turn("ana", "s1", "user", "My locker code is zanzibar.", turn_id="m-7")
    assert again.turn_id == t.turn_id and len(mem.turns("ana", "s1")) == 1
    hits = mem.retrieve("ana", "zanzibar", k=3).hits
    assert hits and "zanzibar" in hits[0].memory.text
