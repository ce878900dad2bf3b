"""`RetrievalCache`: retrievals kept for feedback, bounded in all and per user, per-user reads."""

from __future__ import annotations

import pytest
from reflective_memory.errors import InvalidInputError
from reflective_memory.kept_retrievals import RetrievalCache
from reflective_memory.types import Retrieval


def _retrieval(user: str, rid: str) -> Retrieval:
    return Retrieval(user, f"question {rid}", [], retrieval_id=rid)


def test_a_user_reads_and_takes_only_their_own_retrievals() -> None:
    kept = RetrievalCache(size=8)
    kept.put(_retrieval("ana", "a1"))
    assert kept.get("a1", "bob") is None and kept.pop("a1", "bob") is None
    assert kept.get("a1") is not None and len(kept) == 1  # bob's attempt took nothing
    taken = kept.pop("a1", "ana")
    assert taken is not None and taken.retrieval_id == "a1"
    assert kept.pop("a1", "ana") is None and len(kept) == 0
    assert kept.get(None) is None and kept.pop(None) is None


def test_the_oldest_goes_first_in_all_and_per_user() -> None:
    kept = RetrievalCache(size=5, per_user=2)
    for rid in ("b1", "a1", "a2", "a3"):  # ana's third pushes her first out, not bob's
        kept.put(_retrieval("bob" if rid.startswith("b") else "ana", rid))
    assert [kept.get(r) is not None for r in ("b1", "a1", "a2", "a3")] == [True, False, True, True]
    kept.put(_retrieval("ana", "a2"))  # kept again: the newest of ana's
    kept.put(_retrieval("ana", "a4"))
    assert kept.get("a3") is None and kept.get("a2") is not None
    for i in range(4):  # other users fill the whole cache: the oldest of all goes
        kept.put(_retrieval(f"u{i}", f"u{i}"))
    assert len(kept) == 5 and kept.get("b1") is None


def test_forget_drops_every_retrieval_of_a_user() -> None:
    kept = RetrievalCache()
    for rid in ("a1", "a2", "b1"):
        kept.put(_retrieval(rid[0], rid))
    assert kept.forget("a") == 2 and kept.forget("a") == 0
    assert kept.get("b1", "b") is not None


@pytest.mark.parametrize("bad", [{"size": 0}, {"size": True}, {"per_user": 0}, {"size": 1.5}])
def test_bounds_are_positive_integers(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError, match="must be a positive integer"):
        RetrievalCache(**bad)  # type: ignore[arg-type]


def test_the_docstring_example_runs() -> None:
    import doctest

    import reflective_memory.kept_retrievals

    assert doctest.testmod(reflective_memory.kept_retrievals).failed == 0


def test_erased_sees_deletions_by_another_memory_on_the_same_store(tmp_path) -> None:
    """Two memories on one SQLite path: what one retrieved, the other deletes; new turns and
    memories written meanwhile erase nothing."""
    from dataclasses import replace

    from reflective_memory import HashingEmbedder, ReflectiveMemory
    from reflective_memory.kept_retrievals import erased
    from reflective_memory.types import Hit

    lena = {"s1": "I live in Lyon near the old town.", "s2": "I moved to Oslo last month."}
    lena["s3"] = "My sister lives in Bergen, near Oslo."
    with (
        ReflectiveMemory(tmp_path / "db", embedder=HashingEmbedder(256)) as mine,
        ReflectiveMemory(tmp_path / "db", embedder=HashingEmbedder(256)) as other,
    ):
        for sid, text in lena.items():
            mine.add_turn("ana", sid, "user", text, timestamp="2024-03-01T10:00:00")
            mine.add_turn("bob", sid, "user", text, timestamp="2024-03-01T10:00:00")
        note = mine.put_memory("ana", "Ana is allergic to cats.")
        r = mine.retrieve("ana", "Where do I live? Oslo or Lyon?", budget_tokens=500)
        assert {"s1", "s2", "s3"} <= {h.memory.session_id for h in r.hits}
        # a topic of s3 holding a turn of s1, and the memory made of no turns
        topic = replace(r.hits[0].memory, id="topic", session_id="s3", turn_ids=("s1:0",))
        r.hits = [h for h in r.hits if h.memory.id != note.id] + [Hit(topic, 0.1, 0)]
        r.hits.append(Hit(note, 0.1, 0))

        def shown(*sessions: str) -> list[str]:
            """The turn ids `r` shows of these sessions, in hit order."""
            return [t for h in r.hits for t in h.memory.turn_ids if t.split(":")[0] in sessions]

        assert erased(mine.store, r) == []
        other.add_turn("ana", "s4", "user", "I now work in Bergen.")  # a write erases nothing
        other.delete_session("bob", "s2")  # nor does another user's deletion
        assert erased(mine.store, r) == []
        other.delete_session("ana", "s2")
        assert erased(mine.store, r) == shown("s2") != []
        other.delete_memory("ana", note.id)
        assert erased(mine.store, r) == [*shown("s2"), note.id]
        other.delete_session("ana", "s1")  # the topic's turn of s1 goes too
        assert "s1:0" in shown("s1") and erased(mine.store, r) == [*shown("s1", "s2"), note.id]
        other.delete_user("ana")
        assert erased(mine.store, r) == [*shown("s1", "s2", "s3"), note.id]
