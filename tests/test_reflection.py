from datetime import datetime, timezone

import pytest
from reflective_memory.conditional.reflection import (
    clean_keywords,
    parse_reflection,
    reflection_prompt,
    reflective_retrieve,
)
from reflective_memory.errors import InvalidInputError, LLMOutputError
from reflective_memory.types import Hit, Memory, Retrieval, Usage

from tests.fakes import Scripted

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)


def mem(i, text=None):
    return Memory(f"m{i}", "ana", "s", "note", text or f"memory {i}", "k", (f"t{i}",), NOW, NOW)


class FakeSearch:
    """Query -> ranked hits: the base query finds m0..m2, a query with 'Lisbon' finds m5, m1."""

    def __init__(self):
        self.queries = []

    def __call__(self, query):
        self.queries.append(query)
        ids = [5, 1, 6] if "Lisbon" in query else [0, 1, 2]
        hits = [Hit(mem(i), 1.0 - r / 10, r, {"dense": 1.0 - r / 10}) for r, i in enumerate(ids)]
        rid = f"rid-{len(self.queries)}"
        return Retrieval("ana", query, hits, {"path": "fake"}, Usage(), rid)


# -- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "out",
    [
        "ENOUGH\n[1] memory 1 says it",
        "Yes.\n- [1] memory 1 says it",
        "**Enough**\n[1] memory 1 says it",
        "Verdict: sufficient\n[1] memory 1 says it",
        "The memories are enough.\n[1] memory 1 says it",
        "<Memory>: [1] memory 1 says it",
        "yes - [1] memory 1 says it",
    ],
)
def test_parse_enough_variants(out):
    r = parse_reflection(out, 3)
    assert r.enough and r.cited == [1] and r.relevant and "memory 1 says it" in r.relevant[-1]


@pytest.mark.parametrize(
    "out",
    [
        "MISSING\nKeywords: Lisbon, moving date",
        "No\nkeywords: Lisbon; moving date",
        "Not enough.\n- Lisbon\n- moving date",
        "**Insufficient**\nKeywords: \"Lisbon\", 'moving date', none, ...",
        "<Query>: Lisbon, moving date",
        "Keywords: Lisbon, moving date",
        "MISSING: Lisbon, moving date",
        "The memories are not enough to answer.\nKeywords: Lisbon, moving date",
    ],
)
def test_parse_missing_variants(out):
    r = parse_reflection(out, 3, "where did I move")
    assert not r.enough and r.keywords == ["Lisbon", "moving date"]


@pytest.mark.parametrize("out", ["", "   \n ", "I think the answer is 42.", "[0] memory"])
def test_parse_malformed_raises(out):
    with pytest.raises(LLMOutputError):
        parse_reflection(out, 3)


def test_citations_out_of_range_dropped():
    r = parse_reflection("ENOUGH\n[7] x\n[0] y\n[0] z", 2)
    assert r.cited == [0]


def test_clean_keywords_junk():
    raw = [
        '1. "dog\'s name"',
        "",
        "none",
        "...",
        "N/A",
        "Dog's Name",
        "the, of, and",
        "a keyword phrase that is much too long to be a keyword at all",
        "**adoption date**",
        "[vet]",
        "my dog",  # all words already in the query
        "adoption date.",
    ]
    assert clean_keywords(raw, "what is my dog called") == ["dog's name", "adoption date", "vet"]
    assert clean_keywords("a, b, c, d, e, f, g, h, i, j", "", max_keywords=3) == []  # stopwords
    assert len(clean_keywords(", ".join(f"word{i}" for i in range(20)))) == 8


def test_prompt_numbers_memories_and_handles_none():
    p = reflection_prompt("where do I live", ["lives in Rome", "likes tea"])
    assert "[0] lives in Rome" in p and "[1] likes tea" in p and "where do I live" in p
    assert "(no memories were found)" in reflection_prompt("q", [])


# -- the loop -------------------------------------------------------------------------------------


