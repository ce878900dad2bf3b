import doctest
import math

import numpy as np
import pytest
import reflective_memory.recall as recall_mod
from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.recall import (
    ArrayIndex,
    RecallConfig,
    as_vector_index,
    calibrate_from_signals,
    calibrate_gate,
    choose_path,
    familiarity,
    gate_signals,
    recall,
    recollect,
)


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _corpus(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    return _unit(np.random.default_rng(seed).normal(size=(n, d)))


class SpyIndex(ArrayIndex):
    """Records every search call: (number of queries, n, copy of the queries)."""

    def __init__(self, vectors: np.ndarray) -> None:
        super().__init__(vectors)
        self.calls: list[tuple[int, int, np.ndarray]] = []

    def search(self, queries, n):
        q = np.atleast_2d(queries)
        self.calls.append((q.shape[0], n, q.copy()))
        return super().search(queries, n)


def test_doctests():
    assert doctest.testmod(recall_mod).failed == 0


# ---------------------------------------------------------------- gate
def test_gate_signals_uniform_and_peaked():
    m, h = gate_signals(np.full(10, 0.4), lam=20.0)
    assert m == pytest.approx(0.4)
    assert h == pytest.approx(math.log(10))
    m, h = gate_signals(np.array([0.9] + [0.1] * 9), lam=20.0)
    assert m == pytest.approx(0.18)
    assert h < 1e-3
    # Padding is ignored; empty gives nan.
    m, h = gate_signals(np.array([0.5, -np.inf]), lam=20.0)
    assert m == pytest.approx(0.5) and h == pytest.approx(0.0)
    assert all(math.isnan(v) for v in gate_signals(np.array([]), 20.0))


def test_gate_signals_sharpness_lowers_entropy():
    s = np.array([0.6, 0.55, 0.5, 0.45])
    assert gate_signals(s, lam=50.0)[1] < gate_signals(s, lam=20.0)[1] < gate_signals(s, 1.0)[1]


@pytest.mark.parametrize(
    "mean,entropy,expected",
    [
        (0.61, 2.0, "familiarity"),  # high mean wins even with high entropy
        (0.60, 2.0, "familiarity"),  # >= theta_high
        (0.29, 0.0, "recollection"),  # low mean wins even with zero entropy
        (0.30, 0.0, "recollection"),  # <= theta_low
        (0.45, 0.2, "familiarity"),  # middle band, H <= tau
        (0.45, 0.21, "recollection"),  # middle band, H > tau
        (float("nan"), float("nan"), "empty"),
    ],
)
def test_choose_path_rule(mean, entropy, expected):
    assert choose_path(mean, entropy, RecallConfig(mode="rfmem")) == expected


def test_choose_path_forced_modes():
    assert choose_path(0.9, 0.0, RecallConfig(mode="recollection")) == "recollection"
    assert choose_path(0.0, 5.0, RecallConfig(mode="familiarity")) == "familiarity"


def test_recall_gate_on_constructed_scores():
    # A query unrelated to 100 random memories in 128 dimensions: s̄ low, so recollection.
    mat = _corpus(100, 128)
    q = _corpus(1, 128, seed=11)[0]
    res = recall(ArrayIndex(mat), q, k=5, mode="rfmem")
    assert res.path == "recollection" and res.mean_score < 0.3
    assert res.trace.rounds >= 1
    # The stored vector itself plus unrelated ones: middle band, one clear winner: familiarity.
    mat = _corpus(100, 32)
    res = recall(ArrayIndex(mat), mat[0], k=5, mode="rfmem")
    assert 0.3 < res.mean_score < 0.6 and res.entropy <= 0.2 and res.path == "familiarity"
    # Same probe, but a tau below its entropy: recollection.
    assert (
        recall(ArrayIndex(mat), mat[0], k=5, mode="rfmem", tau=res.entropy / 2).path
        == "recollection"
    )
    # Ten near-copies of the query: s̄ high, so familiarity.
    near = _unit(mat[0] + 0.05 * np.random.default_rng(1).normal(size=(10, 32)))
    res = recall(ArrayIndex(np.vstack([mat, near])), mat[0], k=5, mode="rfmem")
    assert res.path == "familiarity" and res.mean_score >= 0.6
    assert res.trace.rounds == 0 and res.filled == 0
    d = res.diagnostics()
    assert set(d) >= {"path", "mean_score", "entropy", "rounds", "hits_per_round", "ms"}
    assert d["ms"]["total"] >= 0


# ---------------------------------------------------------------- familiarity
def test_familiarity_is_exact_top_k():
    mat = _corpus()
    q = mat[7] + 0.5 * mat[9]
    s, p = familiarity(ArrayIndex(mat), q, 5)
    expect = np.argsort(-(mat @ (q / np.linalg.norm(q))))[:5]
    assert p.tolist() == expect.tolist()
    assert np.all(np.diff(s) <= 1e-6)


# ---------------------------------------------------------------- recollection
def test_recollection_candidate_sizes_follow_n_equals_b_plus_r_times_f():
    mat = _corpus(300)
    spy = SpyIndex(mat)
    cfg = RecallConfig(beam=3, fanout=2, rounds=3)
    _, _, _, trace = recollect(spy, mat[0], k=1000, config=cfg)
    assert trace.rounds == 3
    assert [c[1] for c in spy.calls] == [6, 8, 10]
    assert spy.calls[0][0] == 1
    assert all(c[0] <= 3 for c in spy.calls)
    assert trace.searches == sum(c[0] for c in spy.calls)


def test_recollection_stops_once_k_unique_hits():
    mat = _corpus(300)
    spy = SpyIndex(mat)
    pos, _, _, trace = recollect(spy, mat[0], k=4, config=RecallConfig())
    # Round 0 keeps all three branches of 6 candidates: >= 4, so it stops.
    assert trace.rounds == 1 and trace.hits_per_round == [6]
    assert len(pos) == 4 and len(spy.calls) == 1


def test_alpha_mix_forms_next_query():
    mat = _corpus(300)
    spy = SpyIndex(mat)
    alpha = 0.3
    cfg = RecallConfig(beam=1, fanout=4, rounds=2, alpha=alpha)
    x_t = mat[5]
    recollect(spy, x_t, k=1000, config=cfg)
    # beam=1: one cluster holding the whole top-N (N = (1 + 0) * 4).
    top = ArrayIndex(mat).search(x_t[None], 4)[1][0]
    g = mat[top].mean(axis=0)
    g /= np.linalg.norm(g)
    expect = alpha * x_t + (1 - alpha) * g + x_t
    expect /= np.linalg.norm(expect)
    second_query = spy.calls[1][2][0]
    assert spy.calls[1][1] == 8
    np.testing.assert_allclose(second_query, expect, atol=1e-5)


def test_recollection_unique_bounded_and_rescored():
    mat = _corpus(400)
    for rescore in (True, False):
        cfg = RecallConfig(rescore=rescore)
        pos, scores, cos, _ = recollect(ArrayIndex(mat), mat[3] + mat[4], k=12, config=cfg)
        assert len(pos) == len(set(pos.tolist())) <= 12
        assert np.all((pos >= 0) & (pos < len(mat)))
        assert np.all(np.diff(scores) <= 1e-6)
        q = (mat[3] + mat[4]) / np.linalg.norm(mat[3] + mat[4])
        np.testing.assert_allclose(cos, mat[pos] @ q, atol=1e-5)
        if rescore:
            np.testing.assert_allclose(scores, cos, atol=1e-6)


def test_recollection_deterministic_with_seed():
    mat = _corpus(500, 24, seed=3)
    q = mat[10] + 0.5 * mat[20]
    for backend in ("faiss", "sklearn"):
        cfg = RecallConfig(mode="recollection", seed=7, kmeans=backend)
        a = recall(ArrayIndex(mat), q, 20, cfg)
        b = recall(ArrayIndex(mat), q, 20, cfg)
        assert a.positions.tolist() == b.positions.tolist()
        assert a.trace.hits_per_round == b.trace.hits_per_round


def test_recollection_stays_inside_the_users_index():
    # Two users with separate indexes; user B's vectors are near the query, but recollection over
    # user A's index can only return A's positions.
    rng = np.random.default_rng(4)
    a_vecs = _corpus(30, 16, seed=5)
    q = a_vecs[0]
    b_vecs = _unit(q + 0.01 * rng.normal(size=(30, 16)))
    a_index = ArrayIndex(a_vecs)
    res = recall(a_index, q, 50, mode="recollection")
    assert set(res.positions.tolist()) <= set(range(30))
    np.testing.assert_allclose(a_vecs[res.positions] @ q, res.cosine, atol=1e-5)
    assert not np.any(np.isclose(res.cosine[1:], 1.0, atol=1e-3))  # none of B's near-copies
    assert ArrayIndex(b_vecs).ntotal == 30


def test_fill_pads_from_probe_and_can_be_disabled():
    mat = _corpus(300)
    full = recall(ArrayIndex(mat), mat[1], 40, mode="recollection")
    assert len(full.positions) == 40
    assert full.filled == 40 - sum(full.trace.hits_per_round)
    assert len(set(full.positions.tolist())) == 40
    bare = recall(ArrayIndex(mat), mat[1], 40, mode="recollection", fill=False)
    assert bare.filled == 0 and len(bare.positions) == sum(bare.trace.hits_per_round) < 40


@pytest.mark.parametrize("n", [0, 1, 3])
@pytest.mark.parametrize("mode", ["rfmem", "familiarity", "recollection"])
def test_tiny_corpora(n, mode):
    mat = _corpus(n, 8) if n else np.zeros((0, 8), np.float32)
    res = recall(ArrayIndex(mat), np.ones(8, np.float32), 5, mode=mode)
    assert len(res.positions) == n
    assert sorted(res.positions.tolist()) == list(range(n))
    assert res.path == ("empty" if n == 0 else res.path)
    if n == 0:
        assert math.isnan(res.mean_score) and res.diagnostics()["mean_score"] is None


# ---------------------------------------------------------------- index adapters / errors
def test_as_vector_index_accepts_faiss_and_rejects_non_indexes():
    import faiss

    mat = _corpus(20, 8)
    fi = faiss.IndexFlatIP(8)
    fi.add(mat)
    res = recall(fi, mat[2], 3, mode="recollection")
    assert int(res.positions[0]) == 2

    class NoVectors:
        ntotal = 3

        def search(self, q, n):
            raise AssertionError

    with pytest.raises(InvalidInputError):
        as_vector_index(NoVectors())
    with pytest.raises(InvalidInputError):
        as_vector_index(object())


def test_bad_inputs_raise_typed_errors():
    idx = ArrayIndex(_corpus(10, 8))
    with pytest.raises(InvalidInputError):
        recall(idx, np.ones(8), 0)
    with pytest.raises(InvalidInputError):
        recall(idx, np.full(8, np.nan), 3)
    with pytest.raises(InvalidInputError):
        recall(idx, np.ones((2, 8)), 3)
    with pytest.raises(ConfigError):
        recall(idx, np.ones(8), 3, nope=1)
    with pytest.raises(ConfigError):
        RecallConfig(alpha=1.5)
    with pytest.raises(ConfigError):
        RecallConfig(theta_low=0.7, theta_high=0.6)
    with pytest.raises(ConfigError):
        RecallConfig(beam=0)
    with pytest.raises(ConfigError):
        RecallConfig(mode="both")


def test_config_defaults_and_roundtrip():
    cfg = RecallConfig()
    assert (
        cfg.lam,
        cfg.beam,
        cfg.fanout,
        cfg.theta_high,
        cfg.theta_low,
        cfg.alpha,
        cfg.rounds,
    ) == (
        20.0,
        3,
        2,
        0.6,
        0.3,
        0.5,
        3,
    )
    assert 0.2 <= cfg.tau <= 0.25
    assert RecallConfig.from_dict(cfg.replace(alpha=0.3).to_dict()).alpha == 0.3


# ---------------------------------------------------------------- calibration
def test_calibrate_from_signals_places_thresholds_on_quantiles():
    rng = np.random.default_rng(0)
    means = rng.uniform(0.2, 0.8, size=1000)
    ents = rng.uniform(0.0, 2.0, size=1000)
    cal = calibrate_from_signals(means, ents)
    assert cal.theta_high == pytest.approx(np.quantile(means, 0.7))
    assert cal.theta_low == pytest.approx(np.quantile(means, 0.1))
    assert 0.8 < cal.tau < 1.2  # median of a uniform [0, 2]
    # Expected share: 10% low + 60% middle * 1/2 above median.
    assert cal.recollection_rate == pytest.approx(0.4, abs=0.03)
    cfg = cal.apply(RecallConfig(alpha=0.4))
    assert cfg.alpha == 0.4 and cfg.tau == cal.tau
    with pytest.raises(InvalidInputError):
        calibrate_from_signals([], [])
    with pytest.raises(InvalidInputError):
        calibrate_from_signals([0.1], [0.1, 0.2])


def test_calibrate_gate_from_index_and_from_queries():
    mat = _corpus(300, 16)
    idx = ArrayIndex(mat)
    own = calibrate_gate(idx, sample=100)
    assert own.n == 100 and own.theta_low <= own.theta_high
    # Pseudo-queries exclude themselves: no probe mean of 1.0.
    assert own.mean_quantiles["p90"] < 0.99
    real = calibrate_gate(idx, queries=_corpus(50, 16, seed=9))
    assert real.n == 50
    with pytest.raises(InvalidInputError):
        calibrate_gate(ArrayIndex(np.zeros((0, 16), np.float32)))


def test_probe_reuse_in_round_zero_changes_nothing_but_the_search_count():
    mat = _corpus(400, 16, seed=8)
    q = mat[2] + 0.3 * mat[9]
    cfg = RecallConfig(mode="recollection", fill=False)
    spy = SpyIndex(mat)
    res = recall(spy, q, 12, cfg)
    plain = recollect(ArrayIndex(mat), q, 12, cfg)
    assert res.positions.tolist() == plain[0].tolist()
    # probe + rounds after the first; round 0 took its candidates from the probe.
    assert len(spy.calls) == 1 + (res.trace.rounds - 1)
    assert res.trace.searches == plain[3].searches - 1
