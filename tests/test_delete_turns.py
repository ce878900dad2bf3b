import pytest
from reflective_memory import (
    HashingEmbedder,
    InvalidInputError,
    ReflectiveMemory,
    UnknownSessionError,
)
from reflective_memory.storage.sqlite import SQLiteStore


@pytest.fixture
def mem():
    with ReflectiveMemory(embedder=HashingEmbedder(64)) as m:
        yield m


def _fill(mem, n=3, session="s1"):
    for i in range(n):
        mem.add_turn("ana", session, "user", f"turn number {i}")


def test_delete_one_turn_keeps_positions_and_reopens(mem):
    _fill(mem)
    mem.end_session("ana", "s1")
    assert mem.open_sessions("ana") == []
    gone = mem.delete_turns("ana", "s1", ["s1:1"])
    assert [t.turn_id for t in gone] == ["s1:1"]
    assert [t.position for t in mem.turns("ana", "s1")] == [0, 2]
    assert mem.stats("ana")["turns"] == 2
    assert mem.open_sessions("ana") == ["s1"]  # memories are stale until rebuilt
    # a new turn never reuses a position or a default turn id
    t = mem.add_turn("ana", "s1", "user", "another")
    assert (t.position, t.turn_id) == (3, "s1:3")
    mem.end_session("ana", "s1")
    texts = " ".join(m.text for m in mem.memories("ana"))
    assert "turn number 1" not in texts and "another" in texts


def test_delete_last_then_add_does_not_collide(mem):
    _fill(mem)
    mem.delete_turns("ana", "s1", ["s1:2"])
    assert mem.add_turn("ana", "s1", "user", "x").turn_id == "s1:2"


def test_delete_all_turns_keeps_memories(mem):
    _fill(mem)
    built = mem.end_session("ana", "s1")
    gone = mem.delete_turns("ana", "s1")
    assert len(gone) == 3 and mem.turns("ana", "s1") == []
    # the session's segments stay until it is ended again; each deleted turn's own unit is gone
    kept = [m.id for m in built if m.granularity != "turn"]
    assert [m.id for m in mem.memories("ana")] == kept
    assert mem.open_sessions("ana") == []  # nothing left to rebuild from


def test_delete_turns_errors_and_isolation(mem):
    _fill(mem)
    _fill(mem, session="s2")
    mem.add_turn("bob", "s1", "user", "bob's turn")
    with pytest.raises(UnknownSessionError):
        mem.delete_turns("ana", "nope")
    with pytest.raises(InvalidInputError):
        mem.delete_turns("ana", "s1", "s1:0")
    assert mem.delete_turns("ana", "s1", ["unknown"]) == []
    mem.delete_turns("ana", "s1")
    assert len(mem.turns("ana", "s2")) == 3
    assert len(mem.turns("bob", "s1")) == 1


def test_turn_extra_follows_turns(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite3")
    store.add_turns(
        [{"user_id": "u", "session_id": s, "role": "user", "text": "t"} for s in ("a", "a", "b")]
    )
    store.set_turn_extra("u", "a", {"a:0": {"k": 1}, "a:1": {"k": 2}})
    store.set_turn_extra("u", "b", {"b:0": {"k": 3}})
    assert store.turn_extra("u", "a") == {"a:0": {"k": 1}, "a:1": {"k": 2}}
    assert store.turn_extra("other", "a") == {}
    store.delete_turns("u", "a", ["a:0"])
    assert store.turn_extra("u", "a") == {"a:1": {"k": 2}}
    store.delete_session("u", "a")
    assert store.turn_extra("u", "a") == {}
    store.delete_user("u")
    assert store.turn_extra("u", "b") == {}
    store.close()


def test_delete_turns_updates_times(mem):
    mem.add_turn("ana", "s1", "user", "a", timestamp="2024-01-01")
    mem.add_turn("ana", "s1", "user", "b", timestamp="2024-01-02")
    mem.add_turn("ana", "s1", "user", "c", timestamp="2024-01-03")
    mem.delete_turns("ana", "s1", ["s1:0", "s1:2"])
    info = mem.store.session("ana", "s1")
    assert info.first_time.day == 2 and info.last_time.day == 2 and info.n_turns == 1
