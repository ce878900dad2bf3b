from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from reflective_memory import (
    FixedWindowSegmenter,
    MemoryConfig,
    ReflectiveMemory,
    UnknownSessionError,
)

from tests.conftest import add_session

PETS = [
    "My dog Pixel is a three year old border collie.",
    "Border collies need a lot of exercise, how often do you walk Pixel?",
    "Twice a day, and on weekends we go hiking in the mountains.",
    "Hiking is a great outlet for herding breeds.",
]
WORK = [
    "I started a new job as a nurse at the city hospital last month.",
    "Congratulations! How are the night shifts treating you?",
    "The night shifts are exhausting but my colleagues are kind.",
    "Try to keep a regular sleep schedule on your days off.",
]


def test_turns_are_stored_with_caller_ids_and_positions(mem: ReflectiveMemory) -> None:
    t = mem.add_turn("u1", "s1", "user", "hello there", turn_id="msg-1", timestamp="2024-03-01")
    assert t.turn_id == "msg-1" and t.position == 0
    t2 = mem.add_turn("u1", "s1", "assistant", "hi! how can I help?")
    assert t2.turn_id == "s1:1" and t2.position == 1
    listed = mem.turns("u1")
    assert [x.turn_id for x in listed] == ["msg-1", "s1:1"]
    assert listed[0].timestamp == datetime(2024, 3, 1, tzinfo=timezone.utc)  # naive is UTC
    assert mem.turns("u1", "other") == []


def test_retrieve_ranks_the_relevant_memory_first(mem: ReflectiveMemory) -> None:
    add_session(mem, "u1", "pets", PETS)
    add_session(mem, "u1", "work", WORK)
    r = mem.retrieve("u1", "what breed is my dog Pixel?", k=2)
    assert len(r) == 2
    assert r.hits[0].memory.session_id == "pets"
    assert r.hits[0].rank == 0 and r.hits[0].score >= r.hits[1].score
    r2 = mem.retrieve("u1", "how are my night shifts at the hospital", k=1)
    assert r2.hits[0].memory.session_id == "work"
    assert r2.diagnostics["mode"] == "hybrid"
    assert {"embed", "dense", "lexical", "total"} <= set(r2.diagnostics["timings_ms"])
    assert r2.diagnostics["candidates"]["dense"] >= 1


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_every_mode_finds_the_exact_fact(mem: ReflectiveMemory, mode: str) -> None:
    add_session(mem, "u1", "pets", PETS)
    add_session(mem, "u1", "work", WORK)
    r = mem.retrieve("u1", "nurse job at the city hospital", k=1, mode=mode)
    assert r.hits[0].memory.turn_ids == ("work:0",)
    assert r.diagnostics["mode"] == mode


def test_k_may_equal_the_memory_count(mem: ReflectiveMemory) -> None:
    add_session(mem, "u1", "pets", PETS)
    add_session(mem, "u1", "work", WORK)
    r = mem.retrieve("u1", "dog", k=8)
    assert len(r) == 8
    assert len({h.memory.id for h in r}) == 8
    assert len(mem.retrieve("u1", "dog", k=100)) == 8


def test_budget_packs_hits_in_rank_order(mem: ReflectiveMemory) -> None:
    add_session(mem, "u1", "pets", PETS)
    add_session(mem, "u1", "work", WORK)
    full = mem.retrieve("u1", "Pixel hiking", k=8)
    r = mem.retrieve("u1", "Pixel hiking", budget_tokens=30)
    from reflective_memory import count_tokens

    assert sum(count_tokens(h.memory.text) for h in r.hits) <= 30
    assert len(r) >= 1
    ranked_ids = [h.memory.id for h in full.hits]
    got = [ranked_ids.index(h.memory.id) for h in r.hits]
    assert got == sorted(got)
    both = mem.retrieve("u1", "Pixel hiking", budget_tokens=1000, k=2)
    assert len(both) == 2


def test_unknown_user_gets_an_empty_result(mem: ReflectiveMemory) -> None:
    r = mem.retrieve("nobody", "anything at all")
    assert r.hits == [] and r.diagnostics["index_size"] == 0


def test_memory_fields_text_key_dates(embedder) -> None:
    cfg = MemoryConfig(units={"granularities": ("session",)}, denoise={"kind": "none"})  # raw keys
    with ReflectiveMemory(embedder=embedder, config=cfg) as m:
        m.add_turn("u", "s", "user", "I moved to Berlin.", timestamp="2023/05/21 (Sun) 11:54")
        m.add_turn("u", "s", "assistant", "How is Berlin?", timestamp="2023/05/21 (Sun) 11:55")
        (memory,) = m.end_session("u", "s")
    assert memory.granularity == "session"
    assert memory.text.startswith("[2023-05-21 (Sun) 11:54]\nuser: I moved to Berlin.")
    assert "assistant: How is Berlin?" in memory.text
    assert memory.key == "user: I moved to Berlin.\nassistant: How is Berlin?"
    assert memory.turn_ids == ("s:0", "s:1")
    assert memory.start_time == datetime(2023, 5, 21, 11, 54, tzinfo=timezone.utc)
    assert memory.end_time == datetime(2023, 5, 21, 11, 55, tzinfo=timezone.utc)


