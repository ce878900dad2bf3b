"""The citation-trained turn prior: model, vote scaling, engine wiring, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from reflective_memory import ConfigError, HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import InvalidInputError, ModelLoadError
from reflective_memory.passages import TurnVotes
from reflective_memory.rmm.turn_prior import TURN_FEATURES, TurnPrior, turn_features
from reflective_memory.rmm.turn_prior_stage import DIAGNOSTICS_KEY, TURN_PRIOR_FILE
from reflective_memory.types import Turn

FP = TURN_FEATURES.index("first_person")
Q = TURN_FEATURES.index("question")


def _rows(rng, n, first_person):
    x = rng.normal(0.0, 1.0, size=(n, len(TURN_FEATURES)))
    x[:, FP] = first_person
    x[:, Q] = 1.0 - first_person
    return x


def _episode(rng):
    """Cited turns are first-person statements, uncited ones questions (plus noise columns)."""
    x = np.vstack([_rows(rng, 3, 1.0), _rows(rng, 9, 0.0)])
    return x, np.array([True] * 3 + [False] * 9)


def test_learns_which_kind_of_turn_is_cited_and_waits_for_enough_answers():
    rng = np.random.default_rng(0)
    tp = TurnPrior(min_episodes=5)
    for i in range(5):
        assert tp.trained is (i >= 5)
        tp.partial_fit(*_episode(rng))
    assert tp.trained and tp.n_episodes_ == 5
    assert tp.weights_[FP] > 0 > tp.weights_[Q]
    statement, question = _rows(rng, 1, 1.0), _rows(rng, 1, 0.0)
    statement[0, :] = question[0, :] = 0.0
    statement[0, FP], question[0, Q] = 1.0, 1.0
    assert tp.decision(statement)[0] > tp.decision(question)[0]


def test_an_answer_without_contrast_teaches_nothing():
    tp = TurnPrior()
    x = np.ones((4, len(TURN_FEATURES)))
    tp.partial_fit(x, [True] * 4).partial_fit(x, [False] * 4)
    assert tp.n_episodes_ == 0 and not np.any(tp.weights_) and tp.n_rows_ == 0


def test_bad_input_is_refused_before_learning():
    tp = TurnPrior()
    with pytest.raises(InvalidInputError):
        tp.partial_fit(np.zeros((3, 2)), [True, False, False])
    with pytest.raises(InvalidInputError):
        tp.partial_fit(np.zeros((2, len(TURN_FEATURES))), [True])
    bad = np.zeros((2, len(TURN_FEATURES)))
    bad[0, 0] = np.nan
    with pytest.raises(InvalidInputError):
        tp.partial_fit(bad, [True, False])
    assert tp.n_episodes_ == 0
    for kw in ({"learning_rate": 0}, {"l2": -1}, {"min_episodes": 0}, {"min_episodes": True}):
        with pytest.raises(ConfigError):
            TurnPrior(**kw)
    for value in (-0.1, 6, True, "0.5"):
        with pytest.raises(ConfigError, match="rerank_turn_prior"):
            MemoryConfig(rerank_turn_prior=value)


def test_round_trip_and_damaged_state():
    rng = np.random.default_rng(1)
    tp = TurnPrior(min_episodes=2)
    for _ in range(3):
        tp.partial_fit(*_episode(rng))
    back = TurnPrior.from_bytes(tp.to_bytes())
    x = _rows(rng, 6, 1.0)
    assert np.allclose(back.decision(x), tp.decision(x)) and back.trained
    assert TurnPrior.from_bytes(tp.to_bytes(), learning_rate=0.01).learning_rate == 0.01
    for data in (b"not json", b'{"format_version": 1}', tp.to_bytes().replace(b"voters", b"other")):
        with pytest.raises(ModelLoadError):
            TurnPrior.from_bytes(data)


def _turn(pos, text, role="Ann"):
    return Turn("u", "s", role, text, f"t{pos}", pos)


def test_scaling_reorders_only_found_turns_and_is_bounded():
    turns = [
        _turn(0, "did you see the game last night?"),
        _turn(1, "I finally adopted a dog, her name is Pixel"),
        _turn(2, "what time is it?"),
    ]
    rng = np.random.default_rng(2)
    tp = TurnPrior(min_episodes=3)
    votes = TurnVotes()
    for p in range(3):
        votes.add(("s", p), 1.0, f"m{p}")
    assert tp.scale_votes(votes, lambda s: turns, 0.5) == 0  # untrained: nothing changes
    assert set(votes.turn.values()) == {1.0}
    for _ in range(3):
        x, y = _episode(rng)
        tp.partial_fit(x, y)
    assert tp.scale_votes(votes, lambda s: turns, 0.0) == 0
    assert tp.scale_votes(votes, lambda s: turns, 0.5) == 3
    assert (
        votes.turn[("s", 1)] > votes.turn[("s", 0)] and votes.turn[("s", 1)] > votes.turn[("s", 2)]
    )
    assert all(np.exp(-1.5) - 1e-9 <= v <= np.exp(1.5) + 1e-9 for v in votes.turn.values())
    keys, x = turn_features(votes, lambda s: turns)
    assert keys == [("s", 0), ("s", 1), ("s", 2)] and x.shape == (3, len(TURN_FEATURES))
    cache: dict = {}
    some, xs = turn_features(votes, lambda s: turns, [("s", 2), ("s", 9)], cache)
    assert some == [("s", 2)] and np.allclose(xs[0], x[2])  # ranks are over every voted turn
    assert list(cache) == [("turn_features", "s", 2)]
    again = turn_features(votes, lambda s: [], [("s", 2)], cache)[1]  # text read from the cache
    assert np.allclose(again, xs)


FACTS = [
    ("I keep my bike in the garage next to the boxes", "where is your bike?"),
    ("I work as a nurse at the city hospital", "what is your job?"),
    ("my sister lives in Lisbon with her two cats", "where does your sister live?"),
    ("I am allergic to peanuts since I was a child", "any allergies?"),
    ("I play chess every Sunday at the club", "what do you do on sundays?"),
    ("my favourite tea is jasmine from the market", "which tea do you like?"),
]


def _chat(mem: ReflectiveMemory) -> None:
    for i, (fact, question) in enumerate(FACTS):
        sid = f"s{i}"
        mem.add_turn("ana", sid, "friend", f"hey, {question}")
        mem.add_turn("ana", sid, "ana", fact)
        mem.add_turn("ana", sid, "friend", "really? and what about the weekend?")
        mem.end_session("ana", sid)


def _teach(mem: ReflectiveMemory, rounds: int = 2) -> list:
    """Retrieve with a budget; cite the hits holding the fact turn, as an LLM that answers would."""
    results = []
    for _ in range(rounds):
        for fact, question in FACTS:
            r = mem.retrieve("ana", question, budget_tokens=40)
            assert DIAGNOSTICS_KEY in r.diagnostics
            cited = [i for i, h in enumerate(r.hits) if fact in h.memory.text]
            results.append(mem.feedback(r, cited=cited))
    return results


def _engine(path=None, **cfg):
    cfg.setdefault("rerank_turn_prior", 0.5)  # opt-in
    return ReflectiveMemory(path, embedder=HashingEmbedder(), config=MemoryConfig(**cfg))


def test_engine_learns_from_cited_passages_and_keeps_it_on_disk(tmp_path):
    with _engine(tmp_path / "m", budget_unit="words") as mem:
        _chat(mem)
        results = _teach(mem)
        assert any(res.turn_prior for res in results)
        tp = mem.turn_prior.prior()
        assert tp.trained and tp.weights_[Q] < 0
        weights = tp.weights_.copy()
        r = mem.retrieve("ana", "where is your bike?", budget_tokens=40)
        assert len(r.diagnostics[DIAGNOSTICS_KEY]) == len(r.hits)
    assert (tmp_path / "m" / "rerankers" / TURN_PRIOR_FILE).exists()
    with _engine(tmp_path / "m", budget_unit="words") as again:
        assert np.allclose(again.turn_prior.prior().weights_, weights)


def test_turned_off_or_without_a_budget_nothing_is_recorded_or_learned():
    assert MemoryConfig().rerank_turn_prior == 0.0  # off by default
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        _chat(mem)
        r = mem.retrieve("ana", "where is your bike?", budget_tokens=40)
        assert DIAGNOSTICS_KEY not in r.diagnostics
        assert not mem.feedback(r, cited=[0]).turn_prior
    with _engine(rerank_turn_prior=0.0) as mem:
        _chat(mem)
        r = mem.retrieve("ana", "where is your bike?", budget_tokens=40)
        assert DIAGNOSTICS_KEY not in r.diagnostics
        assert not mem.feedback(r, cited=[0]).turn_prior
    with _engine() as mem:
        _chat(mem)
        r = mem.retrieve("ana", "where is your bike?", k=3)
        assert DIAGNOSTICS_KEY not in r.diagnostics
        assert not mem.feedback(r, cited=[0]).turn_prior
        r = mem.retrieve("ana", "where is your bike?", budget_tokens=400)
        assert not mem.feedback(r, cited=list(range(len(r.hits)))).turn_prior  # cites all
        assert mem.turn_prior.prior().n_episodes_ == 0


def test_random_citations_never_earn_trust():
    """Labels unrelated to the features: the prequential AUC stays at chance, no vote moves."""
    rng = np.random.default_rng(3)
    tp = TurnPrior(min_episodes=4)
    for _ in range(200):
        x = rng.normal(size=(12, len(TURN_FEATURES)))
        y = rng.random(12) < 0.3
        tp.partial_fit(x, y)
    assert tp.n_episodes_ > 150 and abs(tp.auc_ - 0.5) < 0.03
    assert tp.trust < 0.3
    informative = TurnPrior(min_episodes=4)
    for _ in range(30):
        informative.partial_fit(*_episode(rng))
    assert informative.auc_ > 0.9 and informative.trust == 1.0 and informative.trained


def test_garbage_in_a_retrievals_diagnostics_teaches_nothing_and_raises_nothing():
    """A Retrieval comes back from the caller: its recorded features may be anything."""
    from dataclasses import replace

    with _engine() as mem:
        _chat(mem)
        r = mem.retrieve("ana", "where is your bike?", budget_tokens=40)
        assert len(r.hits) >= 2
        for rows in (
            "junk",
            [["a"] * 7] * len(r.hits),
            [[[float("nan")] * 7]] * len(r.hits),
            [[[1.0] * 3]] * len(r.hits),
            [None] * len(r.hits),
        ):
            bad = replace(r, diagnostics={**r.diagnostics, DIAGNOSTICS_KEY: rows})
            assert mem.turn_prior.learn(bad, [0]) is False
        huge = [[[1e9] * 7 for _ in h] for h in r.diagnostics[DIAGNOSTICS_KEY]]
        ok = replace(r, diagnostics={**r.diagnostics, DIAGNOSTICS_KEY: huge})
        mem.turn_prior.learn(ok, [0])  # clipped, finite
        assert np.isfinite(mem.turn_prior.prior().mean_).all()
        assert np.abs(mem.turn_prior.prior().mean_).max() <= 100.0
