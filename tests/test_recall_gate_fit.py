"""The RF-Mem gate fitted per embedder: the fit, the stored file, and the engine reading it."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import reflective_memory.recall.calibration as calibration
import reflective_memory.retrieval.candidates as candidates
from reflective_memory.embed import DEFAULT_MODEL, HashingEmbedder
from reflective_memory.errors import InvalidFileError, InvalidInputError
from reflective_memory.recall import (
    GATE_CALIBRATION_FILE,
    RecallConfig,
    choose_path,
    fit_gate,
    fitted_gate,
    gate_routes,
    write_gate_calibration,
)

from tests.test_recall_engine import _memory


def _signals(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probe signals with MiniLM's spread, where recollection helps only low-scoring probes.

    s̄ spreads like REALTALK's (0.15–0.65), H like MiniLM's over 10 hits with λ = 20
    (0.5–2.3); below s̄ = 0.3 recollection gains 5–15 points, above it it loses 0–5.
    """
    rng = np.random.default_rng(seed)
    m = rng.uniform(0.15, 0.65, n)
    h = rng.uniform(0.5, 2.3, n)
    gains = np.where(m < 0.3, rng.uniform(0.05, 0.15, n), -rng.uniform(0.0, 0.05, n))
    return m, h, gains


def test_gate_routes_is_choose_path_vectorised() -> None:
    m, h, _ = _signals(300, seed=3)
    for th_high, th_low, tau in ((0.6, 0.3, 0.2), (0.45, 0.25, 1.4), (0.4, 0.4, 9.0)):
        cfg = RecallConfig(mode="rfmem", theta_high=th_high, theta_low=th_low, tau=tau)
        want = [choose_path(a, b, cfg) == "recollection" for a, b in zip(m, h, strict=True)]
        assert gate_routes(m, h, cfg).tolist() == want
    # A probe exactly at θ_high = θ_low is familiar, as in `choose_path`.
    cfg = RecallConfig(mode="rfmem", theta_high=0.5, theta_low=0.5, tau=0.0)
    assert not gate_routes(np.array([0.5]), np.array([3.0]), cfg)[0]


def test_fit_gate_routes_where_recollection_gains_within_the_share() -> None:
    m, h, gains = _signals()
    cal = fit_gate(m, h, gains, max_share=0.3)
    routed = gate_routes(m, h, cal)
    assert 0.2 <= routed.mean() <= 0.3 and cal.recollection_rate == pytest.approx(routed.mean())
    # It routes the low scorers (all of them gain) and nearly nothing above the crossover.
    assert (m[routed] < 0.32).all() and routed[m < 0.28].mean() > 0.9
    assert gains[routed].mean() > 0.05
    # A tighter share routes a subset of the same questions.
    tight = gate_routes(m, h, fit_gate(m, h, gains, max_share=0.1))
    assert tight.mean() <= 0.1 and not (tight & ~routed).any()
    cfg = cal.apply(RecallConfig(mode="rfmem", alpha=0.4))
    assert cfg.mode == "rfmem" and cfg.alpha == 0.4 and cfg.theta_low == cal.theta_low


def test_fit_gate_routes_nothing_when_recollection_never_gains() -> None:
    m, h, _ = _signals(seed=1)
    cal = fit_gate(m, h, -np.abs(np.random.default_rng(2).normal(0.02, 0.01, m.size)))
    assert cal.recollection_rate == 0.0 and not gate_routes(m, h, cal).any()
    assert not gate_routes(np.array([-0.9, 0.0, 0.99]), np.array([5.0, 5.0, 5.0]), cal).any()
    with pytest.raises(InvalidInputError):
        fit_gate(m, h, m[:-1])
    with pytest.raises(InvalidInputError):
        fit_gate(m, h, m, max_share=1.5)
    with pytest.raises(InvalidInputError):
        fit_gate([], [], [])


