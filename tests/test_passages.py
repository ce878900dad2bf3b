"""Small-to-big retrieval: turns searchable at once, passages, time-aware order, auto-end."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory, count_tokens
from reflective_memory.errors import EmbeddingError
from reflective_memory.retrieval.cues import present_tense
from reflective_memory.retrieval.passages import GAP_MARK
from reflective_memory.text import lexical_tokens

PETS = [
    "My dog Pixel is a three year old border collie.",
    "Border collies need a lot of exercise, how often do you walk Pixel?",
    "Twice a day, and on weekends we go hiking in the mountains with Pixel.",
    "Hiking is a great outlet for herding breeds.",
    "I also bought Pixel a new red leash yesterday.",
    "A bright leash is easy to spot on the trail.",
]
WORK = [
    "I started a new job as a nurse at the city hospital last month.",
    "Congratulations! How are the night shifts treating you?",
    "The night shifts are exhausting but my colleagues are kind.",
    "Try to keep a regular sleep schedule on your days off.",
]


class CountingEmbedder(HashingEmbedder):
    """Hashing embedder that counts the texts it embeds (and can be made to fail)."""

    def __init__(self) -> None:
        super().__init__(128)
        self.texts: list[str] = []
        self.fail = False

    def encode(self, texts):  # type: ignore[override]
        if self.fail:
            raise RuntimeError("embedder down")
        batch = [texts] if isinstance(texts, str) else list(texts)
        self.texts += batch
        return super().encode(texts)


def _add(mem: ReflectiveMemory, user: str, session: str, texts: list[str], day: str) -> None:
    for i, text in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        mem.add_turn(user, session, role, text, timestamp=f"{day}T10:{i:02d}:00")


def _cfg(**kw) -> MemoryConfig:
    base = MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})
    return base.replace(**kw)


def test_a_turn_is_searchable_before_its_session_ends() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        mem.add_turn("u", "s1", "user", "My dog Pixel is a border collie.")
        assert mem.open_sessions("u") == ["s1"]
        r = mem.retrieve("u", "what breed is Pixel?", k=1)
        assert r.hits and r.hits[0].memory.turn_ids == ("s1:0",)
        assert "border collie" in r.hits[0].memory.text
        mem.add_turn("u", "s1", "user", "I work as a nurse at the city hospital.")
        r = mem.retrieve("u", "nurse hospital job", k=1)
        assert r.hits[0].memory.turn_ids == ("s1:1",)


def test_turns_are_searchable_after_reopening_without_end(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with ReflectiveMemory(path, embedder=HashingEmbedder(128), config=_cfg()) as mem:
        mem.add_turn("u", "s1", "user", "My dog Pixel is a border collie.")
    with ReflectiveMemory(path, embedder=HashingEmbedder(128), config=_cfg()) as mem:
        assert mem.open_sessions("u") == ["s1"]  # still open, yet found
        r = mem.retrieve("u", "border collie Pixel", k=1)
        assert r.hits[0].memory.turn_ids == ("s1:0",)


def test_ending_a_session_embeds_no_turn_twice() -> None:
    emb = CountingEmbedder()
    with ReflectiveMemory(embedder=emb, config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        assert emb.texts == PETS  # each turn embedded once, at add_turn
        built = mem.end_session("u", "pets")
        assert emb.texts == PETS  # turns reused; segment vectors are means of turn vectors
        assert {m.granularity for m in built} == {"turn", "segment"}
        assert mem.open_sessions("u") == []


def test_a_failing_embedder_stores_nothing_and_the_retried_turn_is_found() -> None:
    """A write the embedder cannot serve is refused, typed (issue 50); the retry is stored."""
    emb = CountingEmbedder()
    with ReflectiveMemory(embedder=emb, config=_cfg()) as mem:
        emb.fail = True
        with pytest.raises(EmbeddingError, match="nothing was stored"):
            mem.add_turn("u", "s", "user", "Pixel chewed my favourite sneakers.", turn_id="t0")
        assert mem.turns("u") == []
        emb.fail = False
        mem.add_turn("u", "s", "user", "Pixel chewed my favourite sneakers.", turn_id="t0")
        r = mem.retrieve("u", "what did Pixel chew", k=1, mode="dense")
        assert r.hits[0].memory.turn_ids == ("t0",)


def test_open_sessions_older_than_the_idle_time_end_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    old = datetime.now(timezone.utc) - timedelta(hours=3)
    fresh = datetime.now(timezone.utc) - timedelta(minutes=1)
    cfg = MemoryConfig(sessions={"idle_seconds": 3600})
    with ReflectiveMemory(path, embedder=HashingEmbedder(128), config=cfg) as mem:
        for i, text in enumerate(PETS[:3]):
            mem.add_turn("u", "old", "user", text, timestamp=old + timedelta(seconds=i))
        mem.add_turn("u2", "fresh", "user", "Hello again.", timestamp=fresh)
    with ReflectiveMemory(path, embedder=HashingEmbedder(128), config=cfg) as mem:
        assert mem.open_sessions("u") == []
        assert mem.stats("u")["memories_by_granularity"].get("segment", 0) >= 1
        assert mem.open_sessions("u2") == ["fresh"]


def test_sessions_end_at_the_turn_cap() -> None:
    cfg = MemoryConfig(sessions={"max_turns": 3, "idle_seconds": None})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        _add(mem, "u", "s", PETS[:3], "2024-01-01")
        assert mem.open_sessions("u") == []
        builds = []
        real_end = mem.sessions.end_session
        mem.sessions.end_session = lambda *a: builds.append(a) or real_end(*a)
        _add(mem, "u", "s", WORK[:2], "2024-01-02")  # over the cap: no rebuild at every turn
        assert builds == [] and mem.open_sessions("u") == ["s"]
        _add(mem, "u", "s", WORK[2:3], "2024-01-02")  # 6 turns: ended again
        assert builds == [("u", "s")] and mem.open_sessions("u") == []


def test_adjacent_hits_merge_into_one_passage_with_one_header() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        _add(mem, "u", "work", WORK, "2024-02-01")
        mem.end_session("u", "pets")
        mem.end_session("u", "work")
        r = mem.retrieve("u", "Pixel border collie hiking leash", budget_tokens=400)
        pets = [h for h in r.hits if h.memory.session_id == "pets"]
        assert len(pets) == 1  # one passage per session
        p = pets[0].memory
        assert p.granularity == "passage"
        assert p.text.count("[2024-01-01") == 1 and p.text.startswith("[2024-01-01 (Mon) 10:00]")
        positions = p.metadata["positions"]
        assert positions == sorted(positions)
        lines = p.text.split("\n")[1:]
        runs = 1 + sum(1 for a, b in zip(positions, positions[1:], strict=False) if b != a + 1)
        assert lines.count(GAP_MARK) == runs - 1
        assert len(lines) - lines.count(GAP_MARK) == len(p.turn_ids)
        ids = [t for h in r.hits for t in h.memory.turn_ids]
        assert len(ids) == len(set(ids))  # no turn twice
        assert r.hits[0].memory.session_id == "pets"


def test_budget_counts_headers_and_labels() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        _add(mem, "u", "work", WORK, "2024-02-01")
        for budget in (15, 25, 40, 80, 1000):
            r = mem.retrieve("u", "Pixel leash night shifts", budget_tokens=budget)
            used = sum(count_tokens(h.memory.text) for h in r.hits)
            assert used <= budget
            assert r.diagnostics["passages"]["tokens_used"] == used
        # with room for everything, every turn is returned once
        r = mem.retrieve("u", "Pixel leash night shifts", budget_tokens=1000)
        assert sorted(t for h in r.hits for t in h.memory.turn_ids) == sorted(
            [f"pets:{i}" for i in range(6)] + [f"work:{i}" for i in range(4)]
        )
        # a header plus the shortest line does not fit in 8 tokens: nothing is returned
        assert mem.retrieve("u", "Pixel", budget_tokens=8).hits == []


def test_k_alone_gives_the_top_k_turns_as_stored_units() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        _add(mem, "u", "work", WORK, "2024-02-01")
        stored = {m.id: m for m in mem.memories("u")}
        for k in (1, 3, 5):
            r = mem.retrieve("u", "Pixel leash night shifts", k=k)
            assert len(r) == k
            assert all(len(h.memory.turn_ids) == 1 for h in r.hits)
            assert all(stored[h.memory.id] == h.memory for h in r.hits)
        assert len(mem.retrieve("u", "Pixel", k=100)) == 10


def test_k_with_a_budget_caps_the_passages() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        _add(mem, "u", "work", WORK, "2024-02-01")
        r = mem.retrieve("u", "Pixel leash night shifts", k=1, budget_tokens=1000)
        assert len(r) == 1 and len(r.hits[0].memory.turn_ids) >= 2


def test_deleted_turns_are_gone_from_passages_at_once() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        mem.end_session("u", "pets")
        mem.delete_turns("u", "pets", ["pets:4"])
        r = mem.retrieve("u", "red leash", budget_tokens=1000)
        assert all("leash" not in h.memory.text.split("\n")[1] for h in r.hits[:1])
        assert "pets:4" not in {t for h in r.hits for t in h.memory.turn_ids}
        assert "red leash" not in "\n".join(h.memory.text for h in r.hits)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Where do I live now?", True),
        ("What is my current job?", True),
        ("Do I still have the dog?", True),
        ("What do I do these days?", True),
        ("Where did I live in 2020?", False),
        ("What breed is my dog?", True),  # the user's state in the simple present
        ("Where do I live?", True),
        ("Where did I live before the move?", False),
        ("Where do I initially keep my old sneakers?", False),
        ("What breed was my first dog?", False),
    ],
)
def test_present_tense_cues(query: str, expected: bool) -> None:
    assert present_tense(query) is expected


def test_present_tense_questions_prefer_the_newest_evidence() -> None:
    cfg = _cfg(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        mem.add_turn(
            "u", "a", "user", "I live in Lisbon, in a flat in Alfama.", timestamp="2024-01-05"
        )
        mem.add_turn("u", "b", "user", "Weather was nice.", timestamp="2024-03-01")
        mem.add_turn("u", "c", "user", "I moved, I live in Berlin now.", timestamp="2024-09-01")
        for s in ("a", "b", "c"):
            mem.end_session("u", s)
        now = mem.retrieve("u", "Where do I live now?", budget_tokens=200)
        assert now.hits[0].memory.session_id == "c"
        past = mem.retrieve("u", "Where did I live in Lisbon Alfama?", budget_tokens=200)
        assert past.diagnostics["passages"]["present_tense"] is False
        assert past.hits[0].memory.session_id == "a"
        off = ReflectiveMemory(
            embedder=HashingEmbedder(128),
            config=_cfg(
                units={"granularities": ("turn",)},
                passages={"recency": False},
            ),
        )
        with off:
            for s, text, day in (
                ("a", "I live in Lisbon, in a flat in Alfama.", "2024-01-05"),
                ("c", "I moved, I live in Berlin now.", "2024-09-01"),
            ):
                off.add_turn("u", s, "user", text, timestamp=day)
            r = off.retrieve("u", "Where do I live now?", budget_tokens=200)
            assert r.diagnostics["passages"]["present_tense"] is False


def test_unit_mode_still_returns_units() -> None:
    cfg = _cfg(passages={"enabled": False}, units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        mem.end_session("u", "pets")
        r = mem.retrieve("u", "Pixel", k=4)
        assert len(r) == 4 and {h.memory.granularity for h in r.hits} == {"turn"}


def test_turnless_memories_compete_as_they_are() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        item = mem.put_memory("u", "Allergic to peanuts; carries an EpiPen.")
        r = mem.retrieve("u", "peanut allergy EpiPen", budget_tokens=200)
        # returned whole, with its own rank-0 vote (no context vote: it has no turns; a turn
        # ranked right behind it plus its segment's or stand-in context vote may pass it)
        got = [h for h in r.hits if h.memory.id == item.id]
        assert len(got) == 1 and got[0].memory.text == item.text
        assert got[0].memory.granularity != "passage" and got[0].score == pytest.approx(1 / 61)
        assert got[0].rank <= 1


def test_segment_vectors_are_means_of_turn_vectors() -> None:
    emb = HashingEmbedder(128)
    with ReflectiveMemory(embedder=emb, config=_cfg(units={"speaker_keys": False})) as mem:
        _add(mem, "u", "pets", PETS, "2024-01-01")
        built = mem.end_session("u", "pets")
        seg = next(m for m in built if m.granularity == "segment")
        index = mem.indexes.get("u")
        vec = index.dense.vectors[index.ids.index(seg.id)]
        turns = {t.turn_id: t.text for t in mem.turns("u", "pets")}
        mean = emb.encode([turns[t] for t in seg.turn_ids]).mean(axis=0)
        assert np.allclose(vec, mean / np.linalg.norm(mean), atol=1e-5)


# -- packing order and time-aware ranking, on the algorithm itself ------------------------------
def _turns(session: str, texts: list[str], day: str) -> list:
    from reflective_memory.types import Turn

    ts = datetime.fromisoformat(f"{day}T10:00:00+00:00")
    return [
        Turn(
            user_id="u",
            session_id=session,
            turn_id=f"{session}:{i}",
            position=i,
            role="user",
            text=t,
            timestamp=ts + timedelta(minutes=i),
        )
        for i, t in enumerate(texts)
    ]


LONG_ANSWER = " ".join(["Here is a long general explanation about travel insurance."] * 12)


def _votes(order: list[tuple[str, int]]):
    from reflective_memory.retrieval.turn_votes import TurnVotes

    votes = TurnVotes()
    for rank, key in enumerate(order):
        votes.add(key, 1.0 / (60 + rank + 1), None)
    return votes


def _pack(votes, sessions, budget, **kw):
    from reflective_memory.retrieval.passages import pack_passages

    hits, used, _ = pack_passages(
        "u", votes, sessions.__getitem__, lambda t: len(t.split()), k=None, budget=budget, **kw
    )
    return {tid for h in hits for tid in h.memory.turn_ids}, used


def test_length_aware_packing_lets_short_turns_in_before_a_long_one() -> None:
    short = [f"I booked the flight to Oslo on day {i}." for i in range(6)]
    sessions = {"s": _turns("s", [*short[:2], LONG_ANSWER, *short[2:]], "2026-03-01")}
    # vote order: best short turn, the long answer, then the other short turns
    order = [("s", 0), ("s", 2), ("s", 1), ("s", 3), ("s", 4), ("s", 5), ("s", 6)]
    plain, _ = _pack(_votes(order), sessions, 150)
    assert "s:2" in plain and len(plain) <= 5  # the long answer eats most of the budget
    aware, used = _pack(_votes(order), sessions, 150, length_exponent=0.5, length_free=2.0)
    assert "s:0" in aware  # the best turn is always read first
    assert "s:2" not in aware and len(aware) == 6 and used <= 150


def test_length_aware_packing_keeps_a_clear_long_winner_and_the_budget_share() -> None:
    short = [f"The museum closes at {i} pm on Sundays." for i in range(6)]
    sessions = {"s": _turns("s", [LONG_ANSWER, *short], "2026-03-01")}
    order = [("s", i) for i in range(7)]  # the long turn is the best match
    got, used = _pack(_votes(order), sessions, 200, length_exponent=0.5, length_free=2.0)
    assert "s:0" in got and used <= 200
    # with a quarter of the budget kept in vote order, the first short turns stay in front
    order = [("s", 1), ("s", 2), ("s", 0), ("s", 3), ("s", 4), ("s", 5), ("s", 6)]
    got, _ = _pack(
        _votes(order), sessions, 40, length_exponent=0.5, length_free=2.0, length_keep_share=0.5
    )
    assert {"s:1", "s:2"} <= got and "s:0" not in got


STAT_BLOCK = "\n".join(
    ["The Sunken Library, a one-shot for four players."]
    + [f"Room {i}: damp shelves, broken lamps and fallen stone everywhere." for i in range(20)]
    + ["Enemies: giant crabs (3) guard the reading room."]
    + [f"Corridor {i}: water to the knees and cold air." for i in range(20)]
)


def _pack_cut(order, sessions, budget, query, length):
    from reflective_memory.retrieval.passages import pack_passages

    hits, used, _ = pack_passages(
        "u", _votes(order), sessions.__getitem__, lambda t: len(t.split()), k=None,
        budget=budget, query_terms=lexical_tokens(query), excerpt_length=length,
    )  # fmt: skip
    return hits, used


def test_a_best_turn_too_long_for_the_budget_is_read_as_an_excerpt() -> None:
    short = ["I packed snacks for the game night.", "We play every Friday at Mia's place."]
    sessions = {"a": _turns("a", [STAT_BLOCK], "2026-03-01"), "b": _turns("b", short, "2026-03-02")}
    order = [("a", 0), ("b", 0), ("b", 1)]
    plain, used = _pack(_votes(order), sessions, 60)
    assert "a:0" not in plain and used <= 60  # whole turns only: dropped
    hits, used = _pack_cut(order, sessions, 60, "How many giant crabs are there?", 20)
    got = {t for h in hits for t in h.memory.turn_ids}
    assert {"a:0", "b:0"} <= got and used <= 60  # the next best turn keeps its room
    cut = next(h.memory for h in hits if "a:0" in h.memory.turn_ids)
    assert "giant crabs (3)" in cut.text and GAP_MARK in cut.text
    assert cut.metadata["excerpts"] == [0]
    assert "Room 0:" not in cut.text
    # the best turn's excerpt takes the room left, not just `excerpt_length`
    assert 20 < len(cut.text.split()) < len(STAT_BLOCK.split())
    hits, _ = _pack_cut(order, sessions, 60, "How many giant crabs are there?", 0)
    assert {t for h in hits for t in h.memory.turn_ids} == plain  # 0: whole turns only


def test_long_turns_are_read_as_excerpts_of_the_set_length() -> None:
    notes = [
        "Day 1 of the trip: the train was late, the hotel was fine. " * 4
        + f"We paid {40 + 10 * i} euros a night for the room. "
        + "Then we walked along the river and ate late. " * 4
        for i in range(4)
    ]
    sessions = {f"s{i}": _turns(f"s{i}", [n], f"2026-03-0{i + 1}") for i, n in enumerate(notes)}
    order = [(f"s{i}", 0) for i in range(4)]
    whole, _ = _pack(_votes(order), sessions, 160)
    assert len(whole) == 1  # a note costs ~100 words: one fits
    hits, used = _pack_cut(order, sessions, 160, "How much did we pay a night for the room?", 35)
    assert {t for h in hits for t in h.memory.turn_ids} == {"s0:0", "s1:0", "s2:0"}
    assert used <= 160
    for i, h in enumerate(sorted(hits, key=lambda h: h.memory.session_id)):
        assert f"We paid {40 + 10 * i} euros a night" in h.memory.text
        # the best turn fits whole and is read whole; the others are cut to 35 words
        assert h.memory.metadata.get("excerpts") == (None if i == 0 else [0])
        assert i == 0 or len(h.memory.text.split()) <= 35 + 4
    # a turn no longer than `excerpt_length` is read whole
    short = {"s": _turns("s", ["We paid 40 euros a night for the room."], "2026-03-01")}
    hits, _ = _pack_cut([("s", 0)], short, 160, "room price", 35)
    assert "excerpts" not in hits[0].memory.metadata


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab .,\n\t-é"), min_size=0, max_size=30),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 60),
    st.sampled_from(["words", "tokens"]),
)
def test_a_capped_cost_is_the_cost_up_to_the_cap(parts: list[str], cap: int, unit: str) -> None:
    from reflective_memory.retrieval.passages import _Costs

    text = " ".join(parts) or "x"
    base = count_tokens if unit == "tokens" else (lambda t: len(t.split()))
    counted: list[int] = []

    def count(t: str) -> int:
        counted.append(len(t))
        return base(t)

    sessions = {"s": _turns("s", [text], "2026-03-01")}
    capped = _Costs(_votes([("s", 0)]), sessions.__getitem__, count, True, {})
    got = [capped.capped(("s", 0), c) for c in (cap, cap + 7, cap)]
    exact = base(f"user: {text}")
    assert got == [min(c, exact) for c in (cap, cap + 7, cap)]
    if exact > 8 * (cap + 8):  # a long line is told from its opening, never counted whole
        assert max(counted) < len(f"user: {text}")


def test_a_long_line_is_not_counted_whole_to_be_cut() -> None:
    notes = [
        f"We paid {40 + i} euros a night. " + "The river walk was long and lovely. " * 60
        for i in range(6)
    ]
    sessions = {f"s{i}": _turns(f"s{i}", [n], f"2026-03-0{i + 1}") for i, n in enumerate(notes)}
    counted: list[int] = []

    def count(t: str) -> int:
        counted.append(len(t))
        return len(t.split())

    from reflective_memory.retrieval.passages import pack_passages

    order = [(f"s{i}", 0) for i in range(6)]
    hits, used, _ = pack_passages(
        "u",
        _votes(order),
        sessions.__getitem__,
        count,
        k=None,
        budget=200,
        query_terms=lexical_tokens("What did we pay a night?"),
        excerpt_length=35,
        length_exponent=0.5,
    )
    assert used <= 200 and len(hits) == 2  # the clearest match cut to the room it leaves
    assert all("euros a night" in h.memory.text for h in hits)
    # only the clearest match is counted whole (is it read whole?); the rest are cut at sight
    assert sum(n >= len(notes[0]) for n in counted) == 1


def test_retrieve_reads_the_part_of_a_long_answer_that_holds_the_question() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        mem.add_turn("u", "dnd", "user", "Write a one-shot for my group.", timestamp="2026-03-01")
        mem.add_turn("u", "dnd", "assistant", STAT_BLOCK, timestamp="2026-03-01T10:01:00")
        _add(mem, "u", "pets", PETS, "2026-03-02")
        r = mem.retrieve("u", "How many giant crabs guard the reading room?", budget_tokens=120)
        text = "\n".join(h.memory.text for h in r.hits)
        assert "giant crabs (3)" in text
        used = sum(count_tokens(h.memory.text) for h in r.hits)
        assert used <= 120 and r.diagnostics["passages"]["tokens_used"] == used  # exact count
        assert any(h.memory.metadata.get("excerpts") for h in r.hits)
        assert count_tokens(STAT_BLOCK) > 120


def test_a_recent_turn_far_from_the_question_does_not_compete_on_time() -> None:
    """Close fused votes (a small history) do not let "Tusen takk!" win on recency alone."""
    from reflective_memory.retrieval.turn_votes import RECENCY_RELEVANCE, recency_ranks

    sessions = {
        "old": _turns("old", ["I'm allergic to peanuts."], "2025-01-12"),
        "new": _turns("new", ["Tusen takk!"], "2026-03-10"),
        "move": _turns("move", ["I moved to Oslo last month."], "2026-03-11"),
    }
    cosine = {("old", 0): 0.46, ("new", 0): 0.09, ("move", 0): 0.05}
    votes = _votes([("old", 0), ("new", 0)])
    votes.add(("move", 0), 0.2 / 61, None)
    assert cosine[("new", 0)] < RECENCY_RELEVANCE * cosine[("old", 0)]
    ranks = recency_ranks(votes, sessions.__getitem__, relevance=cosine.get)
    assert ranks == {}  # only the allergy is near the question: nothing newer competes
    again = recency_ranks(votes, sessions.__getitem__)  # without cosines, every one competes
    assert again[("new", 0)] > again[("old", 0)]


def test_for_a_when_question_only_turns_that_name_a_time_compete_on_recency() -> None:
    """A "when is" question: the newest date given wins, not a newer turn without a date."""
    from reflective_memory.retrieval.features import names_a_time
    from reflective_memory.retrieval.turn_votes import recency_ranks

    sessions = {
        "mar": _turns("mar", ["The wedding is on June 14 in Gothenburg."], "2025-03-01"),
        "may": _turns("may", ["The wedding got moved, it's now on September 6."], "2025-05-01"),
        "oct": _turns("oct", ["Also, the wedding was beautiful."], "2025-10-01"),
    }
    votes = _votes([("oct", 0), ("may", 0), ("mar", 0)])

    def dated(key: tuple[str, int]) -> bool:
        return names_a_time(sessions[key[0]][key[1]], beyond_its_day=True)

    assert [dated(k) for k in votes.turn] == [False, True, True]
    anyone = recency_ranks(votes, sessions.__getitem__)
    assert max(anyone, key=anyone.__getitem__) == ("oct", 0)
    ranks = recency_ranks(votes, sessions.__getitem__, answers=dated)
    assert ranks == {("may", 0): 1.0, ("mar", 0): 0.0}


def test_a_turn_that_says_today_dates_what_it_tells_but_no_other_day() -> None:
    """ "I got this today" answers "When did ...?" by its own date; no newer plan it names."""
    from reflective_memory.retrieval.features import FEATURES, QuestionSignals, turn_features

    sessions = {
        "mar": _turns("mar", ["Lena got engaged! The wedding is on 6 September."], "2025-03-01"),
        "apr": _turns("apr", ["I bought a cheese tart at the bakery."], "2025-04-02"),
        "jun": _turns("jun", ["I booked the flights for Lena's wedding today."], "2025-06-01"),
    }
    votes = _votes([("jun", 0), ("mar", 0), ("apr", 0)])
    when = QuestionSignals(present=True, when=True)
    got = turn_features(votes, sessions.__getitem__, {}, when, rrf_k=60)
    row = {
        k: dict(zip(FEATURES, r, strict=True)) for k, r in zip(got.keys, got.matrix, strict=True)
    }
    # "today" dates the booking (the `dated` cue the ranker was fitted with) ...
    assert [row[k]["dated"] for k in (("mar", 0), ("jun", 0), ("apr", 0))] == [1.0, 1.0, 0.0]
    # ... but it is no newer date for the wedding: only March's date competes, so none is newer
    assert all(r["recent"] == 0.0 for r in row.values())
    asked = turn_features(votes, sessions.__getitem__, {}, QuestionSignals(), rrf_k=60)
    assert not asked.matrix[:, FEATURES.index("dated")].any()  # not a question about a time


def test_sessions_without_times_compete_in_the_order_they_were_stored() -> None:
    """An import without times gives every turn one time: the stored order stands for it."""
    from dataclasses import replace

    from reflective_memory.retrieval.turn_votes import recency_ranks

    texts = {"a": ["I live in Leeds.", "Leeds is rainy."], "b": ["I moved to Bristol."]}
    one_time = datetime(2026, 3, 1, tzinfo=timezone.utc)
    seq = iter(range(1, 10))
    sessions = {
        sid: [replace(t, timestamp=one_time, seq=next(seq)) for t in _turns(sid, ts, "2026-03-01")]
        for sid, ts in texts.items()
    }
    ranks = recency_ranks(_votes([("a", 0), ("a", 1), ("b", 0)]), sessions.__getitem__)
    assert ranks == {("a", 0): 0.0, ("a", 1): 0.0, ("b", 0): 1.0}  # one session's turns tie
    alone = recency_ranks(_votes([("a", 0), ("a", 1)]), sessions.__getitem__)
    assert alone == {}  # one conversation: nothing is newer


@pytest.mark.integration
def test_small_talk_in_the_newest_session_is_not_the_answer_to_a_present_question() -> None:
    # "What am I allergic to?" reads as present tense ("am I"); in a short history every fused
    # vote is within the recency margin, so the newest turn won on time alone
    with ReflectiveMemory(config=_cfg()) as mem:
        first = [
            "I live in Lyon, in a small flat near the old town.",
            "Lyon is a lovely city to live in.",
            "I'm allergic to peanuts, so I always read the labels when I buy snacks.",
            "I will keep your peanut allergy in mind.",
        ]
        _add(mem, "u", "s1", first, "2025-01-12")
        _add(mem, "u", "s2", ["I signed up for a sourdough course.", "How exciting!"], "2025-11-02")
        _add(mem, "u", "s3", ["Tusen takk!", "Bare hyggelig!"], "2025-11-20")
        for k in (1, 3):
            hits = mem.retrieve("u", "What am I allergic to?", k=k).hits
            assert "peanuts" in hits[0].memory.text, [h.memory.text for h in hits]


def test_passage_hits_carry_relevance_from_the_units_that_voted() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg()) as mem:
        _add(mem, "u", "s1", PETS, "2026-03-01")
        mem.end_session("u", "s1")
        r = mem.retrieve("u", "what colour is Pixel's leash?", budget_tokens=80)
        assert r.hits and all(h.memory.granularity == "passage" for h in r.hits)
        assert 0 < r.hits[0].relevance <= 1 and "dense" in r.hits[0].scores


@pytest.mark.parametrize(
    "bad",
    [
        {"passages": {"length_exponent": -1}},
        {"passages": {"length_free": 0}},
        {"passages": {"length_keep_share": 1.5}},
        {"passages": {"context_weight": "high"}},
        {"passages": {"speaker_focus": 1}},
        {"passages": {"recency": "yes"}},
    ],
)
def test_passage_settings_are_validated(bad: dict) -> None:
    from reflective_memory.errors import ConfigError

    with pytest.raises(ConfigError, match=next(iter(bad["passages"]))):
        MemoryConfig(**bad)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What sports does Kate like?", "Kate"),
        ("what are kate's hobbies", "Kate"),
        ("Where is Kate’s flat?", "Kate"),
        ("Did Kate meet Sam's sister?", None),  # two speakers named: no focus
        ("Who is Katerina?", None),  # a longer name is not Kate
        ("What did we talk about?", None),
    ],
)
def test_named_speaker(query: str, expected: str | None) -> None:
    from reflective_memory.retrieval.cues import named_speaker

    assert named_speaker(query, ["Kate", "Sam"]) == expected


def test_without_name_keeps_what_the_question_asks() -> None:
    from reflective_memory.retrieval.cues import without_name

    assert without_name("What are Kate's hobbies?", "Kate") == "What are hobbies?"
    assert without_name("Is Kate’s dog big?", "kate") == "Is dog big?"
    assert without_name("Kate?", "Kate") == "Kate?"  # nothing left to search with


KATE_AND_SAM = [
    ("Sam", "Hey Kate! How was your weekend, Kate?"),
    ("Kate", "Pretty good, I played badminton with my cousins on Saturday."),
    ("Sam", "Kate, you always have the best weekends, Kate!"),
    ("Kate", "I also went ice skating, I love it."),
    ("Sam", "Sports are great. I played tennis and basketball with Kate's brother."),
    ("Kate", "The weather was lovely too."),
]


def _chat(mem: ReflectiveMemory) -> None:
    for i, (who, text) in enumerate(KATE_AND_SAM):
        # one conversation: minutes apart (a day's silence would start a new one, whose first
        # turn has position 0: `turn_votes.conversation_bounds`)
        mem.add_turn("u", "s1", who, text, timestamp=f"2026-01-01T10:{i:02d}:00")
    mem.end_session("u", "s1")


def test_a_question_about_one_speaker_is_answered_from_what_they_said() -> None:
    """The name picks whose turns answer; the rest of the question picks which ones."""
    cfg = _cfg(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        _chat(mem)
        r = mem.retrieve("u", "What sports does Kate play?", k=2)
        assert r.diagnostics["speaker"] == "Kate"
        assert r.diagnostics["search_query"] == "What sports does play?"
        assert r.diagnostics["passages"]["speaker"] == "Kate"
        texts = [h.memory.text for h in r.hits]
        assert all("Kate: " in t and "Sam: " not in t for t in texts), texts
        neutral = mem.retrieve("u", "What sports were played?", k=2)  # nobody named
        assert "speaker" not in neutral.diagnostics
    off = _cfg(units={"granularities": ("turn",)}, passages={"speaker_focus": False})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=off) as mem:
        _chat(mem)
        r = mem.retrieve("u", "What sports does Kate play?", k=2)
        assert "speaker" not in r.diagnostics
        assert any("Sam: " in h.memory.text for h in r.hits)  # the name pulls Sam's turns in


def test_speaker_focus_reads_names_written_into_user_assistant_turns() -> None:
    """A chat app keeping `user` / `assistant` roles with `Name: text` gets speaker focus too."""
    cfg = _cfg(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        for i, (who, text) in enumerate(KATE_AND_SAM):
            role = "user" if who == "Kate" else "assistant"
            mem.add_turn("u", "s1", role, f"{who}: {text}", timestamp=f"2026-01-0{1 + i // 2}")
        mem.add_turn("u", "s1", "user", "Note: bring the racket.")  # one label is no speaker
        mem.end_session("u", "s1")
        r = mem.retrieve("u", "What sports does Kate play?", k=2)
        assert r.diagnostics["speaker"] == "Kate"
        texts = [h.memory.text for h in r.hits]
        assert all("Kate: " in t and "Sam: " not in t for t in texts), texts
        assert "speaker" not in mem.retrieve("u", "Any note about sports?", k=2).diagnostics


def test_person_focus_picks_the_users_or_the_assistants_turns() -> None:
    """In a user/assistant chat "I/my" asks for the user's words, "you said" the assistant's."""
    from reflective_memory.retrieval.cues import addressed_role

    assert addressed_role("What did you suggest for my trip to Lisbon?") == "assistant"
    assert addressed_role("Where did I say my sister lives?") == "user"
    assert addressed_role("When is the Lisbon trip?") is None
    # a request is answered from the user's own words; a question back to an earlier chat
    # may be answered by either side; what the assistant made or wrote is the assistant's
    assert addressed_role("Can you suggest a book I would like?") == "user"
    assert addressed_role("Could you recommend a show for me to watch tonight?") == "user"
    assert addressed_role("Can you remind me which trail I should take?") is None
    assert addressed_role("In our previous chat, what name did we pick?") is None
    assert addressed_role("What was the move you made after Kg2?") == "assistant"
    chat = [
        ("user", "Can you recommend a restaurant in Lisbon?"),
        ("assistant", "Try Taberna da Rua das Flores, near Chiado."),
        ("assistant", "Your sister in Porto sounds lovely; do you visit her often?"),
        ("user", "Every May."),
    ]

    def scored(person_focus: bool, question: str) -> tuple[str | None, dict[str, float]]:
        cfg = _cfg(units={"granularities": ("turn",)}, passages={"person_focus": person_focus})
        with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
            for i, (role, text) in enumerate(chat):
                mem.add_turn("u", "s1", role, text, timestamp=f"2026-02-0{1 + i}")
            mem.end_session("u", "s1")
            r = mem.retrieve("u", question, k=len(chat))
            lines = {h.memory.text.split("\n")[1]: h.score for h in r.hits}
            return r.diagnostics.get("speaker"), lines

    def top(lines: dict[str, float]) -> str:
        return max(lines, key=lines.__getitem__)

    asked_you, asked_i = "Which restaurant in Lisbon did you recommend?", "When do I visit Porto?"
    off_you, off_i = scored(False, asked_you), scored(False, asked_i)
    assert off_you[0] is None and top(off_you[1]).startswith("user:")  # the user's words
    assert off_i[0] is None and top(off_i[1]).startswith("assistant:")
    on_i = scored(True, asked_i)
    assert on_i[0] == "user" and top(on_i[1]).startswith("user:")
    # "you recommended": the user's turns lose the same share of their weight, the assistant's
    # keep theirs (here the user's words still lead; the ranker weighs words and person alike)
    on_you = scored(True, asked_you)
    assert on_you[0] == "assistant"
    kept = {line: on_you[1][line] / off_you[1][line] for line in off_you[1]}
    assert all(v == pytest.approx(1.0) for line, v in kept.items() if line.startswith("assistant"))
    shrunk = [v for line, v in kept.items() if line.startswith("user:")]
    assert shrunk and shrunk[0] < 0.5 and all(v == pytest.approx(shrunk[0]) for v in shrunk)


def test_other_speakers_are_the_turns_the_named_speaker_did_not_say() -> None:
    from reflective_memory.retrieval.turn_votes import other_speakers

    sessions = {"s": _turns("s", ["I love badminton.", "Kate loves badminton!"], "2026-01-01")}
    sessions["s"][1] = replace(sessions["s"][1], role="Sam")
    sessions["s"][0] = replace(sessions["s"][0], role="Kate")
    votes = _votes([("s", 1), ("s", 0)])
    assert other_speakers(votes, sessions.__getitem__, "kate") == [("s", 1)]
    assert other_speakers(votes, sessions.__getitem__, "Sam") == [("s", 0)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["user", "assistant", "Kate", "human"]),
            st.sampled_from(["", "Emi: ", "user: ", "assistant: ", "Kate: ", "kate: ", "Note: "]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([None, ("user", "assistant"), ("Kate", "Emi"), ("Emi", "user")]),
    st.sampled_from(["user", "Emi", "kate", "assistant"]),
)
def test_speaker_focus_reads_labels_only_where_they_can_count(turns, speakers, speaker) -> None:
    from reflective_memory.retrieval.speakers import speaker_of
    from reflective_memory.retrieval.turn_votes import other_speakers

    texts = [f"{label}we met at the lake" for _, label in turns]
    sessions = {"s": _turns("s", texts, "2026-01-01")}
    sessions["s"] = [replace(t, role=r) for t, (r, _) in zip(sessions["s"], turns, strict=True)]
    votes = _votes([("s", i) for i in range(len(turns))])
    others = set(other_speakers(votes, sessions.__getitem__, speaker, speakers))
    for i, t in enumerate(sessions["s"]):  # the rule, read from every turn's label
        who = speaker_of(t)
        who = t.role if speakers is not None and who not in speakers else who
        same = who.strip().casefold() == speaker.casefold()
        assert (("s", i) in others) is not same


def test_a_lone_label_is_not_a_speaker_and_quoted_turns_keep_their_vote() -> None:
    """ "Remember: ..." from the user is the user's turn; a query quoting a turn finds it."""
    from reflective_memory.retrieval.turn_votes import other_speakers

    texts = ["Remember: my sister Lea lives in Porto.", "Saved: my sister Lea lives in Porto."]
    sessions = {"s": _turns("s", texts, "2026-01-01")}
    sessions["s"][1] = replace(sessions["s"][1], role="assistant")
    votes = _votes([("s", 0), ("s", 1)])
    roles = ("user", "assistant")
    # not "Remember"'s turn: the user's
    assert other_speakers(votes, sessions.__getitem__, "user", roles) == [("s", 1)]
    asked: list[str] = []

    def quoted(turn) -> bool:
        asked.append(turn.turn_id)
        return turn.turn_id == "s:1"

    assert other_speakers(votes, sessions.__getitem__, "user", roles, quoted) == []
    assert asked == ["s:1"]  # only the other speaker's turns are asked
    # end to end: a first-person question finds the user's "Remember: ..." turn, and the
    # assistant's "I ..." turn is found by its own words
    chat = [
        ("user", "Hi! I just adopted a grey cat named Miso."),
        ("assistant", "I love cats; Miso is a lovely name for a grey one."),
        ("user", "Remember: my sister Lea lives in Porto."),
        ("assistant", "I saved it: your sister Lea lives in Porto."),
        ("user", "I'm also training for the Lyon half marathon in April."),
        ("assistant", "I think a 12-week plan with one long run a week works well."),
    ]
    cfg = _cfg(passages={"person_focus": True})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        for i, (role, text) in enumerate(chat):
            mem.add_turn("u", "s1", role, text, timestamp=f"2026-02-0{1 + i}")
        mem.end_session("u", "s1")
        top = mem.retrieve("u", "Which city does my sister live in?", k=1).hits[0].memory
        assert top.text.endswith("user: Remember: my sister Lea lives in Porto.")
        for role, text in chat:
            hits = [h.memory.text for h in mem.retrieve("u", text, k=2).hits]
            assert any(h.endswith(f"{role}: {text}") for h in hits), text


