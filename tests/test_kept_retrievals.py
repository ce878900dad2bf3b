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
