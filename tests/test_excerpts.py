"""Query-focused excerpts of turns too long for the budget left."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import count_tokens
from reflective_memory.excerpts import CUT_MARK, excerpt
from reflective_memory.text import lexical_tokens

ONE_SHOT = "\n".join(
    [
        '"The Sunken Library"',
        "Long ago a order of scholars kept a library on the cliffs above the sea.",
        "A storm took the cliffs and the library sank into the bay below.",
        "A collector now hires the party to bring back one book from the ruins.",
        "Here are the enemies the party will face:",
        "* Drowned scholars (5): Armor Class 12, Hit Points 30.",
        "* Giant crabs (3): Armor Class 15, Hit Points 40.",
        "* Sea hag (1): Armor Class 14, Hit Points 52.",
        "Traps: a flooded stairwell and a collapsing reading room.",
        "Loot: a pearl of power and 400 gold pieces.",
    ]
)


def words(text: str) -> int:
    return len(text.split())


def test_the_excerpt_holds_the_lines_that_answer_and_marks_the_cuts() -> None:
    got = excerpt(ONE_SHOT, lexical_tokens("How many giant crabs will the party face?"), 30, words)
    assert got is not None and "Giant crabs (3)" in got
    assert got.startswith(CUT_MARK) and words(got) <= 30
    assert "Sunken Library" not in got  # the opening is cut: the budget went to the answer
    loot = excerpt(ONE_SHOT, lexical_tokens("What loot did the one-shot give?"), 15, words)
    assert loot is not None and "pearl of power" in loot and loot.startswith(CUT_MARK)
    assert not loot.endswith(CUT_MARK)  # the last line is in: nothing cut after it


def test_the_excerpt_fills_its_allowance_with_what_follows_the_match() -> None:
    got = excerpt(ONE_SHOT, lexical_tokens("Which enemies does it have?"), 40, words)
    assert got is not None
    assert "enemies the party will face" in got and "Drowned scholars (5)" in got
    assert 30 <= words(got) <= 40


def test_with_none_of_the_questions_words_the_turn_opens_the_excerpt() -> None:
    got = excerpt(ONE_SHOT, lexical_tokens("zebra"), 20, words)
    assert got is not None and got.startswith('"The Sunken Library"') and got.endswith(CUT_MARK)


def test_a_long_paragraph_is_cut_at_sentences_and_nothing_too_small_is_returned() -> None:
    para = " ".join(f"Sentence {i} talks about topic{i} at some length here." for i in range(30))
    got = excerpt(para, lexical_tokens("what about topic17"), 25, words)
    assert got is not None and "topic17" in got and words(got) <= 25
    assert excerpt(para, lexical_tokens("topic3"), 2, words) is None
    assert excerpt("", lexical_tokens("anything"), 50, words) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(min_size=0, max_size=80), min_size=1, max_size=12),
    st.text(max_size=40),
    st.integers(min_value=1, max_value=120),
)
def test_an_excerpt_never_exceeds_its_allowance_and_keeps_the_turns_words(
    lines: list[str], query: str, allowance: int
) -> None:
    text = "\n".join(lines)
    got = excerpt(text, lexical_tokens(query), allowance, count_tokens)
    if got is None:
        return
    assert count_tokens(got) <= allowance
    body = got.removeprefix(f"{CUT_MARK} ").removesuffix(f" {CUT_MARK}")
    assert body in text  # the turn's own words, never rewritten


@pytest.mark.parametrize("allowance", [12, 40, 400])
def test_token_counts_are_respected(allowance: int) -> None:
    got = excerpt(ONE_SHOT, lexical_tokens("giant crabs"), allowance, count_tokens)
    assert got is not None and count_tokens(got) <= allowance