def test_enough_stops_after_one_call_and_keeps_hits():
    llm = Scripted("ENOUGH\n[0] memory 0")
    search = FakeSearch()
    r = reflective_retrieve(search, "where did I move", llm, k=3)
    assert [h.memory.id for h in r.hits] == ["m0", "m1", "m2"]
    assert search.queries == ["where did I move"]
    refl = r.diagnostics["reflection"]
    assert refl["stopped"] == "enough" and refl["llm_calls"] == 1
    assert refl["rounds"][0]["verdict"] == "enough"
    assert refl["rounds"][0]["cited_ids"] == ["m0"]
    assert r.usage.llm_calls == 1 and r.retrieval_id == "rid-1"
    assert r.diagnostics["path"] == "fake"


def test_missing_extends_query_merges_and_dedups():
    llm = Scripted("MISSING\nKeywords: Lisbon, where did I move, none")
    search = FakeSearch()
    r = reflective_retrieve(search, "where did I move", llm, k=5)
    assert search.queries == ["where did I move", "where did I move Lisbon"]
    ids = [h.memory.id for h in r.hits]
    assert len(ids) == len(set(ids)) == 5
    assert ids[0] == "m1"  # found in both rounds
    assert set(ids) == {"m0", "m1", "m2", "m5", "m6"}
    assert ids.index("m5") < ids.index("m0")  # ties go to the later round
    assert [h.rank for h in r.hits] == list(range(5))
    refl = r.diagnostics["reflection"]
    assert refl["stopped"] == "max_rounds" and refl["llm_calls"] == 1
    assert refl["rounds"][0]["keywords"] == ["Lisbon"]
    assert refl["rounds"][1]["query"] == "where did I move Lisbon"
    assert refl["rounds"][1]["new_hits"] == 2
    assert r.usage.llm_calls == 1


def test_rounds_bounded_and_second_judgement_sees_merged_hits():
    llm = Scripted("MISSING\nKeywords: Lisbon", "MISSING\nKeywords: apartment")
    search = FakeSearch()
    r = reflective_retrieve(search, "where did I move", llm, rounds=2, k=3)
    assert len(llm.prompts) == 2 and len(search.queries) == 3
    assert "[0] memory 1" in llm.prompts[1]  # merged ranking shown in round 2
    assert r.diagnostics["reflection"]["llm_calls"] == 2
    assert len(r.hits) == 3


def test_budget_applies_to_merged_hits():
    llm = Scripted("MISSING\nKeywords: Lisbon")
    r = reflective_retrieve(FakeSearch(), "where did I move", llm, budget_tokens=4)
    assert len(r.hits) == 2  # "memory i" costs 2 tokens each


@pytest.mark.parametrize(
    "out,stopped",
    [
        ("", "unparsed"),
        ("gibberish", "unparsed"),
        (RuntimeError("down"), "llm_error"),
        ("MISSING\nKeywords: none, ..., where", "no_keywords"),
        ("No", "no_keywords"),
    ],
)
def test_misbehaving_llm_returns_first_round(out, stopped):
    search = FakeSearch()
    r = reflective_retrieve(search, "where did I move", Scripted(out), k=3)
    assert [h.memory.id for h in r.hits] == ["m0", "m1", "m2"]
    assert r.diagnostics["reflection"]["stopped"] == stopped
    assert len(search.queries) == 1
    assert r.usage.llm_calls == 1
    assert r.usage.failures == (0 if stopped == "no_keywords" else 1)


def test_no_llm_zero_rounds_and_empty_results():
    assert reflective_retrieve(FakeSearch(), "q", None).diagnostics["reflection"]["stopped"] == (
        "no_llm"
    )
    llm = Scripted("ENOUGH")
    r = reflective_retrieve(FakeSearch(), "q", llm, rounds=0)
    assert r.diagnostics["reflection"]["stopped"] == "disabled" and llm.prompts == []
    r = reflective_retrieve(lambda q: [], "q", llm)
    assert r.hits == [] and r.diagnostics["reflection"]["stopped"] == "no_hits"
    assert llm.prompts == []


def test_bad_arguments():
    with pytest.raises(InvalidInputError):
        reflective_retrieve(FakeSearch(), "q", None, rounds=-1)
    with pytest.raises(InvalidInputError):
        reflective_retrieve(FakeSearch(), "  ", None)
