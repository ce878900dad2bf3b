"""What a retrieval never shows (issue 27): turns the caller excludes, and small talk alone.

An adapter passes the turns its reader sees anyway (`exclude_turns`); acknowledgements and
greetings never take a slot on their own, though a passage may show one after the turn it
answers. Small talk is told from the user's own turns, in any language (issue 38): a short
turn whose every word is common in the user's turns. A call without `k` or a budget fills the
default token budget with passages.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig, ReflectiveMemory
from reflective_memory.text import (
    COMMON_SESSIONS,
    COMMON_SHARE,
    WordCounts,
    contentless,
    words_of,
)

from tests.smalltalk_histories import ASKED, HISTORIES, SAID, SMALL

CHAT = [
    ("s1", "user", "My sister Lea lives in Porto and teaches piano."),
    ("s1", "assistant", "Great, thanks!"),
    ("s1", "user", "She moved there from Lyon in 2019."),
    ("s1", "assistant", "Thanks a lot!"),
    ("s2", "user", "Hi there!"),
    ("s2", "assistant", "Hello! How can I help you today?"),
    ("s2", "user", "I adopted a beagle called Pixel last week."),
    ("s2", "assistant", "Got it, thanks!"),
    ("s3", "user", "I work night shifts as a nurse in Lisbon."),
    ("s3", "assistant", "Okay, thanks. Bye!"),
]


@pytest.fixture
def mem():
    """Ana's twelve English sessions (`HISTORIES["en"]`), then three more; s3 stays open."""
    with ReflectiveMemory(embedder=HashingEmbedder()) as m:
        for i, session in enumerate(HISTORIES["en"]):
            for role, text in session:
                m.add_turn("ana", f"h{i}", role, text)
            m.end_session("ana", f"h{i}")
        for sid, role, text in CHAT:
            m.add_turn("ana", sid, role, text)
        for sid in ("s1", "s2"):
            m.end_session("ana", sid)
        yield m


def _counts(mem: ReflectiveMemory, user: str) -> WordCounts:
    sessions: dict[str, list[str]] = {}
    for t in mem.turns(user):
        sessions.setdefault(t.session_id, []).append(t.text)
    return WordCounts(sessions.values())


def _said(text: str) -> str:
    return text.split(": ", 1)[-1]


_SMALL = ["ok", "thanks", "got", "it", "noted", "hi", "sure", "great", "i", "the", "okay"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*_SMALL, "Porto", "İstanbul", "ΣΟΦΟΣ", "x" * 30]), max_size=16),
    st.sampled_from([" ", ", ", "!\n", "   ", "\t" * 40]),
)
def test_contentless_reads_long_turns_from_their_opening_alike(words, sep) -> None:
    text = sep.join(words)
    counts = WordCounts([["ok thanks got it i the"], ["hi sure great okay"]] * 2 + [_SMALL] * 3)
    ws = re.findall(r"[^\W_]+", text.casefold())
    quiet = len(ws) <= 12 and all(counts.common(w) for w in ws)
    assert contentless(text, counts) == quiet


@pytest.mark.parametrize("lang", sorted(HISTORIES))
def test_small_talk_is_told_in_any_language(lang):
    counts = WordCounts([text for _, text in session] for session in HISTORIES[lang])
    assert [t for t in SMALL[lang] if not contentless(t, counts)] == []
    assert [t for t in SAID[lang] if contentless(t, counts)] == []


@pytest.mark.parametrize("lang", sorted(HISTORIES))
def test_small_talk_never_is_one_of_k_turns_in_any_language(lang):
    question, answer = ASKED[lang]
    # the small-talk rule alone: turns stored now are stamped seconds apart, and a present-tense
    # question ("what am I allergic to?") would lift the newest near-tie of the crude hashing
    # embedder (tests/test_passages.py covers recency)
    alone = MemoryConfig(passages={"recency": False})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=alone) as m:
        for i, session in enumerate(HISTORIES[lang]):
            for role, text in session:
                m.add_turn("u", f"s{i}", role, text)
            m.end_session("u", f"s{i}")
        counts = _counts(m, "u")
        for query in (question, *SMALL[lang][:3]):
            hits = _texts(m.retrieve("u", query, k=3))
            assert hits and not any(contentless(_said(t), counts) for t in hits), (query, hits)
        assert answer in _texts(m.retrieve("u", question, k=3))[0]


def test_a_history_read_on_demand_counts_the_sessions_it_read(monkeypatch):
    from reflective_memory.retrieval import votes

    monkeypatch.setattr(votes, "PRELOAD_TURNS", 0)  # sessions are read as candidates need them
    question, answer = ASKED["no"]
    with ReflectiveMemory(embedder=HashingEmbedder()) as m:
        for i, session in enumerate(HISTORIES["no"]):
            for role, text in session:
                m.add_turn("u", f"s{i}", role, text)
            m.end_session("u", f"s{i}")
        for query in (question, "Tusen takk!", "Hei!"):
            assert m.retrieve("u", query, k=3).hits
            index = m.indexes.get("u")
            counts, counted = index.extras["word_counts_read"]
            read = index.extras["session_turns"]
            assert counted == set(read)
            fresh = WordCounts([t.text for t in turns] for turns in read.values())
            assert counts.turns_holding == fresh.turns_holding and counts.turns == fresh.turns
        assert answer in _texts(m.retrieve("u", question, k=3))[0]


_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_GREEK = "αβγδεζηθικλμνξοπρστυφχψωϊϋ"


