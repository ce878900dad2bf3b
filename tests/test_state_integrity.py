"""Damaged learned state (issue 29): detected, set aside and relearned with a warning, never used.

The learned state is the turn ranker's offsets (`rmm/turn_learning.py`), one sealed JSON
document per owner. The corpus: bit and byte flips at every offset of a stored blob (a store
that checksums nothing, like a database column), truncations, an empty blob, and well-sealed
documents holding NaN, huge or malformed values. Each case ends in a warning and zero offsets
(the prior ranks), or loads unchanged; none passes silently, none raises.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ModelLoadError
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.ranker import load_ranker
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.sealed import MAGIC, seal, unseal
from reflective_memory.rmm.turn_learning import (
    FORMAT,
    PRIOR_OWNER,
    SHARED_STATE,
    USER_STATE,
    TurnEpisode,
    TurnLearning,
)
from reflective_memory.storage.state import FileStateStore, StateStore

CFG = RerankConfig(save_every=1, turn_learning_rate=0.1, turn_user_learning_rate=0.1)
RM = "reflective_memory"


def _episode() -> TurnEpisode:
    rows = np.zeros((3, len(FEATURES)))
    rows[:, FEATURES.index("cosine")] = [0.2, 0.9, 0.5]
    rows[:, FEATURES.index("position")] = [1.0, 0.0, 0.2]
    return TurnEpisode(rows, np.array([0, 1, 2]), (True, False, False))


#: Most episodes `_train` gives: the learned offsets serve (pass the gate) well before.
MAX_EPISODES = 200


def _train(state: StateStore) -> TurnLearning:
    """Teach one episode again and again until what was learned serves."""
    learning = TurnLearning(CFG, load_ranker(), state)
    fits = [learning.learn("u1", _episode())]
    while not fits[-1].serving and len(fits) < MAX_EPISODES:
        fits.append(learning.learn("u1", _episode()))
    assert all(fits) and fits[-1].serving
    return learning


def _put(state: StateStore, owner: str, name: str, data: bytes) -> None:
    state.update(owner, name, lambda _v, _d: data)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _outcome(state: StateStore, expected: np.ndarray, caplog: pytest.LogCaptureFixture) -> str:
    """Load the weights as a new process would: "fresh" (warned, the prior) or "unchanged"."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=RM):
        learning = TurnLearning(CFG, load_ranker(), state)
        w = learning.weights("u1") - learning.prior_vector
        warned = _warnings(caplog)
    if not warned:
        np.testing.assert_allclose(w, expected, err_msg="changed state loaded without a warning")
        return "unchanged"
    assert any("damaged learned state" in m for m in warned), warned
    assert not any(learning.inspect()["shared"].values())  # the damaged shared offsets
    return "fresh"


def _flips(data: bytes) -> list[tuple[str, bytes]]:
    """Every byte inverted, and one bit flipped at every offset (bit = offset mod 8)."""
    cases = []
    for i in range(len(data)):
        for label, mask in (("byte", 0xFF), ("bit", 1 << (i % 8))):
            bad = bytearray(data)
            bad[i] ^= mask
            cases.append((f"{label}@{i}", bytes(bad)))
    return cases


def _cuts(data: bytes) -> list[tuple[str, bytes]]:
    ends = {0, 1, 7, 8, len(MAGIC), 40, 41, len(data) // 3, len(data) // 2, len(data) - 1}
    return [(f"cut@{n}", data[:n]) for n in sorted(ends) if n < len(data)]


# ------------------------------------------------------------------ the seal
def test_seal_round_trip_and_every_damage_is_a_typed_error():
    blob = seal(b"payload")
    assert unseal(blob) == (b"payload", True)
    cuts = [(label, bad) for label, bad in _cuts(blob) if len(bad) >= len(MAGIC)]
    for label, bad in _flips(blob)[2 * len(MAGIC) :] + cuts:
        with pytest.raises(ModelLoadError):
            unseal(bad)
            pytest.fail(label)


# --------------------------------------------------------- stored offsets
def test_stored_offsets_are_sealed_json_by_feature_name():
    state = FileStateStore()
    _train(state)
    payload, sealed = unseal(state.get(PRIOR_OWNER, SHARED_STATE)[1])
    doc = json.loads(payload)
    assert sealed and doc["format"] == FORMAT and doc["features"] == list(FEATURES)
    assert doc["episodes"] > 1 and any(doc["offsets"]) and doc["judged"] == doc["episodes"] - 1
    assert state.get("u1", USER_STATE) is not None


def test_flips_and_cuts_of_a_stored_blob_warn_and_start_from_the_prior(tmp_path, caplog):
    state = FileStateStore(tmp_path)
    learning = _train(state)
    expected = learning.weights("u1") - learning.prior_vector
    assert np.any(expected)  # learning mattered, so the test can fail
    blob = state.get(PRIOR_OWNER, SHARED_STATE)[1]
    outcomes = set()
    for label, bad in _flips(blob)[:: max(1, len(blob) // 60)] + _cuts(blob):
        _put(state, PRIOR_OWNER, SHARED_STATE, bad)
        got = _outcome(state, expected, caplog)
        assert got == "fresh", label
        outcomes.add(got)
        assert state.version(PRIOR_OWNER, SHARED_STATE) == 0, label  # set aside
    _put(state, PRIOR_OWNER, SHARED_STATE, blob)
    assert _outcome(state, expected, caplog) == "unchanged"
    assert list(tmp_path.rglob("*.damaged-*"))  # kept for inspection


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: {**d, "offsets": [float("nan")] + d["offsets"][1:]}, "finite"),
        (lambda d: {**d, "offsets": [1e9] + d["offsets"][1:]}, "out of bounds"),
        (lambda d: {**d, "offsets": d["offsets"][1:]}, "malformed"),
        (lambda d: {**d, "format": "other"}, "document"),
        (lambda d: {**d, "episodes": -1}, "malformed"),
        (lambda d: {**d, "judged": -1}, "malformed"),
        (lambda d: {**d, "gain": float("inf")}, "malformed"),
        (lambda d: {**d, "gain": d["judged"] + 1.0}, "malformed"),
        (lambda d: {**d, "gain2": -1.0}, "malformed"),
    ],
)
def test_well_sealed_offsets_with_bad_values_start_from_zero(caplog, change, reason):
    state = FileStateStore()
    _train(state)
    doc = json.loads(unseal(state.get("u1", USER_STATE)[1])[0])
    _put(state, "u1", USER_STATE, seal(json.dumps(change(doc)).encode()))
    with caplog.at_level(logging.WARNING, logger=RM):
        learning = TurnLearning(CFG, load_ranker(), state)
        assert learning.inspect("u1")["user"] == dict.fromkeys(FEATURES, 0.0)
    assert reason in caplog.text and "'u1'" in caplog.text


