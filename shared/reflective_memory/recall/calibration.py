"""Calibrating RF-Mem's gate thresholds from a user's own score distribution."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.recall.rfmem import RecallConfig, choose_path, gate_signals
from reflective_memory.recall.vectors import as_vector_index

__all__ = ["GateCalibration", "calibrate_from_signals", "calibrate_gate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateCalibration:
    """Thresholds proposed from a score distribution, with the distribution's summary.

    Attributes:
        theta_high: Proposed θ_high.
        theta_low: Proposed θ_low.
        tau: Proposed τ.
        n: Probe lists the proposal is based on.
        mean_quantiles: s̄ at the 10/25/50/75/90th percentiles.
        entropy_quantiles: H at the same percentiles.
        recollection_rate: Share of the sampled lists the proposed gate sends to recollection.
    """

    theta_high: float
    theta_low: float
    tau: float
    n: int
    mean_quantiles: dict[str, float]
    entropy_quantiles: dict[str, float]
    recollection_rate: float

    def apply(self, config: RecallConfig | None = None) -> RecallConfig:
        """Return `config` (default: the RF-Mem gate, `mode="rfmem"`) with these thresholds."""
        cfg = RecallConfig(mode="rfmem") if config is None else config
        return cfg.replace(theta_high=self.theta_high, theta_low=self.theta_low, tau=self.tau)


_QS = (10, 25, 50, 75, 90)


def calibrate_from_signals(
    means: np.ndarray,
    entropies: np.ndarray,
    *,
    high_quantile: float = 0.7,
    low_quantile: float = 0.1,
    tau_quantile: float = 0.5,
) -> GateCalibration:
    """Propose θ_high, θ_low and τ from observed gate signals (s̄, H) of many probes.

    The rule places the thresholds on the user's own distribution where the paper's defaults sit
    on its PersonaMem distributions (Appendix B: median s̄ ≈ 0.50–0.55 below θ_high = 0.6, median
    H ≈ 0.17–0.18 just under τ = 0.2): θ_high at the `high_quantile` of s̄, θ_low at the
    `low_quantile` of s̄, and τ at the `tau_quantile` of H among probes whose s̄ falls between
    the two. Raise `tau_quantile` (or `low_quantile` down) to send fewer queries to recollection.

    Raises:
        InvalidInputError: Mismatched or empty inputs, or quantiles out of order.
    """
    m = np.asarray(means, dtype=np.float64).ravel()
    h = np.asarray(entropies, dtype=np.float64).ravel()
    if m.shape != h.shape:
        raise InvalidInputError("means and entropies must have the same length")
    ok = np.isfinite(m) & np.isfinite(h)
    m, h = m[ok], h[ok]
    if m.size == 0:
        raise InvalidInputError("no finite gate signals to calibrate from")
    if not 0.0 <= low_quantile <= high_quantile <= 1.0 or not 0.0 <= tau_quantile <= 1.0:
        raise InvalidInputError("need 0 <= low_quantile <= high_quantile <= 1 and tau in [0, 1]")
    th_high = float(np.quantile(m, high_quantile))
    th_low = float(np.quantile(m, low_quantile))
    band = (m > th_low) & (m < th_high)
    tau = float(np.quantile(h[band] if band.any() else h, tau_quantile))
    cfg = RecallConfig(mode="rfmem", theta_high=th_high, theta_low=th_low, tau=tau)
    rec = sum(choose_path(a, b, cfg) == "recollection" for a, b in zip(m, h, strict=True))
    return GateCalibration(
        theta_high=th_high,
        theta_low=th_low,
        tau=tau,
        n=int(m.size),
        mean_quantiles={f"p{q}": float(np.percentile(m, q)) for q in _QS},
        entropy_quantiles={f"p{q}": float(np.percentile(h, q)) for q in _QS},
        recollection_rate=rec / m.size,
    )


def calibrate_gate(
    index: Any,
    queries: np.ndarray | None = None,
    *,
    probe_k: int = 10,
    lam: float = 20.0,
    sample: int = 256,
    seed: int = 0,
    **quantiles: float,
) -> GateCalibration:
    """Propose gate thresholds from one user's index.

    Best with real query vectors (e.g. the embeddings of the user's past questions). Without
    them, up to `sample` stored memories serve as pseudo-queries, each probed with itself
    excluded; memories resemble each other more than questions resemble memories, so this
    tends to overstate s̄ — prefer real queries when you have them.

    Args:
        index: The user's `VectorIndex`.
        queries: `(m, d)` query vectors, or `None` to sample stored vectors.
        probe_k: Probe size the gate will use.
        lam: λ the gate will use.
        sample: Pseudo-queries to draw when `queries` is None.
        seed: Sampling seed.
        **quantiles: `high_quantile`, `low_quantile`, `tau_quantile` for
            `calibrate_from_signals`.

    Returns:
        A `GateCalibration`; `.apply(config)` gives a config using it.

    Raises:
        InvalidInputError: Empty index (nothing to calibrate from) or bad queries.
    """
    idx = as_vector_index(index)
    if idx.ntotal < 2 and queries is None:
        raise InvalidInputError("calibration needs at least two stored memories or real queries")
    if queries is None:
        rng = np.random.default_rng(seed)
        take = min(sample, idx.ntotal)
        own = np.sort(rng.choice(idx.ntotal, size=take, replace=False)).astype(np.int64)
        q = np.asarray(idx.vectors(own), dtype=np.float32)
        s, p = idx.search(q, probe_k + 1)
        rows = []
        for srow, prow, me in zip(s, p, own, strict=True):
            keep = (prow >= 0) & (prow != me)
            rows.append(srow[keep][:probe_k])
    else:
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if q.ndim != 2 or q.shape[0] == 0 or not np.all(np.isfinite(q)):
            raise InvalidInputError("queries must be a non-empty finite (m, d) matrix")
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        s, p = idx.search(q.astype(np.float32), probe_k)
        rows = [srow[prow >= 0] for srow, prow in zip(s, p, strict=True)]
    sig = np.array([gate_signals(r, lam) for r in rows], dtype=np.float64)
    return calibrate_from_signals(sig[:, 0], sig[:, 1], **quantiles)
