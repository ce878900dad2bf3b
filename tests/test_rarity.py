"""How rare a turn's words are for its user (`retrieval.rarity`), the ranker's `rarity` feature."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.rarity import WordCounts
from reflective_memory.retrieval.votes import UserTurns
from reflective_memory.text import words_of

CHATTER = [
    "Hey, how are you?",
    "Hi, how are you doing?",
    "Hey, how is it going?",
    "I am doing well, and you?",
    "Doing well, how about you?",
    "It is going well, thanks!",
    "Hi! Thanks, talk soon.",
    "Thanks, talk to you soon! I am all good.",
    "Good, and how about you?",
    "All good, talk to you soon.",
]


def _history(fact: str, times: int, sessions: int = 12) -> list[str]:
    """A user's turns: chatter in every session, `fact` said in `times` of them."""
    out: list[str] = []
    for s in range(sessions):
        out += [CHATTER[(s + i) % len(CHATTER)] for i in range(4)]
        out.append(f"Today I cooked recipe number {s} from the new book.")
        if s < times:
            out.append(fact)
    return out


def test_a_fact_said_again_and_again_stays_rarer_than_chatter() -> None:
    """Said once or in every session, a fact is rarer than the chatter around it."""
    fact = "I am allergic to peanuts."
    for times in (1, 3, 8, 12):
        counts = WordCounts(_history(fact, times))
        said = counts.rarity(words_of(fact))
        for line in CHATTER:
            assert said > counts.rarity(words_of(line)) + 0.05, (times, line)


def test_rarity_runs_from_words_every_turn_holds_to_a_word_of_one_turn() -> None:
    counts = WordCounts(["ok ok", "ok then", "ok fine"])
    assert 0.0 < counts.rarity(words_of("OK!")) < counts.rarity(words_of("ok fine")) == 1.0
    assert counts.rarity(words_of("🙂 ?")) == 0.0
    # a word not counted yet counts as held by one turn, the rarest there is
    assert counts.rarity(words_of("Fjellheimen")) == counts.rarity(words_of("then"))
    assert WordCounts().rarity(words_of("anything")) == 0.0


def test_rarity_reads_any_language_without_a_word_list() -> None:
    thanks = ["Tusen takk!", "Takk for sist!", "Takk!", "Tusen takk for hjelpen!"]
    counts = WordCounts([*thanks * 5, "Jeg er allergisk mot peanøtter.", "Jeg bor i Oslo."] * 2)
    assert counts.rarity(words_of("Jeg er allergisk mot peanøtter.")) > counts.rarity(
        words_of("Tusen takk!")
    )


def test_a_statement_said_again_counts_once() -> None:
    """Saying a fact again, word for word, leaves its words as rare as before."""
    fact = "I am allergic to peanuts."
    once = WordCounts(_history(fact, 1))
    again = WordCounts([*_history(fact, 1), fact, "i AM allergic to peanuts!", fact])
    assert again.rarity(words_of(fact)) == once.rarity(words_of(fact))
    assert again.turns == once.turns


def test_counting_out_undoes_counting_in() -> None:
    counts = WordCounts(CHATTER)
    before = (+counts.holding, counts.turns)
    counts.add(["A new line about Lisbon.", "A new line about Lisbon!"])
    counts.add(["A new line about Lisbon."], -1)
    assert (+counts.holding, counts.turns) != before  # said twice, counted out once
    counts.add(["A new line about Lisbon."], -1)
    assert (+counts.holding, counts.turns) == before
    copy = counts.copy()
    copy.add(["more words"])
    assert counts.turns == len(CHATTER) and copy.turns == len(CHATTER) + 1


def test_the_ranker_has_a_rarity_feature_the_shipped_model_weighs_up() -> None:
    from reflective_memory.retrieval.ranker import load_ranker

    assert "rarity" in FEATURES
    assert load_ranker().weights["rarity"] > 0


def _fresh(mem: ReflectiveMemory, user: str) -> tuple[Counter[str], int]:
    """The counts of the user's turns, counted afresh."""
    turns = mem.store.turns(user)
    counts = WordCounts(t.text for t in turns)
    return +counts.holding, counts.turns


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3"]),
            st.sampled_from([*CHATTER, "I moved to Berlin.", "Peanuts again!", "Miso is my cat."]),
            st.booleans(),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_counts_carried_over_appends_equal_a_fresh_count(
    steps: list[tuple[str, str, bool]],
) -> None:
    """Each index version's counts, carried from the one before, are the whole history's."""
    with ReflectiveMemory(embedder=HashingEmbedder(dim=64)) as mem:
        turns = UserTurns(mem.store)
        for i, (session, text, ask) in enumerate(steps):
            mem.add_turn("u", session, "user", text, turn_id=f"t{i}")
            if ask:  # a question makes this version count (and later ones carry it)
                mem.retrieve("u", "Where do I live?", k=2)
            index = mem.indexes.get("u")
            got = turns.word_counts("u", index)
            assert (+got.holding, got.turns) == _fresh(mem, "u")