def _votes_of(mem: ReflectiveMemory, query: str, budget: int) -> list[tuple[tuple[str, ...], list]]:
    r = mem.retrieve("u", query, budget_tokens=budget)
    return [(h.memory.turn_ids, h.memory.metadata["turn_votes"]) for h in r.hits]


def test_segment_votes_weigh_the_same_at_every_budget() -> None:
    """A segment votes `context_weight` for its turns at any budget (no small-budget scaling)."""
    mem = ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg())
    _add(mem, "u", "pets", PETS, "2025-03-01")
    _add(mem, "u", "work", WORK, "2025-03-02")
    for s in ("pets", "work"):
        mem.end_session("u", s)
    q = "how often do you walk Pixel on weekends?"
    with mem:
        small, large = (
            {t: v for ids, votes in _votes_of(mem, q, b) for t, v in zip(ids, votes, strict=True)}
            for b in (100, 1000)
        )
        shared = set(small) & set(large)
        assert shared and all(small[t] == large[t] for t in shared)
    from reflective_memory.errors import ConfigError

    with pytest.raises(ConfigError, match="context_full_budget"):
        MemoryConfig(passages={"context_full_budget": 1000})
    with pytest.raises(ConfigError, match="removed"):
        MemoryConfig(context_full_budget=1000)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"passages": {"ranker": "rules"}}, "'rules' was removed: the learned ranker replaces it"),
        ({"passages": {"recency_weight": 0.25}}, "passages.recency_weight is now passages.recency"),
        ({"passages": {"time_weight": 0.5}}, "passages.time_weight is now passages.time_frame"),
        ({"passages": {"recency_margin": 0.1}}, "passages.recency_margin was removed"),
        ({"passages": {"speaker_focus": 0.8}}, "passages.speaker_focus must be True or False"),
        ({"passages": {"person_focus": 0.3}}, "passages.person_focus must be True or False"),
        ({"recency_margin": 0.1}, "recency_margin was removed"),
        ({"recency_weight": 0.25}, "passages.recency must be True or False, got 0.25"),
    ],
)
def test_the_rules_rankers_settings_say_what_replaced_them(given: dict, said: str) -> None:
    """The cue settings switch cues on or off; their old weights and the rules are gone."""
    import re
    import warnings

    from reflective_memory.errors import ConfigError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the flat names of 0.1
        with pytest.raises(ConfigError, match=re.escape(said)):
            MemoryConfig(**given)
    if "passages" in given:
        with pytest.raises(ConfigError, match=re.escape(said)):
            MemoryConfig().replace(**given)


