"""Turns of an open session rank as they will once their session ends (issue 27).

Ended turns get a context vote from their segments; an open session has none yet, so its
turns stand in for them (`collect_votes`' `provisional`). Each turn queried with its own text
must come back in the top 5, in open and ended sessions alike.
"""

from __future__ import annotations

import math
from importlib import resources

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.io import load_conversations
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.redundancy import SHORT_WORDS
from reflective_memory.retrieval.turn_votes import collect_votes
from reflective_memory.retrieval.votes import UserTurns
from reflective_memory.text import short_words
from reflective_memory.types import Turn

SESSIONS = {
    "s1": [
        ("user", "I just adopted a dog from the shelter, his name is Pretzel."),
        ("assistant", "Congratulations! How old is Pretzel?"),
        ("user", "He is two years old, a beagle mix with a lot of energy."),
        ("assistant", "Beagles love long walks and sniffing around the park."),
        ("user", "We walk every morning along the river before work."),
        ("assistant", "A morning walk by the river sounds like a great routine."),
        ("user", "My neighbour recommended a trainer for his leash pulling."),
        ("assistant", "A trainer can help a lot with leash pulling in a few weeks."),
    ],
    "s2": [
        ("user", "I am planning a trip to Lisbon in September with my sister."),
        ("assistant", "Lisbon in September is lovely. How long will you stay?"),
        ("user", "Five days, and we want to take a day trip to Sintra."),
        ("assistant", "Sintra is worth it; book the palace tickets in advance."),
        ("user", "My sister wants to try the custard tarts in Belem."),
        ("assistant", "The pastries in Belem are famous, expect a queue in the morning."),
        ("user", "Who will look after Pretzel while I travel is still open."),
        ("assistant", "A pet sitter or a friend could look after Pretzel for five days."),
    ],
    "s3": [
        ("user", "I started learning Portuguese on an app before the trip."),
        ("assistant", "Nice! Practising a little every day helps most."),
        ("user", "I practise twenty minutes each evening after dinner."),
        ("assistant", "Twenty minutes a day adds up quickly over a few months."),
        ("user", "The pronunciation of the nasal vowels is the hardest part."),
        ("assistant", "Nasal vowels take time; listening to podcasts helps."),
        ("user", "My colleague from Porto offered to have coffee and talk with me."),
        ("assistant", "Talking with a native speaker over coffee is great practice."),
    ],
    "open": [
        ("user", "Pretzel had his first session with the trainer today."),
        ("assistant", "How did it go with the trainer?"),
        ("user", "He pulled less on the leash by the end of the hour."),
        ("assistant", "That is quick progress for a first session."),
        ("user", "My sister booked the flights to Lisbon for the twelfth."),
        ("assistant", "Great, the trip is getting real. Did you find a pet sitter?"),
        ("user", "My neighbour will look after Pretzel while we are away."),
        ("assistant", "Good, the neighbour already knows Pretzel."),
        ("user", "I also practised Portuguese for twenty minutes with the app."),
        ("assistant", "Keep it up, you will manage at the pastry shop in Belem."),
    ],
}


def _fill(mem: ReflectiveMemory, sessions: dict[str, list[tuple[str, str]]], open_sid: str) -> None:
    for i, (sid, turns) in enumerate(sessions.items()):
        mem.add_turns(
            [
                {
                    "user_id": "u",
                    "session_id": sid,
                    "role": role,
                    "text": text,
                    "timestamp": f"2024-0{i + 1}-01T10:{j:02d}:00",
                    "turn_id": f"{sid}-{j}",
                }
                for j, (role, text) in enumerate(turns)
            ]
        )
        if sid != open_sid:
            mem.end_session("u", sid)


def _misses(mem: ReflectiveMemory, user: str) -> dict[bool, list[str]]:
    """Turn ids not in the top 5 for their own text, by whether their session is open.

    A turn of a few words ("Good luck!") is never one of `k` turns of its own
    (`retrieval.redundancy`), so it is not asked for.
    """
    open_sessions = set(mem.open_sessions(user))
    misses: dict[bool, list[str]] = {True: [], False: []}
    for t in mem.turns(user):
        words = short_words(t.text)
        if words is not None and len(words) <= SHORT_WORDS:
            continue
        hits = mem.retrieve(user, t.text, k=5).hits
        if t.turn_id not in {tid for h in hits for tid in h.memory.turn_ids}:
            misses[t.session_id in open_sessions].append(t.turn_id)
    return misses


