"""Query-focused excerpts of turns too long for the budget left."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import count_tokens
from reflective_memory.retrieval.excerpts import CUT_MARK, Pieces, excerpt
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


def cut(text: str, query: str, allowance: int, count=words) -> str | None:
    return excerpt(Pieces.of(text, count), lexical_tokens(query), allowance, count)


def test_the_excerpt_holds_the_lines_that_answer_and_marks_the_cuts() -> None:
    got = cut(ONE_SHOT, "How many giant crabs will the party face?", 30)
    assert got is not None and "Giant crabs (3)" in got
    assert got.startswith(CUT_MARK) and words(got) <= 30
    assert "Sunken Library" not in got  # the opening is cut: the budget went to the answer
    loot = cut(ONE_SHOT, "What loot did the one-shot give?", 15)
    assert loot is not None and "pearl of power" in loot and loot.startswith(CUT_MARK)
    assert not loot.endswith(CUT_MARK)  # the last line is in: nothing cut after it


def test_the_excerpt_fills_its_allowance_with_what_follows_the_match() -> None:
    got = cut(ONE_SHOT, "Which enemies does it have?", 40)
    assert got is not None
    assert "enemies the party will face" in got and "Drowned scholars (5)" in got
    assert 30 <= words(got) <= 40


def test_with_none_of_the_questions_words_the_turn_opens_the_excerpt() -> None:
    got = cut(ONE_SHOT, "zebra", 20)
    assert got is not None and got.startswith('"The Sunken Library"') and got.endswith(CUT_MARK)


def test_a_long_paragraph_is_cut_at_sentences_and_nothing_too_small_is_returned() -> None:
    para = " ".join(f"Sentence {i} talks about topic{i} at some length here." for i in range(30))
    assert len(Pieces.of(para, words).spans) == 30  # one line, cut at its sentences
    got = cut(para, "what about topic17", 25)
    assert got is not None and "topic17" in got and words(got) <= 25
    assert cut(para, "topic3", 2) is None
    assert cut("", "anything", 50) is None


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
    got = cut(text, query, allowance, count_tokens)
    if got is None:
        return
    assert count_tokens(got) <= allowance
    body = got.removeprefix(f"{CUT_MARK} ").removesuffix(f" {CUT_MARK}")
    assert body in text  # the turn's own words, never rewritten


@pytest.mark.parametrize("allowance", [12, 40, 400])
def test_token_counts_are_respected(allowance: int) -> None:
    got = cut(ONE_SHOT, "giant crabs", allowance, count_tokens)
    assert got is not None and count_tokens(got) <= allowance


VOCAB = (
    "mummies mummy Mummy's temple temples party parties running runs ran I'm don't the a of "
    "crab_3 crabs 4x4 café Café naïve x-ray re-run 220 pages paged\n . , ! ?"
).split(" ")


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.sampled_from(VOCAB), min_size=0, max_size=120),
    st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6),
)
def test_the_terms_found_in_each_piece_are_its_lexical_tokens(words_: list, query: list) -> None:
    text = " ".join(words_)
    pieces = Pieces.of(text, words)
    terms = set(lexical_tokens(" ".join(query)))
    expected = [set(lexical_tokens(text[a:b])) & terms for a, b in pieces.spans]
    assert pieces.terms(terms) == expected


def test_without_a_word_of_the_question_an_opening_too_long_gives_nothing() -> None:
    text = " ".join(["A long opening sentence about nothing in particular."] * 3) + "\nShort."
    assert cut(text, "zebra", 10) is None  # the opening is 24 words: nothing rather than a middle
    # with the question's words only in pieces too long, the first piece that fits
    assert cut(text, "opening sentence", 10) == "… Short."


def test_cut_marks_follow_the_pieces_and_whitespace_lines_are_not_text() -> None:
    text = "\n  First line here.  \n\n   \nSecond line with crabs.\n\t\n"
    assert cut(text, "crabs", 6) == "… Second line with crabs."
    assert cut(text, "crabs", 40) == "First line here.  \n\n   \nSecond line with crabs."