#: Per cue switch: a question that raises the cue, and whether the retrieval state shows it.
CUE_QUESTIONS = {
    "speaker_focus": ("What sports does Kate play?", lambda st: st.speaker == "Kate"),
    "person_focus": ("Where do I play badminton?", lambda st: st.speaker == "user"),
    "recency": ("What sport do I play these days?", lambda st: st.recency),
    "time_frame": ("Which sport did I play two days ago?", lambda st: st.frame is not None),
}


@pytest.mark.parametrize("switch", sorted(CUE_QUESTIONS))
def test_each_cue_switch_turns_its_cue_off(switch: str) -> None:
    question, shows = CUE_QUESTIONS[switch]
    for on in (True, False):
        cfg = _cfg(units={"granularities": ("turn",)}, passages={switch: on})
        with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
            for i, (who, text) in enumerate(KATE_AND_SAM):
                # Kate and Sam by name, or the two roles of a user/assistant chat
                role = who if switch == "speaker_focus" else ("user", "assistant")[i % 2]
                mem.add_turn("u", "s1", role, text, timestamp=f"2026-01-0{1 + i // 2}")
            mem.end_session("u", "s1")
            state = mem.retriever.state(mem.retriever.request("u", question, 2, None, *[None] * 6))
            assert bool(shows(state)) is on, (switch, on)