def test_offsets_of_a_feature_the_ranker_lacks_are_dropped_and_a_new_one_starts_at_zero():
    state = FileStateStore()
    doc = {
        "format": FORMAT,
        "features": ["cosine", "gone_feature"],
        "offsets": [0.5, 3.0],
        "episodes": 4,
    }
    _put(state, PRIOR_OWNER, SHARED_STATE, seal(json.dumps(doc).encode()))
    shared = TurnLearning(CFG, load_ranker(), state).inspect()["shared"]
    assert shared["cosine"] == 0.5 and "gone_feature" not in shared
    assert all(v == 0.0 for n, v in shared.items() if n != "cosine")


def _scores(path, **rerank) -> tuple[float, ...]:
    """The shown turns' log-scores of one question (filling the memory the first time)."""
    cfg = MemoryConfig(rerank={"save_every": 1, "turn_learning_rate": 0.5, **rerank})
    with ReflectiveMemory(path, embedder=HashingEmbedder(), config=cfg) as mem:
        if not mem.users():
            for s, topic in enumerate(["red apples", "blue boats", "green trees"]):
                when = f"2024-0{s + 1}-01T10:00:00Z"
                mem.add_turn("u1", f"s{s}", "user", f"Let us chat about {topic}", timestamp=when)
                mem.add_turn("u1", f"s{s}", "assistant", f"the dog Rex loves {topic}")
                mem.end_session("u1", f"s{s}")
        r = mem.retrieve("u1", "what does the dog Rex love", budget_tokens=60)
        assert len(r.hits) >= 2 and r.rerank is not None
        return r.rerank.prior


def test_retrieval_with_damaged_offsets_equals_the_prior(tmp_path, caplog):
    expected = _scores(tmp_path / "plain")
    _scores(tmp_path / "taught")
    cfg = MemoryConfig(
        rerank={"save_every": 1, "turn_learning_rate": 0.5, "turn_user_learning_rate": 0.5}
    )
    with ReflectiveMemory(tmp_path / "taught", embedder=HashingEmbedder(), config=cfg) as mem:
        # episodes whose citations the offsets can learn to rank (this question's passages
        # are too alike for that), until what was learned ranks (passes the gate)
        learning = mem.rerank_stage.learning
        fits = [learning.learn("u1", _episode())]
        while not fits[-1].serving and len(fits) < MAX_EPISODES:
            fits.append(learning.learn("u1", _episode()))
        assert fits[-1].serving
    trained = _scores(tmp_path / "taught")
    assert trained != expected  # what was learned mattered, so the test can fail
    state = FileStateStore(tmp_path / "taught" / "rerankers")
    for owner, name in ((PRIOR_OWNER, SHARED_STATE), ("u1", USER_STATE)):
        _put(state, owner, name, state.get(owner, name)[1][:-3])
    with caplog.at_level(logging.WARNING, logger=RM):
        damaged = _scores(tmp_path / "taught")
    assert "damaged learned state 'rmm.turn_ranker' of '__shared__'" in caplog.text
    assert "damaged learned state 'rmm.turn_ranker.user' of 'u1'" in caplog.text
    assert damaged == expected


# ------------------------------------------------------------- PostgreSQL
def test_database_state_store_blobs_are_checked_and_deleted_when_damaged(pg_dsn, caplog):
    from pg_cluster import pg_schema
    from reflective_memory.storage.postgres import PostgresStore

    store = PostgresStore(pg_dsn, schema=pg_schema())
    try:
        state = store.state
        learning = _train(state)
        expected = learning.weights("u1") - learning.prior_vector
        blob = state.get(PRIOR_OWNER, SHARED_STATE)[1]
        assert blob.startswith(MAGIC)
        for label, bad in _flips(blob)[:: max(1, len(blob) // 20)] + _cuts(blob):
            _put(state, PRIOR_OWNER, SHARED_STATE, bad)
            assert _outcome(state, expected, caplog) == "fresh", label
            assert state.version(PRIOR_OWNER, SHARED_STATE) == 0  # deleted
        _put(state, PRIOR_OWNER, SHARED_STATE, blob)
        assert _outcome(state, expected, caplog) == "unchanged"
    finally:
        store.close()
