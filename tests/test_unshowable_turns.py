"""What a retrieval never shows (issue 27): turns the caller excludes, and small talk alone.

An adapter passes the turns its reader sees anyway (`exclude_turns`); acknowledgements and
greetings never take a slot on their own, though a passage may show one after the turn it
answers. A call without `k` or a budget fills the default token budget with passages.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig, ReflectiveMemory
from reflective_memory.text import contentless

CHAT = [
    ("s1", "user", "My sister Lea lives in Porto and teaches piano."),
    ("s1", "assistant", "Got it, noted!"),
    ("s1", "user", "She moved there from Lyon in 2019."),
    ("s1", "assistant", "Thanks for telling me, I'll remember that."),
    ("s2", "user", "Hi there!"),
    ("s2", "assistant", "Hello! How can I help you today?"),
    ("s2", "user", "I adopted a beagle called Pixel last week."),
    ("s2", "assistant", "Sure, sounds great."),
    ("s3", "user", "I work night shifts as a nurse in Lisbon."),
    ("s3", "assistant", "Okay, good to know."),
]


@pytest.fixture
def mem():
    with ReflectiveMemory(embedder=HashingEmbedder()) as m:
        for sid, role, text in CHAT:
            m.add_turn("ana", sid, role, text)
        for sid in ("s1", "s2"):
            m.end_session("ana", sid)
        yield m  # s3 stays open


_SMALL = ["ok", "thanks", "got", "it", "noted", "hi", "sure", "great", "i", "the", "okay"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*_SMALL, "Porto", "İstanbul", "ΣΟΦΟΣ", "x" * 30]), max_size=16),
    st.sampled_from([" ", ", ", "!\n", "   ", "\t" * 40]),
)
def test_contentless_reads_long_turns_from_their_opening_alike(words, sep) -> None:
    from reflective_memory.text import _SMALL_TALK, _SMALL_TALK_MAX_WORDS, _WORD, STOPWORDS

    text = sep.join(words)
    ws = [m.group() for m in _WORD.finditer(text.lower())]
    quiet = len(ws) <= _SMALL_TALK_MAX_WORDS and all(w in STOPWORDS or w in _SMALL_TALK for w in ws)
    assert contentless(text) == quiet


def _texts(retrieval) -> list[str]:
    return [h.memory.text for h in retrieval.hits]


def test_contentless_recognises_small_talk_only():
    quiet = ["Got it, noted!", "Thanks!", "Hi there!", "Okay, good to know.", "Sure, sounds great."]
    said = ["My sister lives in Porto.", "No, Paris.", "I love it", "ok 5pm", "Pixel"]
    assert all(contentless(t) for t in quiet)
    assert not any(contentless(t) for t in said)
    long = "okay okay okay okay okay okay okay okay okay okay okay okay okay"
    assert not contentless(long)  # a long turn is never called empty


@pytest.mark.parametrize("query", ["Got it, noted!", "Okay, good to know.", "Hello! Can I help"])
def test_small_talk_never_is_one_of_k_turns(mem, query):
    hits = _texts(mem.retrieve("ana", query, k=5))
    assert hits and not any(contentless(t.split(": ", 1)[-1]) for t in hits)


def test_small_talk_appears_only_after_the_turn_it_answers(mem):
    r = mem.retrieve("ana", "Got it, noted! sister Porto piano", budget_tokens=400)
    for text in _texts(r):
        lines = [ln.split(": ", 1)[-1] for ln in text.splitlines() if ": " in ln]
        for i, line in enumerate(lines):
            if contentless(line):
                assert i > 0 and not contentless(lines[i - 1]), text
    joined = "\n".join(_texts(r))
    assert "Lea lives in Porto" in joined and "Got it, noted!" in joined


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
    assert not any("nurse" in t for t in _texts(r))


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