def test_write_and_read_a_fitted_gate_and_refuse_a_tampered_file(tmp_path) -> None:
    path = tmp_path / "gate.json"
    assert fitted_gate("hashing:64", 10, 20.0, path)[0] is None  # no file: no fit
    m, h, gains = _signals()
    cal = fit_gate(m, h, gains)
    write_gate_calibration("hashing:64", cal, probe_k=10, lam=20.0, measured={"n": 400}, path=path)
    write_gate_calibration("other", cal, probe_k=5, lam=20.0, measured={}, path=path)
    got, reason = fitted_gate("hashing:64", 10, 20.0, path)
    assert reason == "" and got == cal
    none, reason = fitted_gate("other", 10, 20.0, path)
    assert none is None and "probe_k=5" in reason
    none, reason = fitted_gate("st:elsewhere", 10, 20.0, path)
    assert none is None and "st:elsewhere" in reason
    body = json.loads(path.read_text())
    body["embedders"]["hashing:64"]["tau"] = 0.01  # a hand edit
    path.write_text(json.dumps(body))
    calibration._read.cache_clear()
    with pytest.raises(InvalidFileError, match="checksum"):
        fitted_gate("hashing:64", 10, 20.0, path)
    path.write_text("{not json")
    calibration._read.cache_clear()
    with pytest.raises(InvalidFileError):
        fitted_gate("hashing:64", 10, 20.0, path)


def test_the_shipped_calibration_fits_the_default_embedder() -> None:
    """The package's file verifies and holds a gate for MiniLM at the default probe."""
    base = RecallConfig()
    cal, reason = fitted_gate(f"st:{DEFAULT_MODEL}", base.probe_k, base.lam)
    assert cal is not None, reason
    assert cal.recollection_rate <= 0.3 and cal.theta_low <= cal.theta_high
    measured = json.loads(GATE_CALIBRATION_FILE.read_text())["embedders"][f"st:{DEFAULT_MODEL}"]
    cv = measured["measured"]["cross_validated"]
    assert cv["share_routed"] <= 0.3 and cv["questions"] >= 400


def test_rfmem_gates_with_the_fit_for_the_memorys_embedder(gate_file) -> None:
    m, h, gains = _signals()
    cal = fit_gate(m, h, gains)
    name = HashingEmbedder(64).name
    write_gate_calibration(name, cal, probe_k=10, lam=20.0, measured={}, path=gate_file)
    with _memory() as mem:
        for q in ("which instrument am I learning", "what did my sister do", "tomatoes"):
            d = mem.retrieve("ana", q, k=5, recall={"mode": "rfmem"}).diagnostics
            assert d["gate_calibration"] == {
                "theta_high": cal.theta_high,
                "theta_low": cal.theta_low,
                "tau": cal.tau,
            }
            want = choose_path(d["mean_score"], d["entropy"], cal.apply())
            assert d["path"] == want
        # Thresholds given by hand, or calibrate=False, are kept as they are.
        d = mem.retrieve("ana", "tomatoes", recall={"mode": "rfmem", "tau": 0.5}).diagnostics
        assert "gate_calibration" not in d
        d = mem.retrieve("ana", "tomatoes", recall={"mode": "rfmem", "calibrate": False})
        assert "gate_calibration" not in d.diagnostics
        # The familiarity default reads no calibration at all.
        assert "gate_calibration" not in mem.retrieve("ana", "tomatoes").diagnostics


def test_rfmem_without_a_fit_uses_the_papers_gate_and_says_why_once(
    gate_file, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(candidates, "_UNFITTED", set())
    gate_file.write_text(json.dumps({"embedders": {}, "sha256": calibration._digest({})}))
    caplog.set_level(logging.INFO, logger="reflective_memory.retrieval.candidates")
    with _memory(recall={"mode": "rfmem"}) as mem:
        for q in ("which instrument am I learning", "tomatoes", "where is my sister"):
            d = mem.retrieve("ana", q, k=5).diagnostics
            assert "gate_calibration" not in d
            assert d["path"] == choose_path(d["mean_score"], d["entropy"], RecallConfig("rfmem"))
    said = [r.getMessage() for r in caplog.records if "hashing:64" in r.getMessage()]
    assert len(said) == 1 and "paper's thresholds" in said[0]


def test_a_tampered_calibration_file_fails_the_rfmem_call(gate_file) -> None:
    gate_file.write_text(json.dumps({"embedders": {"hashing:64": {}}, "sha256": "0" * 64}))
    with _memory() as mem:
        with pytest.raises(InvalidFileError, match="checksum"):
            mem.retrieve("ana", "tomatoes", recall={"mode": "rfmem"})
        assert mem.retrieve("ana", "tomatoes").hits  # familiarity reads no calibration
