"""BM25 over memory keys: Lucene scores, appends equal to a build from scratch."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory.storage.bm25 import LexicalIndex
from reflective_memory.text import lexical_tokens

KEYS = [
    "I moved to Berlin last spring and I love the lakes",
    "My sister lives in Hamburg with her two cats",
    "We adopted a rescue dog named Biscuit",
    "",
    "Berlin is rainy today; I stayed in and painted",
    "The dog keeps stealing socks, the cats ignore him",
    "ok",
]


def naive_bm25(keys: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Lucene BM25 written out term by term, as the reference."""
    docs = [lexical_tokens(k) or ["\u2205"] for k in keys]
    n = len(docs)
    avg = sum(len(d) for d in docs) / n
    out = np.zeros(n)
    for term in lexical_tokens(query):
        df = sum(term in d for d in docs)
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = Counter(d)[term]
            out[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avg))
    return out


def test_scores_are_lucene_bm25() -> None:
    index = LexicalIndex(KEYS)
    for query in ["where does my sister live", "dog and cats", "Berlin Berlin lakes", "zebra"]:
        got = index.scores(lexical_tokens(query))
        np.testing.assert_allclose(got, naive_bm25(KEYS, query), rtol=1e-5, atol=1e-6)


def test_search_ranks_by_score_and_drops_zero() -> None:
    index = LexicalIndex(KEYS)
    scores, positions = index.search("the dog named Biscuit", 10)
    assert positions.tolist()[0] == 2  # the key naming Biscuit
    assert set(positions.tolist()) == {2, 5}  # only keys holding a query token
    assert np.all(np.diff(scores) <= 0)


def test_extended_leaves_the_original_unchanged() -> None:
    first = LexicalIndex(KEYS[:3])
    before = first.scores(lexical_tokens("Berlin dog"))
    grown = first.extended(KEYS[3:])
    assert first.size == 3 and grown.size == len(KEYS)
    np.testing.assert_array_equal(first.scores(lexical_tokens("Berlin dog")), before)
    np.testing.assert_allclose(
        grown.scores(lexical_tokens("Berlin dog")), naive_bm25(KEYS, "Berlin dog"), rtol=1e-5
    )


def test_overlap_is_the_share_of_query_tokens_in_each_key() -> None:
    index = LexicalIndex(KEYS)
    got = index.overlap("Berlin lakes", [0, 4, 1])
    np.testing.assert_allclose(got, [1.0, 0.5, 0.0])


WORDS = st.sampled_from("berlin sister dog cats lakes moved painting rain socks ok the".split())


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.lists(WORDS, max_size=12).map(" ".join), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 7), max_size=12),
    query=st.lists(WORDS, min_size=1, max_size=5).map(" ".join),
)
def test_appending_in_any_chunks_equals_building_at_once(
    keys: list[str], cuts: list[int], query: str
) -> None:
    index = LexicalIndex(keys[:1])
    at = 1
    for c in cuts:
        index = index.extended(keys[at : at + c])
        at += c
    index = index.extended(keys[at:])
    whole = LexicalIndex(keys)
    tokens = lexical_tokens(query)
    np.testing.assert_allclose(index.scores(tokens), whole.scores(tokens), rtol=1e-6)
    np.testing.assert_allclose(index.scores(tokens), naive_bm25(keys, query), rtol=1e-5, atol=1e-6)
    assert len(index._blocks) <= 8
