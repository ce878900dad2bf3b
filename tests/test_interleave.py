"""Team-draft interleaving judges learned weights on what only they would show (issue 51)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.interleave import (
    LEARNED,
    NEITHER,
    SERVED,
    interleaved_scores,
    team_draft,
)
from reflective_memory.retrieval.ranker import load_ranker
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.turn_learning import TurnEpisode, TurnLearning, interleaved_gain
from reflective_memory.storage.state import FileStateStore

F = len(FEATURES)


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(12)), st.permutations(range(12)), st.lists(st.booleans(), max_size=30))
def test_team_draft_places_every_item_once_and_keeps_the_teams_even(served, learned, flips):
    coins = iter(flips)
    order, team = team_draft(served, learned, lambda: next(coins, True))
    assert sorted(order) == list(range(12)) and set(team) == set(order)
    assert set(team.values()) <= {LEARNED, SERVED, NEITHER}
    assert order[0] in (served[0], learned[0])
    assert (team[order[0]] == NEITHER) == (served[0] == learned[0])
    for n in range(1, len(order) + 1):  # every prefix holds one ranking's top n or nearly
        top = set(order[:n])
        assert len(top & set(served[:n])) >= n // 2 or len(top & set(learned[:n])) >= n // 2
    if list(served) == list(learned):
        assert order == list(served)  # one ranking interleaved with itself is itself ...
        assert set(team.values()) == {NEITHER}  # ... and compares nothing


def test_interleaved_scores_keep_the_served_scale_in_the_interleaved_order():
    served = np.array([3.0, 2.0, 1.0, 0.0])
    learned = np.array([0.0, 1.0, 2.0, 3.0])
    scores, teams = interleaved_scores(served, learned, lambda: True)
    assert sorted(scores.tolist()) == sorted(served.tolist())
    assert np.argsort(-scores).tolist() == [3, 0, 2, 1]  # learned, served, learned, served
    # item 1 is both rankings' next pick in the fourth round: neither team's
    assert teams.tolist() == [SERVED, NEITHER, LEARNED, LEARNED]


def test_the_gain_is_the_learned_team_s_cited_share_minus_the_served_team_s():
    rows, groups = np.zeros((4, F)), np.arange(4)
    ep = TurnEpisode(rows, groups, (True, False, True, True), (LEARNED, SERVED, SERVED, LEARNED))
    assert interleaved_gain(ep) == 1.0 - 0.5
    assert interleaved_gain(TurnEpisode(rows, groups, (True,) + (False,) * 3)) is None  # no teams
    one_team = TurnEpisode(rows, groups, (True, False, False, False), (LEARNED,) * 4)
    assert interleaved_gain(one_team) is None


def _interleaved(learning: TurnLearning, rng: np.random.Generator, *, noise: bool) -> TurnEpisode:
    """Eight candidate turns, the best four of an interleaving shown, one per passage.

    The reader cites the shown turn with the highest `bm25` (or one at random).
    """
    col = FEATURES.index("bm25")
    rows = rng.normal(size=(8, F)) * 0.5
    pair = learning.rivals("u")
    assert pair is not None
    scores, teams = interleaved_scores(rows @ pair[0], rows @ pair[1], learning.coin)
    shown = np.argsort(-scores)[:4]
    best = int(rng.integers(4)) if noise else int(np.argmax(rows[shown, col]))
    cited = tuple(i == best for i in range(4))
    return TurnEpisode(rows[shown], np.arange(4), cited, tuple(int(t) for t in teams[shown]))


def _learner_with_offsets() -> TurnLearning:
    """A learner whose shared offsets favour `bm25` but have not been judged yet."""
    cfg = RerankConfig(save_every=1000, scope="shared", turn_learning_rate=0.0)
    learning = TurnLearning(cfg, load_ranker(), FileStateStore())
    learning._shared_offsets().change[FEATURES.index("bm25")] = 3.0
    learning._shared_offsets().change[FEATURES.index("cosine")] = -2.0
    return learning


def test_citations_of_what_only_the_learned_weights_show_open_the_gate():
    learning = _learner_with_offsets()
    rng = np.random.default_rng(3)
    prior = load_ranker().vector
    judged = 0
    while judged < 60 and not learning.inspect("u")["shared_gate"]["serves"]:
        learning.learn("u", _interleaved(learning, rng, noise=False))
        judged += 1
    assert judged < 60 and learning.inspect("u")["shared_gate"]["mean_gain"] > 0
    served, learned = learning.rivals("u")
    assert not np.array_equal(learning.weights("u"), prior)  # the learned weights serve ...
    np.testing.assert_array_equal(served, prior)  # ... and are still judged against the prior
    np.testing.assert_array_equal(learned, learning.weights("u"))


def test_random_citations_of_an_interleaving_keep_the_gate_shut():
    learning = _learner_with_offsets()
    rng = np.random.default_rng(4)
    for _ in range(300):
        learning.learn("u", _interleaved(learning, rng, noise=True))
    gate = learning.inspect("u")["shared_gate"]
    assert gate["judged"] > 100 and not gate["serves"]
    np.testing.assert_array_equal(learning.weights("u"), load_ranker().vector)


def test_an_explored_retrieval_interleaves_what_does_not_serve_and_its_citations_judge_it():
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        t = datetime(2025, 3, 3, 10)
        facts = [
            "I adopted a grey cat called Pretzel from the shelter.",
            "My sister Lena is getting married in Bergen in September.",
            "I started pottery classes on Tuesday evenings.",
            "We moved from Lyon to Oslo last spring.",
            "My dentist appointment is on the twelfth.",
            "I am allergic to peanuts and to cashews.",
        ]
        for i, text in enumerate(facts):
            mem.add_turn("u", f"s{i}", "user", text, timestamp=t + timedelta(days=i))
        question = "What do you know about my family and my pets?"
        plain = mem.retrieve("u", question, budget_tokens=60, explore=True)
        assert plain.rerank is not None and plain.rerank.teams is None  # nothing learned yet
        mem.feedback(plain, cited=[len(plain.hits) - 1])  # learned, not judged: serves not
        assert not mem.ranker_weights("u")["shared_gate"]["serves"]
        assert mem.retrieve("u", question, budget_tokens=60).rerank.teams is None  # not explored
        mixed = mem.retrieve("u", question, budget_tokens=60, explore=True)
        rec = mixed.rerank
        assert rec is not None and rec.teams is not None and len(rec.teams) == len(rec.groups)
        assert set(rec.teams) <= {LEARNED, SERVED, NEITHER}
        again = type(rec).from_diagnostics(
            rec.as_diagnostics(), user_id="u", retrieval_id=rec.retrieval_id, query=rec.query
        )
        assert again.teams == rec.teams  # another process gets the teams with the record
        judged = mem.ranker_weights("u")["shared_gate"]["judged"]
        team_of = dict(zip(rec.groups, rec.teams, strict=True))
        if len(set(team_of.values())) == 2:
            mem.feedback(mixed, cited=[next(g for g, s in team_of.items() if s == LEARNED)])
            assert mem.ranker_weights("u")["shared_gate"]["judged"] == judged + 1