_SESSIONS = st.lists(  # a user's sessions of turns of a few words
    st.lists(
        st.lists(
            st.sampled_from(["thanks", "ok", "i", "live", "in", "oslo", "hi", "miso"]), max_size=14
        ),
        max_size=12,
    ),
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(_SESSIONS)
def test_no_word_list_renaming_every_word_changes_no_decision(sessions) -> None:
    texts = [[" ".join(t) + "!" for t in s] for s in sessions]
    greek = [[t.translate(str.maketrans(_ALPHABET, _GREEK)) for t in s] for s in texts]
    en, gr = WordCounts(texts), WordCounts(greek)
    for s, g in zip(texts, greek, strict=True):
        assert [en.contentless(t) for t in s] == [gr.contentless(t) for t in g]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.text(max_size=40), max_size=6), max_size=8),
    st.lists(st.lists(st.text(max_size=40), max_size=6), max_size=3),
)
def test_word_counts_taken_back_are_the_counts_without(sessions, more) -> None:
    counts = WordCounts(sessions + more)
    for s in more:
        counts.add(s, -1)
    alone = WordCounts(sessions)
    assert counts.turns == alone.turns == sum(map(len, sessions))
    assert +counts.turns_holding == alone.turns_holding
    assert +counts.sessions_holding == alone.sessions_holding
    for t in (t for s in sessions for t in s):
        if any(alone.sessions_holding[w] < COMMON_SESSIONS for w in words_of(t)):
            assert not alone.contentless(t)  # a word of fewer sessions is content
        elif not words_of(t):  # nothing but marks and spaces: nothing to say
            assert alone.contentless(t)


def test_a_word_is_common_from_its_share_of_turns_in_a_few_sessions():
    assert not WordCounts([["hi"] * 9]).contentless("hi")  # one session cannot tell
    assert not WordCounts([["hi"]] * (COMMON_SESSIONS - 1)).contentless("hi")
    assert WordCounts([["hi"]] * COMMON_SESSIONS).contentless("hi")
    n = 400
    need = math.ceil(COMMON_SHARE * n)  # turns that must hold a common word
    history = [["hi", f"word{i}"] for i in range(need - 1)]  # one short: a topic of this user
    others = [f"other{i}" for i in range(n - 2 * (need - 1))]
    assert WordCounts([*history, others]).turns == n
    assert not WordCounts([*history, others]).contentless("hi")
    assert WordCounts([*history, [*others[1:], "hi"]]).contentless("hi")
    long = "hi " * 13
    assert not WordCounts([[long]] * 10).contentless(long)  # a long turn never is


def _texts(retrieval) -> list[str]:
    return [h.memory.text for h in retrieval.hits]


@pytest.mark.parametrize("query", ["Thanks a lot!", "Got it, thanks!", "Hello! Can I help"])
def test_small_talk_never_is_one_of_k_turns(mem, query):
    counts = _counts(mem, "ana")
    assert contentless("Thanks a lot!", counts) and contentless("Got it, thanks!", counts)
    hits = _texts(mem.retrieve("ana", query, k=5))
    assert hits and not any(contentless(_said(t), counts) for t in hits)


def test_small_talk_appears_only_after_the_turn_it_answers(mem):
    counts = _counts(mem, "ana")
    r = mem.retrieve("ana", "Great, thanks! sister Porto piano", budget_tokens=400)
    shown = 0
    for text in _texts(r):
        run: list[str] = []  # the turns of a passage between two `…`
        for line in [*text.splitlines(), "…"]:
            if line.startswith("…"):
                # a run of small talk ("Okay, thanks. Bye!", "Glad to help.") follows a turn
                # with content, never opens a run alone
                assert not run or not contentless(run[0], counts), text
                shown += sum(contentless(t, counts) for t in run)
                run = []
            elif ": " in line:
                run.append(_said(line))
    joined = "\n".join(_texts(r))
    assert "Lea lives in Porto" in joined and "Great, thanks!" in joined and shown


def test_excluded_turns_are_never_returned_and_others_take_their_place(mem):
    best = mem.retrieve("ana", "beagle Pixel", k=1).hits[0].memory
    assert "Pixel" in best.text
    ids = list(best.turn_ids)
    for kw in ({"k": 3}, {"budget_tokens": 300}, {}):
        r = mem.retrieve("ana", "beagle Pixel", exclude_turns=ids, **kw)
        assert r.hits and all(not set(h.memory.turn_ids) & set(ids) for h in r.hits), kw
        assert not any("Pixel" in t for t in _texts(r))
    open_turns = [t.turn_id for t in mem.turns("ana", "s3")]
    r = mem.retrieve("ana", "nurse night shifts Lisbon", k=3, exclude_turns=open_turns)
    assert not any("Lisbon" in t for t in _texts(r))


@pytest.mark.parametrize("bad", ["s1:0", 5, [1, 2], b"x"])
def test_bad_exclude_turns_is_a_typed_error(mem, bad):
    with pytest.raises(InvalidInputError, match="exclude_turns"):
        mem.retrieve("ana", "Porto", exclude_turns=bad)


def test_default_call_fills_the_default_budget_with_passages(mem):
    r = mem.retrieve("ana", "Where does my sister live?")
    assert r.diagnostics["budget_tokens"] == 500 and r.diagnostics["k"] is None
    assert r.hits and all(h.memory.granularity == "passage" for h in r.hits)
    assert "Lea lives in Porto" in r.hits[0].memory.text
    cfg = MemoryConfig(search={"default_k": 2})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as turns:
        for sid, role, text in CHAT:
            turns.add_turn("ana", sid, role, text)
        r = turns.retrieve("ana", "Where does my sister live?")
        assert r.diagnostics["k"] == 2 and r.diagnostics["budget_tokens"] is None
        assert len(r.hits) == 2 and all(h.memory.granularity == "turn" for h in r.hits)
