"""Short turns ride with their anchor; near-duplicates count once (`retrieval.redundancy`)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.retrieval.redundancy import (
    SAID_AGAIN,
    SHORT_WORDS,
    Distinct,
    collapse_duplicates,
    is_short,
    lifting,
    ride,
    riders,
)
from reflective_memory.retrieval.turn_votes import TurnVotes
from reflective_memory.types import Turn


def _session(*texts: str, sid: str = "s") -> dict[str, list[Turn]]:
    return {sid: [Turn("u", sid, "user", t, f"{sid}:{i}", i) for i, t in enumerate(texts)]}


def _reader(sessions: dict[str, list[Turn]]):
    return sessions.__getitem__


def _votes(scores: dict[tuple[str, int], float]) -> TurnVotes:
    votes = TurnVotes()
    for i, (key, v) in enumerate(scores.items()):
        votes.turn[key] = v
        votes.first_seen[key] = i
    return votes


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Can you give me dinner idea number 7 for this week?", "... number 8 for this week?", 0),
        ("Can you give me dinner idea number 7 for this week?",
         "Can you give me dinner idea number 8 for this week?", 1),
        ("I moved to Oslo in 2023.", "I moved to Oslo in 2024.", 0),  # an update stays two
        ("I am allergic to peanuts.", "I am allergic to peanuts.", 1),
        ("I am allergic to peanuts.", "I am allergic to cashews.", 0),
        ("Thanks!", "Thanks!", 0),  # short turns are never collapsed
    ],
)  # fmt: skip
def test_near_duplicates_are_the_same_words_bar_a_number(a, b, same) -> None:
    sessions = _session(a, b)
    seen = Distinct({}, _reader(sessions))
    assert seen.fresh(("s", 0))
    assert seen.fresh(("s", 1)) is not bool(same)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["thanks", "ok", "oslo", "miso", "7", "2024"]), max_size=6))
def test_short_is_a_count_of_words_in_any_script(words) -> None:
    text = " ".join(words) + "!"
    greek = text.translate(str.maketrans("thanksoklmi", "θηαναςοκλμι"))
    a, b = _session(text), _session(greek)
    assert is_short({}, _reader(a), ("s", 0)) == is_short({}, _reader(b), ("s", 0))
    assert is_short({}, _reader(a), ("s", 0)) == (len(words) <= SHORT_WORDS)


def test_a_short_turn_rides_with_the_turn_before_it_else_after() -> None:
    sessions = _session("Hi!", "Hello, what can I do for you?", "Miso soup", "Got it.", "Thanks!")
    sessions |= _session("Hi!", "Hola!", "I live in Madrid now.", sid="t")
    reader = _reader(sessions)
    keys = [("s", i) for i in range(5)] + [("t", i) for i in range(3)]
    votes = _votes(dict.fromkeys(keys, 1.0))
    anchors = riders(votes, reader, frozenset(), {})
    assert anchors == {
        ("s", 0): ("s", 1),  # the session opens short: the turn after it
        ("s", 2): ("s", 1),
        ("s", 3): ("s", 1),
        ("s", 4): ("s", 1),
        ("t", 0): ("t", 2),
        ("t", 1): ("t", 2),
    }
    votes = _votes(dict.fromkeys(keys, 1.0))
    assert riders(votes, reader, frozenset({"s:1"}), {}) == {("t", 0): ("t", 2), ("t", 1): ("t", 2)}
    assert ("s", 2) not in votes.turn  # its anchor is excluded: so is it
    only_short = _session("Hi!", "Thanks!", sid="x")
    votes = _votes({("x", 0): 1.0, ("x", 1): 1.0})
    assert riders(votes, _reader(only_short), frozenset(), {}) == {}  # they stand alone


def test_a_short_answer_lifts_its_anchor_and_is_shown_inside_its_hit() -> None:
    sessions = _session("What soup do you like best?", "Miso soup", "Got it.")
    reader = _reader(sessions)
    for passages in (True, False):
        votes = _votes({("s", 0): 1.0, ("s", 1): 5.0, ("s", 2): 0.5})
        anchors = riders(votes, reader, frozenset(), {})
        assert lifting(votes, anchors) == {("s", 0)}
        ride(votes, anchors, passages)
        assert votes.turn[("s", 0)] == 5.0
        if passages:  # right after their anchor
            assert votes.turn[("s", 1)] == votes.turn[("s", 2)] == pytest.approx(5.0 * 0.999)
        else:  # bare turns: the answer inside its anchor's hit, the acknowledgement dropped
            assert set(votes.turn) == {("s", 0)} and votes.riders == {("s", 0): [1]}


def test_the_best_of_near_duplicates_keeps_its_vote_unless_an_answer_needs_another() -> None:
    sessions = _session(
        *[f"Can you give me dinner idea number {n} for this week?" for n in range(5)]
    )
    votes = _votes({("s", n): float(n) for n in range(5)})
    gone = collapse_duplicates(votes, _reader(sessions), {})
    assert set(votes.turn) == {("s", 4)} and gone == {("s", n) for n in range(4)}
    votes = _votes({("s", n): float(n) for n in range(5)})
    collapse_duplicates(votes, _reader(sessions), {}, keep={("s", 1)})
    assert set(votes.turn) == {("s", 1)}  # the copy a short answer follows stands for them all


def test_a_fact_said_on_other_days_adds_their_votes_and_a_flood_keeps_its_best() -> None:
    fact, ask = "I am allergic to peanuts.", "Can you give me dinner idea number {} please?"
    sessions = _session(fact, ask.format(1), ask.format(2), sid="a")
    sessions |= _session(fact, sid="b") | _session(fact, ask.format(3), sid="c")
    votes = _votes(
        {("a", 0): 1.0, ("b", 0): 2.0, ("c", 0): 0.5, ("a", 1): 3.0, ("a", 2): 1.0, ("c", 1): 2.0}
    )
    gone = collapse_duplicates(votes, _reader(sessions), {}, found=set(votes.turn))
    # the fact's three days count together (2 + 1 + 0.5); the request floods session "a", so
    # its saying on day "c" adds nothing: sent 200 times or twice, it counts as said once
    assert votes.turn == {("b", 0): pytest.approx(3.5), ("a", 1): 3.0}
    assert gone == {("a", 0), ("c", 0), ("a", 2), ("c", 1)}
    votes = _votes({("a", 0): 1.0, ("b", 0): 2.0, ("c", 0): 0.5})
    collapse_duplicates(votes, _reader(sessions), {}, found={("b", 0), ("c", 0)})
    assert votes.turn == {("b", 0): pytest.approx(2.5)}  # voted as context only: adds nothing
    hello = "Hello! How can I help you today?"
    sessions = {sid: [Turn("u", sid, "assistant", hello, f"{sid}:0", 0)] for sid in ("a", "b", "c")}
    votes = _votes({("a", 0): 1.0, ("b", 0): 2.0, ("c", 0): 0.5})
    collapse_duplicates(votes, _reader(sessions), {}, found=set(votes.turn))
    assert votes.turn == {("b", 0): 2.0}  # an assistant's greeting every session is no fact


def test_a_line_said_in_every_session_adds_no_more_than_a_fact_said_on_three_days() -> None:
    greeting = "Hey, how is your day going so far?"
    sessions: dict[str, list[Turn]] = {}
    for d in range(8):
        sessions |= _session(greeting, sid=f"d{d}")
    votes = _votes({(f"d{d}", 0): 1.0 + d / 10 for d in range(8)})
    gone = collapse_duplicates(votes, _reader(sessions), {}, found=set(votes.turn))
    assert SAID_AGAIN == 2 and len(gone) == 7
    assert votes.turn == {("d7", 0): pytest.approx(1.7 + 1.6 + 1.5)}  # the best and two more


def test_a_flood_of_requests_does_not_push_the_answer_out_of_the_candidates() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        t = datetime(2025, 3, 3, 10)
        mem.add_turn("u", "a", "user", "My sister's wedding is on 6 September.", timestamp=t)
        mem.add_turn("u", "b", "user", "Change of plans: the wedding moved to 20 September.",
                     timestamp=t + timedelta(days=7))  # fmt: skip
        for n in range(200):
            mem.add_turn("u", "c", "user", f"When is dinner idea number {n} ready this week?",
                         timestamp=t + timedelta(days=14, minutes=n))  # fmt: skip
        r = mem.retrieve("u", "When is the wedding this week?", k=3)
        texts = "\n".join(h.memory.text for h in r.hits)
        assert "20 September" in texts and "6 September" in texts
        assert texts.count("dinner idea") <= 1
        block = "\n".join(h.memory.text for h in mem.retrieve("u", "When is dinner ready?").hits)
        assert block.count("dinner idea") == 1  # a flood costs one line


def test_a_copy_in_its_own_session_is_a_flood_and_in_another_a_thing_said_again() -> None:
    sessions = _session("I am allergic to peanuts.", "I am allergic to peanuts.", sid="s")
    sessions |= _session("I am allergic to peanuts.", "I am allergic to peanuts.", sid="t")
    seen = Distinct({}, _reader(sessions))
    assert [seen.place(k) for k in [("s", 0), ("t", 0), ("s", 1), ("t", 1)]] == [
        "fresh", "again", "flood", "flood",
    ]  # fmt: skip


def _candidates(mem: ReflectiveMemory, query: str):
    """A 500-token question's retrieval state, its `distinct` stage, and a list's turns."""
    r = mem.retriever
    req = r.request("u", query, None, 500, None, None, None, None, None, None)
    state = r.state(req)
    distinct = next(s for s in r.stages(req) if s.name == "distinct")

    def turns_of(name: str) -> list:
        return [distinct.turns.turn_at("u", state.index, int(p)) for p in getattr(state, name)[0]]

    return state, distinct, turns_of


def test_a_flood_s_copies_rank_below_every_distinct_candidate() -> None:
    """The copies of a flood go to the end of each candidate list; copies said on other days
    keep their place (`retrieval.votes.DistinctCandidates`)."""
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        t = datetime(2025, 3, 3, 10)
        facts = [
            "My grandmother taught me her lentil soup recipe for dinner.",
            "I cooked a lemon tart this week for the first time.",
            "Dinner with Lena this week was a Thai curry I made myself.",
        ]
        for i, text in enumerate(facts):
            mem.add_turn("u", f"fact{i}", "user", text, timestamp=t + timedelta(days=i))
        ask = "Can you give me dinner idea number {} for this week?"
        for n in range(40):
            mem.add_turn("u", "flood", "user", ask.format(n),
                         timestamp=t + timedelta(days=5, minutes=n))  # fmt: skip
        mem.add_turn("u", "later", "user", ask.format(99),
                     timestamp=t + timedelta(days=9))  # fmt: skip
        _, _, turns_of = _candidates(mem, "What dinner recipes did I cook this week?")
        for name in ("dense", "lexical"):
            keys = turns_of(name)
            sessions = [k[0] for k in keys if k is not None]
            flood = [i for i, s in enumerate(sessions) if s == "flood"]
            others = [i for i, s in enumerate(sessions) if s != "flood"]
            assert len(flood) > 1 and "later" in sessions
            # one copy of the flood ranks where it scores, the others after every other turn
            assert all(i > max(others) for i in flood[1:]), name
            assert sum(s.startswith("fact") for s in sessions) == len(facts)


def test_every_saying_of_a_fact_said_on_several_days_is_a_candidate() -> None:
    """A fact said again on other days comes into the candidates with every saying: when a
    list's cut falls between its sayings (they score alike), the ones cut off are added with
    the distinct candidates that make up for the copies, each to be scored in its own context
    (one keeps the vote). Before, only distinct turns were added and a saying was left out."""
    said = "I am allergic to peanuts and to shellfish, so please keep that in mind."
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        t = datetime(2025, 3, 3, 10)
        for day in range(3):
            at = t + timedelta(days=day)
            mem.add_turn("u", f"day{day}", "user", said, timestamp=at)
            mem.add_turn("u", f"day{day}", "user", f"I walked {day + 2} km by the river today.",
                         timestamp=at + timedelta(minutes=1))  # fmt: skip
        state, distinct, turns_of = _candidates(mem, "What am I allergic to? peanuts shellfish")
        sayings = {("day0", 0), ("day1", 0), ("day2", 0)}
        for name in ("dense", "lexical"):
            keys = turns_of(name)
            assert keys[:3] and set(keys[:3]) == sayings, name  # they lead, alike
            positions, scores = getattr(state, name)
            setattr(state, name, (positions[:2], scores[:2]))  # a cut between the sayings
            distinct.run(state)
            keys = turns_of(name)
            assert sayings <= set(keys), name
            assert len(keys) == 4  # and one distinct candidate for the copy in the list
        hits = mem.retrieve("u", "What am I allergic to? peanuts shellfish", k=3).hits
        assert sum(said in h.memory.text for h in hits) == 1  # the sayings still take one slot
