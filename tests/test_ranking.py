"""The learned turn ranker: its features, its fit, the shipped model and its use in retrieval."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.retrieval.features import FEATURES, QuestionSignals, turn_features
from reflective_memory.retrieval.ranker import (
    TurnRanker,
    fit_ranker,
    load_ranker,
    model_checksum,
)
from reflective_memory.retrieval.turn_votes import TurnVotes
from reflective_memory.types import Turn

COL = {n: i for i, n in enumerate(FEATURES)}
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)


def test_shipped_model_loads_names_every_feature_and_verifies_its_checksum() -> None:
    model = load_ranker()
    assert tuple(model.weights) == FEATURES
    assert all(math.isfinite(w) for w in model.weights.values())
    assert model.fitted.get("questions", 0) > 0  # fitted, not hand-written
    doc = model.to_json()
    assert doc["sha256"] == model_checksum(doc)


def test_a_changed_weight_fails_the_checksum(tmp_path: Path) -> None:
    doc = load_ranker().to_json()
    doc["weights"]["cosine"] += 1.0
    path = tmp_path / "ranker.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="checksum"):
        load_ranker(str(path))


def test_editing_a_model_s_document_leaves_the_shared_model_alone() -> None:
    shipped = load_ranker()
    before = shipped.vector.copy()
    doc = shipped.to_json()
    doc["weights"]["cosine"] += 1.0  # what the checksum test above does
    doc["fitted"]["questions"] = -1
    np.testing.assert_array_equal(load_ranker().vector, before)
    assert load_ranker().fitted.get("questions", 0) > 0
    with pytest.raises(TypeError):
        shipped.weights["cosine"] = 0.0  # type: ignore[index]


def test_a_model_of_other_features_is_refused(tmp_path: Path) -> None:
    body = {"format": "reflective-memory/turn-ranker/1", "weights": {"cosine": 1.0}, "fitted": {}}
    path = tmp_path / "ranker.json"
    path.write_text(json.dumps({**body, "sha256": model_checksum(body)}))
    with pytest.raises(ConfigError, match="features"):
        load_ranker(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_ranker(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="not a readable JSON file"):
        (tmp_path / "bad.json").write_text("{")
        load_ranker(str(tmp_path / "bad.json"))


def test_fit_learns_which_cues_tell_evidence_apart() -> None:
    rng = np.random.default_rng(0)
    questions = []
    for _ in range(60):
        x = rng.normal(size=(40, len(FEATURES))) * 0.3
        y = np.zeros(40, dtype=bool)
        y[:2] = True
        x[:2, COL["cosine"]] += 1.0  # evidence matches better...
        x[:2, COL["other_speaker"]] = 0.0  # ...and is said by the asked-about speaker
        x[2:20, COL["other_speaker"]] = 1.0
        questions.append((x, y))
    model = fit_ranker(questions, fitted={"data": ["synthetic"]})
    assert model.weights["cosine"] > 1.0
    assert model.weights["other_speaker"] < -0.5
    assert model.fitted["questions"] == 60 and model.fitted["data"] == ["synthetic"]
    ranks = [np.argsort(-model.score(x))[:4] for x, _ in questions]
    assert np.mean([{0, 1} <= set(r) for r in ranks]) >= 0.85
    with pytest.raises(ConfigError, match="no question"):
        fit_ranker([(np.zeros((3, len(FEATURES))), [False, False, False])])


def _turn(sid: str, pos: int, role: str, text: str, when: datetime) -> Turn:
    return Turn("u", sid, role, text, f"{sid}-{pos}", pos, timestamp=when)


def test_features_read_the_question_cues_of_each_turn() -> None:
    sessions = {
        "old": [
            _turn("old", 0, "Kate", "I live in Alfama in Lisbon.", T0),
            _turn("old", 1, "Sam", "Lisbon is lovely in spring.", T0),
        ],
        "new": [
            _turn("new", 0, "Kate", "I moved to Berlin last week!", T0 + timedelta(days=60)),
            _turn("new", 1, "Kate", "Thanks!", T0 + timedelta(days=60)),
        ],
    }
    votes = TurnVotes()
    for key, v in {("old", 0): 0.03, ("old", 1): 0.02, ("new", 0): 0.025, ("new", 1): 0.01}.items():
        votes.add(key, v, None)
    own = {
        ("old", 0): (0, {"dense": 0.6, "lexical": 4.0}),
        ("new", 0): (1, {"dense": 0.5, "lexical": 2.0}),
        ("old", 1): (None, {}),
    }
    signals = QuestionSignals(
        speaker="Kate",
        speakers=("Kate", "Sam"),
        present=True,
        frame=(T0 + timedelta(days=50), T0 + timedelta(days=70)),
    )
    got = turn_features(
        votes, sessions.__getitem__, own, signals, rrf_k=60, quiet=frozenset({("new", 1)})
    )
    row = {
        key: dict(zip(FEATURES, r, strict=True))
        for key, r in zip(got.keys, got.matrix, strict=True)
    }
    assert row[("old", 1)]["other_speaker"] == 1.0 and row[("old", 0)]["other_speaker"] == 0.0
    assert row[("new", 0)]["recent"] == 1.0 and row[("old", 0)]["recent"] == 0.0
    assert row[("new", 0)]["in_frame"] == 1.0 and row[("old", 0)]["in_frame"] == 0.0
    assert row[("new", 1)]["small_talk"] == 1.0
    assert row[("old", 0)]["cosine"] == 0.6 and row[("new", 0)]["cosine_gap"] == pytest.approx(-0.1)
    assert row[("old", 0)]["bm25"] == 1.0 and row[("new", 0)]["bm25"] == 0.5
    assert row[("old", 0)]["own_rank"] == pytest.approx(60 / 61)
    assert row[("old", 1)]["own_rank"] == 0.0 and row[("old", 1)]["cosine"] == 0.0
    assert row[("old", 0)]["neighbour"] == pytest.approx(0.02 / 0.03)
    assert row[("old", 0)]["log_vote"] == pytest.approx(math.log(0.03 * 61))
    assert row[("new", 1)]["position"] == 1.0 and row[("new", 0)]["position"] == 0.0


def _chat(mem: ReflectiveMemory) -> None:
    lines = [
        ("Kate", "I started a pottery class on Tuesday evenings."),
        ("Sam", "Pottery sounds fun, I prefer hiking on weekends."),
        ("Kate", "My cat Miso knocked a vase over again."),
        ("Sam", "Cats will be cats. Mine sleeps all day."),
    ]
    for i, (who, text) in enumerate(lines):
        mem.add_turn("u", "s1", who, text, turn_id=f"t{i}", timestamp=T0 + timedelta(minutes=i))
    mem.end_session("u", "s1")


def test_the_learned_ranker_scores_every_voted_turn_by_its_model(tmp_path: Path) -> None:
    weights = dict.fromkeys(FEATURES, 0.0)
    weights["log_vote"], weights["other_speaker"] = 1.0, -3.0
    path = tmp_path / "ranker.json"
    TurnRanker(weights, {"questions": 1}).save(path)
    cfg = MemoryConfig(passages={"ranker": str(path)})
    with ReflectiveMemory(embedder=HashingEmbedder(dim=128), config=cfg) as mem:
        _chat(mem)
        state = mem.retriever.state(
            mem.retriever.request("u", "What does Sam do on weekends?", 2, None, *[None] * 6)
        )
        assert state.features is not None and state.features.keys
        scores = TurnRanker(weights).score(state.features.matrix)
        for key, s in zip(state.features.keys, scores, strict=True):
            assert state.votes.turn[key] == pytest.approx(math.exp(s))
        # Sam's turns come first: Kate's lost e^3 of their vote
        hits = mem.retrieve("u", "What does Sam do on weekends?", k=2).hits
        assert {h.memory.turn_ids[0] for h in hits} == {"t1", "t3"}


def test_learned_or_a_model_file_are_the_choices_and_a_bad_model_fails_at_construction(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="passages.ranker"):
        MemoryConfig(passages={"ranker": ""})
    with pytest.raises(ConfigError, match="cannot read turn ranker"):
        ReflectiveMemory(
            embedder=HashingEmbedder(dim=32),
            config=MemoryConfig(passages={"ranker": str(tmp_path / "none.json")}),
        )
    # the hand-set rules are gone: saying so, and what replaces them
    with pytest.raises(ConfigError, match="'rules' was removed: the learned ranker replaces it"):
        MemoryConfig(passages={"ranker": "rules"})