def test_open_session_turns_are_found_by_their_own_text() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        _fill(mem, SESSIONS, "open")
        assert mem.open_sessions("u") == ["open"]
        assert _misses(mem, "u") == {True: [], False: []}


def _vote_of(mem: ReflectiveMemory, query: str, key: tuple[str, int]) -> float:
    """A turn's vote as `collect_votes` casts it, before the learned ranker weighs it."""
    r = mem.retriever
    state = r.state(r.request("u", query, 1, None, *[None] * 6))
    assert state.features is not None
    row = state.features.keys.index(key)
    log_vote = state.features.matrix[row, FEATURES.index("log_vote")]
    return math.exp(log_vote) / (mem.config.search.rrf_k + 1)


def test_an_open_turn_votes_as_it_will_once_its_session_ends() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        _fill(mem, SESSIONS, "open")
        text = SESSIONS["open"][2][1]
        before = mem.retrieve("u", text, k=1).hits[0]
        vote_before = _vote_of(mem, text, ("open", 2))
        mem.end_session("u", "open")
        after = mem.retrieve("u", text, k=1).hits[0]
        vote_after = _vote_of(mem, text, ("open", 2))
    assert before.memory.turn_ids == after.memory.turn_ids == ("open-2",)
    # own key at rank 0 plus a context vote from a unit ranked like itself: what an ended
    # turn gets when its segment is ranked right behind it, and never more than that
    assert vote_after <= vote_before == pytest.approx(1.25 / 61)
    assert vote_after > 1 / 61


def test_only_turns_no_segment_covers_are_provisional() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        _fill(mem, SESSIONS, "open")
        turns = UserTurns(mem.store)
        index = mem.indexes.get("u")
        got = turns.provisional("u", index)
        by_id = {m.id: m for m in mem.memories("u")}
        assert sorted(by_id[i].turn_ids[0] for i in got) == sorted(
            f"open-{j}" for j in range(len(SESSIONS["open"]))
        )
        mem.end_session("u", "open")
        assert turns.provisional("u", mem.indexes.get("u")) == frozenset()


def test_turn_only_units_get_no_stand_in_vote() -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(config=cfg, embedder=HashingEmbedder()) as mem:
        _fill(mem, SESSIONS, "open")
        text = SESSIONS["open"][2][1]
        hit = mem.retrieve("u", text, k=1).hits[0]
        vote = _vote_of(mem, text, ("open", 2))
    assert hit.memory.turn_ids == ("open-2",) and vote == pytest.approx(1 / 61)


def test_collect_votes_adds_the_context_vote_to_provisional_turns_only() -> None:
    from datetime import datetime, timezone

    from reflective_memory.types import Memory

    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    turns = {
        s: [
            Turn(user_id="u", session_id=s, role="user", text="x", turn_id=f"{s}{i}", position=i)
            for i in range(2)
        ]
        for s in ("a", "b")
    }

    def unit(mid: str, sid: str, pos: int) -> Memory:
        return Memory(
            id=mid,
            user_id="u",
            session_id=sid,
            granularity="turn",
            text="x",
            key="x",
            turn_ids=(f"{sid}{pos}",),
            created_at=now,
            updated_at=now,
        )

    ranked = [unit("ta", "a", 0), unit("tb", "b", 0)]
    votes = collect_votes(
        ranked, turns.__getitem__, rrf_k=60, context_weight=0.25, provisional={"tb"}
    )
    assert votes.turn[("a", 0)] == pytest.approx(1 / 61)
    assert votes.turn[("b", 0)] == pytest.approx(1.25 / 62)
    assert votes.sources[("b", 0)] == ["tb"]


@pytest.mark.integration
def test_demo_with_its_last_session_open_finds_every_turn_by_its_text() -> None:
    src = resources.files("reflective_memory") / "data" / "demo_conversation.json"
    with resources.as_file(src) as path:
        conv = load_conversations(path)[0]
    last = conv.sessions[-1].session_id
    with ReflectiveMemory() as mem:
        for s in conv.sessions:
            mem.add_turns([{**t, "user_id": "maya", "session_id": s.session_id} for t in s.turns])
            if s.session_id != last:
                mem.end_session("maya", s.session_id)
        assert mem.open_sessions("maya") == [last]
        misses = _misses(mem, "maya")
    assert misses == {True: [], False: []}