def test_segments_and_several_granularities(embedder) -> None:
    cfg = MemoryConfig(units={"granularities": ("turn", "session", "segment")})
    with ReflectiveMemory(embedder=embedder, config=cfg, segmenter=FixedWindowSegmenter(3)) as m:
        add_session(m, "u", "s", PETS + WORK)
        counts = m.stats("u")["memories_by_granularity"]
    assert counts == {"turn": 8, "session": 1, "segment": 3}


def test_end_session_twice_rebuilds_instead_of_duplicating(mem: ReflectiveMemory) -> None:
    add_session(mem, "u", "s", PETS[:2])
    mem.add_turn("u", "s", "user", "One more thing: Pixel hates thunderstorms.")
    assert mem.open_sessions("u") == ["s"]
    mems = mem.end_session("u", "s")
    assert len(mems) == 3 and mem.stats("u")["memories"] == 3
    assert mem.retrieve("u", "thunderstorms", k=1).hits[0].memory.turn_ids == ("s:2",)


def test_end_unknown_session_raises(mem: ReflectiveMemory) -> None:
    with pytest.raises(UnknownSessionError, match="no session 'zzz'"):
        mem.end_session("u", "zzz")


def test_delete_session_and_user(mem: ReflectiveMemory) -> None:
    add_session(mem, "u", "pets", PETS)
    add_session(mem, "u", "work", WORK)
    assert mem.delete_session("u", "pets") == 4
    assert {h.memory.session_id for h in mem.retrieve("u", "Pixel dog", k=10)} == {"work"}
    assert mem.users() == ["u"]
    assert mem.delete_user("u") == 4
    assert mem.users() == [] and mem.retrieve("u", "nurse").hits == []
    with pytest.raises(UnknownSessionError):
        mem.delete_session("u", "pets")


def test_reopen_restores_everything_and_open_sessions(tmp_path, embedder) -> None:
    path = tmp_path / "db"
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(path, embedder=embedder, config=cfg) as m:
        add_session(m, "u", "pets", PETS)
        m.add_turn("u", "open", "user", "I am planning a trip to Lisbon in June.")
        before = [h.memory.id for h in m.retrieve("u", "Pixel", k=3)]
    assert list((path / "index").glob("*.faiss"))
    with ReflectiveMemory(path, embedder=embedder, config=cfg) as m:
        assert [h.memory.id for h in m.retrieve("u", "Pixel", k=3)] == before
        assert m.open_sessions("u") == ["open"]
        m.end_session("u", "open")
        assert m.retrieve("u", "trip to Lisbon", k=1).hits[0].memory.session_id == "open"


def test_damaged_or_missing_index_files_are_rebuilt(tmp_path, embedder) -> None:
    path = tmp_path / "db"
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(path, embedder=embedder, config=cfg) as m:
        add_session(m, "u", "pets", PETS)
        expected = m.retrieve("u", "hiking", k=2).hits[0].memory.id
    for f in (path / "index").glob("*.faiss"):
        f.write_bytes(b"garbage")
    with ReflectiveMemory(path, embedder=embedder, config=cfg) as m:
        assert m.retrieve("u", "hiking", k=2).hits[0].memory.id == expected
    for f in (path / "index").iterdir():
        f.unlink()
    with ReflectiveMemory(path, embedder=embedder, config=cfg) as m:
        assert m.retrieve("u", "hiking", k=2).hits[0].memory.id == expected


def test_turn_cap_ends_the_session(embedder) -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)}, sessions={"max_turns": 3})
    with ReflectiveMemory(embedder=embedder, config=cfg) as m:
        add_session(m, "u", "s", PETS[:3], end=False)
        assert m.open_sessions("u") == []
        assert m.stats("u")["memories"] == 3


def test_idle_timeout_ends_older_sessions(embedder) -> None:
    cfg = MemoryConfig(  # the idle rule alone (a new session would end the others at once)
        units={"granularities": ("turn",)},
        sessions={"idle_seconds": 3600, "end_on_new_session": False},
    )
    t0 = datetime(2024, 1, 1, 9, 0)
    with ReflectiveMemory(embedder=embedder, config=cfg) as m:
        m.add_turn("u", "morning", "user", "Pixel ate my sandwich", timestamp=t0)
        m.add_turn("u", "later", "user", "back again", timestamp=t0 + timedelta(minutes=30))
        assert sorted(m.open_sessions("u")) == ["later", "morning"]
        m.add_turn("u", "evening", "user", "new topic", timestamp=t0 + timedelta(hours=3))
        assert m.open_sessions("u") == ["evening"]
        assert m.retrieve("u", "sandwich", k=1).hits[0].memory.session_id == "morning"