def test_with_every_cue_off_the_cue_stage_does_not_run() -> None:
    off = dict.fromkeys(CUE_QUESTIONS, False)
    for passages, runs in ((off, False), ({**off, "recency": True}, True), ({}, True)):
        with ReflectiveMemory(embedder=HashingEmbedder(128), config=_cfg(passages=passages)) as m:
            request = m.retriever.request("u", "What sports does Kate play?", 2, None, *[None] * 6)
            assert ("cues" in [stage.name for stage in m.retriever.stages(request)]) is runs


def test_a_present_tense_cue_is_not_searched_as_words() -> None:
    """ "these days" says when, not what: it must not pull up turns about days."""
    chat = [
        ("2025-05-01", "I found a sublet in Friedrichshain, I live there until July."),
        ("2025-06-01", "Rainy days in Berlin; these days I mostly stay in on grey days."),
        ("2025-08-02", "I live in Neukölln now, the flat is great."),
    ]
    cfg = _cfg(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        for i, (day, text) in enumerate(chat):
            mem.add_turn("u", f"s{i}", "user", text, timestamp=day)
            mem.end_session("u", f"s{i}")
        r = mem.retrieve("u", "Where do I live these days?", k=2)
        assert r.diagnostics["search_query"] == "Where do I live?"
        assert r.hits[0].memory.session_id == "s2"


def test_labelled_speakers_read_without_the_role_in_passages() -> None:
    """`user: Emi: ...` costs a word per turn for nothing; a lone `Remember:` keeps its role."""
    chat = [
        ("user", "Emi: I booked the pottery class for Saturday."),
        ("assistant", "Paola: Great, which studio did you pick?"),
        ("user", "Emi: The one near the harbour, Clay Corner."),
        ("assistant", "Paola: I went there with my sister last spring."),
        ("user", "Emi: Then you can show me the wheel."),
        ("assistant", "Paola: Deal, I will bring aprons."),
        ("user", "Remember: the class starts at 10."),
    ]
    with ReflectiveMemory(embedder=HashingEmbedder(128)) as mem:
        for i, (role, text) in enumerate(chat):
            mem.add_turn("u", "s1", role, text, timestamp=f"2026-02-0{1 + i}")
        mem.end_session("u", "s1")
        text = mem.retrieve("u", "pottery class studio harbour wheel", budget_tokens=400).hits[0]
        lines = text.memory.text.splitlines()[1:]
        assert "Emi: I booked the pottery class for Saturday." in lines
        assert "Paola: Great, which studio did you pick?" in lines
        assert "user: Remember: the class starts at 10." in lines
        assert not any(ln.startswith(("user: Emi", "assistant: Paola")) for ln in lines)


def test_lowercase_labels_name_speakers_and_stay_out_of_dense_vectors() -> None:
    """`elise: ...` names a speaker as `Elise: ...` does; vectors are of the words said."""
    from reflective_memory.retrieval.speakers import speaker_of, utterance
    from reflective_memory.types import Turn

    turn = Turn("u", "s", "assistant", "elise: I bought a blue kettle today.", "s:0", 0)
    assert speaker_of(turn) == "elise"
    assert utterance(turn) == "I bought a blue kettle today."
    named = replace(turn, role="elise")  # a speaker stored as the role keeps its text
    assert speaker_of(named) == "elise" and utterance(named) == named.text
    chat = [
        ("user", "kate: I adopted a parrot called Kiwi."),
        ("assistant", "elise: I bought a blue kettle today."),
        ("user", "kate: Kiwi already says hello."),
        ("assistant", "elise: My kettle whistles like a parrot."),
        ("user", "kate: Kiwi would love that kettle."),
        ("assistant", "elise: I will bring the kettle over."),
    ]
    for speaker_keys in (True, False):
        emb = CountingEmbedder()
        cfg = _cfg(units={"speaker_keys": speaker_keys})
        with ReflectiveMemory(embedder=emb, config=cfg) as mem:
            for i, (role, text) in enumerate(chat):
                mem.add_turn("u", "s1", role, text, timestamp=f"2026-02-0{1 + i}")
            mem.end_session("u", "s1")
            said = [t.split(": ", 1)[1] for _, t in chat]
            assert emb.texts[: len(chat)] == (said if speaker_keys else [t for _, t in chat])
            if speaker_keys:  # the question names elise: her turns come first
                r = mem.retrieve("u", "What did Elise buy?", k=2)
                assert r.diagnostics["speaker"] == "elise"
                assert all("elise: " in h.memory.text for h in r.hits)


def test_recency_orders_sessions_not_turns_within_one() -> None:
    """A later turn of the same conversation is no update: recency compares session times."""
    from reflective_memory.retrieval.turn_votes import TurnVotes, recency_ranks

    sessions = {
        "old": _turns("old", ["I live in Alfama."], "2025-01-12"),
        "new": _turns("new", ["I moved to Berlin.", "Berlin is grey in winter."], "2025-05-18"),
    }
    votes = TurnVotes()
    for key, v in {("new", 0): 1.0, ("new", 1): 0.97}.items():
        votes.add(key, v, None)
    assert recency_ranks(votes, sessions.__getitem__) == {}  # one session: no order in time
    votes.add(("old", 0), 0.99, None)
    ranks = recency_ranks(votes, sessions.__getitem__)
    assert ranks == {("new", 0): 1.0, ("new", 1): 1.0, ("old", 0): 0.0}
