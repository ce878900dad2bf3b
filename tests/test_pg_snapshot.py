"""On PostgreSQL, a question after a write reads only the memories written since.

The server index is a snapshot of the user's memory ids and keys. When the previous snapshot's
memories are unchanged (the same rows up to its newest mark: count, sum of marks, that row),
the next one reads only the rows marked above it; any deletion or rewrite reads everything.
"""

from __future__ import annotations

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import EmbeddingError

TURNS = [
    "I adopted a beagle called Pixel last week.",
    "He already chewed my red sneakers.",
    "My sister Lea moved to Porto in May.",
    "I started night shifts at the city hospital.",
]


def _mem(dsn: str) -> ReflectiveMemory:
    from reflective_memory.storage.postgres import PostgresStore

    return ReflectiveMemory(
        store=PostgresStore(dsn, schema=pg_schema()),
        embedder=HashingEmbedder(64),
        config=MemoryConfig(sessions={"idle_seconds": None, "max_turns": None}),
    )


def _spy(mem: ReflectiveMemory) -> list[bool]:
    """Record whether each snapshot the engine takes was read as an append."""
    search = mem.store.search
    took: list[bool] = []
    real = search.index_snapshot

    def snapshot(user_id, model, dim, after=None):
        got = real(user_id, model, dim, after)
        took.append(got.appended)
        return got

    search.index_snapshot = snapshot
    return took


def _full(mem: ReflectiveMemory, user: str) -> tuple[list[str], list[str]]:
    search = mem.store.search
    got = type(search).index_snapshot(search, user, "any", 1)  # not the spy
    assert not got.appended
    return got.ids, got.keys


def test_a_question_after_a_write_reads_only_the_new_memories(pg_dsn) -> None:
    with _mem(pg_dsn) as mem:
        took = _spy(mem)
        mem.add_turn("ana", "s1", "user", TURNS[0])
        assert mem.retrieve("ana", "dog", k=1).hits
        for text in TURNS[1:]:
            mem.add_turn("ana", "s1", "user", text)
            hits = mem.retrieve("ana", text, k=1).hits
            assert hits[0].memory.text.endswith(text)  # found at once
            index = mem.indexes.get("ana")
            assert (index.ids, index.keys) == _full(mem, "ana")
        assert took == [False, True, True, True]
        mem.end_session("ana", "s1")  # rewrites the session's units: read again
        mem.retrieve("ana", "Porto", k=1)
        assert (mem.indexes.get("ana").ids, mem.indexes.get("ana").keys) == _full(mem, "ana")


def test_a_deletion_or_a_rewrite_reads_every_memory_again(pg_dsn) -> None:
    with _mem(pg_dsn) as mem:
        took = _spy(mem)
        for text in TURNS:
            mem.add_turn("ana", "s1", "user", text)
        mem.retrieve("ana", "dog", k=1)
        mem.delete_turns("ana", "s1", ["s1:1"])
        hits = mem.retrieve("ana", "sneakers", k=4).hits
        assert not any("sneakers" in h.memory.text for h in hits)
        assert took == [False, False]
        note = mem.put_memory("ana", "Pixel's vet is Dr. Silva.")  # a new row: read alone
        mem.retrieve("ana", "vet", k=1)
        assert took[-1] is True
        mem.put_memory("ana", "Pixel's vet is Dr. Costa.", memory_id=note.id)  # a rewrite
        texts = [h.memory.text for h in mem.retrieve("ana", "Who is Pixel's vet?", k=5).hits]
        assert took[-1] is False
        assert any("Costa" in t for t in texts) and not any("Silva" in t for t in texts)
        index = mem.indexes.get("ana")
        assert (index.ids, index.keys) == _full(mem, "ana")


def test_an_earlier_snapshot_that_no_longer_holds_is_not_extended(pg_dsn) -> None:
    with _mem(pg_dsn) as mem:
        for text in TURNS:
            mem.add_turn("ana", "s1", "user", text)
        search, model, dim = mem.store.search, mem.embedder.name, mem.embedder.dim
        full = search.index_snapshot("ana", model, dim)
        ids, marks = full.ids, full.marks
        assert not full.appended and not full.stale
        last, mark, n, total = ids[-2], marks[-2], len(ids) - 1, sum(marks[:-1])
        got = search.index_snapshot("ana", model, dim, (last, mark, n, total))
        assert got.appended and got.ids == ids[-1:] and got.marks == marks[-1:]
        for after in [
            (last, mark, n, total + 1),  # another row under the mark in place of a deleted one
            (last, mark, n + 1, total),  # a row deleted
            (ids[0], mark, n, total),  # the newest row of the earlier snapshot is gone
        ]:
            again = search.index_snapshot("ana", model, dim, after)
            assert not again.appended and again.ids == ids
        assert search.index_snapshot("ana", "another", dim).stale == list(range(len(ids)))


def test_a_turn_whose_embedding_failed_is_refused_and_its_retry_is_found(pg_dsn) -> None:
    """A write the embedder cannot serve stores nothing (issue 50); the retry is embedded."""
    with _mem(pg_dsn) as mem:
        for text in TURNS[:3]:
            mem.add_turn("ana", "s1", "user", text)
        mem.retrieve("ana", "dog", k=1)
        encode = mem.embedder.encode
        mem.embedder.encode = lambda texts: (_ for _ in ()).throw(RuntimeError("down"))
        with pytest.raises(EmbeddingError, match="nothing was stored"):
            mem.add_turn("ana", "s1", "user", TURNS[3], turn_id="t3")
        mem.embedder.encode = encode
        assert len(mem.turns("ana")) == 3
        mem.add_turn("ana", "s1", "user", TURNS[3], turn_id="t3")
        hits = mem.retrieve("ana", "night shifts at the hospital", k=1, mode="dense").hits
        assert hits[0].memory.text.endswith(TURNS[3])
        _, _, _, models = mem.store.embeddings("ana")
        assert set(models) == {mem.embedder.name}