def test_async_twins(mem: ReflectiveMemory) -> None:
    import asyncio

    async def go() -> list[str]:
        await mem.aadd_turn("u", "s", "user", "My favourite tea is genmaicha.")
        await mem.aend_session("u", "s")
        r = await mem.aretrieve("u", "which tea do I like?", k=1)
        return [h.memory.session_id for h in r]

    assert asyncio.run(go()) == ["s"]


def test_docstring_example_runs() -> None:
    import doctest

    import reflective_memory.engine
    import reflective_memory.llm
    import reflective_memory.retrieval.cues
    import reflective_memory.retrieval.excerpts
    import reflective_memory.retrieval.passages
    import reflective_memory.retrieval.turn_votes
    import reflective_memory.segment.base
    import reflective_memory.text

    for module in (
        reflective_memory.retrieval.cues,
        reflective_memory.engine,
        reflective_memory.retrieval.excerpts,
        reflective_memory.llm,
        reflective_memory.retrieval.passages,
        reflective_memory.segment.base,
        reflective_memory.text,
        reflective_memory.retrieval.turn_votes,
    ):
        assert doctest.testmod(module).failed == 0


def test_put_get_delete_memory_items(mem: ReflectiveMemory) -> None:
    from reflective_memory import InvalidInputError, UnknownMemoryError

    m = mem.put_memory("u", "Prefers window seats on long flights.", metadata={"ns": ["prefs"]})
    assert m.granularity == "item" and m.metadata == {"ns": ["prefs"]}
    assert mem.retrieve("u", "window seat flights", k=1).hits[0].memory.id == m.id
    m2 = mem.put_memory("u", "Prefers aisle seats now.", memory_id=m.id)
    assert m2.id == m.id and m2.created_at == m.created_at
    assert mem.get_memory("u", m.id).text == "Prefers aisle seats now."
    assert mem.retrieve("u", "aisle seats", k=5).hits[0].memory.text == "Prefers aisle seats now."
    with pytest.raises(UnknownMemoryError, match="no memory"):
        mem.get_memory("other-user", m.id)
    with pytest.raises(InvalidInputError, match="granularity"):
        mem.put_memory("u", "x", granularity="blob")
    with pytest.raises(InvalidInputError, match="JSON"):
        mem.put_memory("u", "x", metadata={"f": object()})
    assert mem.delete_memory("u", m.id) is True
    assert mem.delete_memory("u", m.id) is False
    assert mem.retrieve("u", "aisle seats", k=5).hits == []


def test_memory_ids_cannot_cross_users(mem: ReflectiveMemory) -> None:
    """An id is the user's own: another user writing it gets a memory of their own."""
    mem.put_memory("a", "Alice's secret note.", memory_id="m1")
    mem.put_memory("b", "Bob tries to take it.", memory_id="m1")
    assert [m.text for m in mem.memories("a")] == ["Alice's secret note."]
    assert [m.text for m in mem.memories("b")] == ["Bob tries to take it."]
    assert [h.memory.text for h in mem.retrieve("a", "secret note", k=5).hits] == [
        "Alice's secret note."
    ]
    assert mem.delete_memory("b", "m1") is True
    assert mem.get_memory("a", "m1").text == "Alice's secret note."


def test_a_query_past_max_query_chars_is_refused_before_any_work(tmp_path) -> None:
    """Issue 39 near miss: a search's CPU grew with its query (900 KB: 7 s). `retrieve` and
    `rerank_texts` refuse a query over `search.max_query_chars`, which a config may raise."""
    from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig

    long_query = "dog " * 5_001  # 20,004 characters
    with ReflectiveMemory(None, embedder=HashingEmbedder()) as mem:
        mem.add_turn("u", "s", "user", "My dog is called Pixel.")
        for call in (
            lambda: mem.retrieve("u", long_query),
            lambda: mem.rerank_texts("u", long_query, ["dogs bark"]),
        ):
            with pytest.raises(InvalidInputError, match="more than max_query_chars=20,000"):
                call()
        assert mem.retrieve("u", long_query[:20_000]).hits
    config = MemoryConfig(search={"max_query_chars": 30_000})
    with ReflectiveMemory(None, embedder=HashingEmbedder(), config=config) as mem:
        mem.add_turn("u", "s", "user", "My dog is called Pixel.")
        assert mem.retrieve("u", long_query).hits
