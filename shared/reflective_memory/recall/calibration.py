"""Calibrating RF-Mem's gate: thresholds fitted per embedder on where recollection helps.

`fit_gate` chooses θ_high, θ_low and τ from dev questions' gate signals and the coverage each
gained (or lost) on the recollection path; `reflective-memory bench fit-gate` runs it on the dev
sets and stores the result per embedder name in `data/gate_calibration.json` (checksummed), which
`fitted_gate` reads for the `dense` stage. `calibrate_from_signals` and `calibrate_gate` propose
thresholds from a score distribution alone (no coverage), for embedders without a fit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import InvalidFileError, InvalidInputError
from reflective_memory.recall.rfmem import RecallConfig, gate_signals
from reflective_memory.recall.vectors import as_vector_index

__all__ = [
    "GateCalibration",
    "calibrate_from_signals",
    "calibrate_gate",
    "fit_gate",
    "gate_routes",
    "fitted_gate",
    "write_gate_calibration",
    "GATE_CALIBRATION_FILE",
]

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
    return _calibration(m, h, th_high, th_low, tau)


def _calibration(
    m: np.ndarray, h: np.ndarray, theta_high: float, theta_low: float, tau: float
) -> GateCalibration:
    """A `GateCalibration` of these thresholds over the signals `m` (s̄) and `h` (H)."""
    cfg = RecallConfig(mode="rfmem", theta_high=theta_high, theta_low=theta_low, tau=tau)
    return GateCalibration(
        theta_high=theta_high,
        theta_low=theta_low,
        tau=tau,
        n=int(m.size),
        mean_quantiles={f"p{q}": float(np.percentile(m, q)) for q in _QS},
        entropy_quantiles={f"p{q}": float(np.percentile(h, q)) for q in _QS},
        recollection_rate=float(gate_routes(m, h, cfg).mean()),
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


#: The fitted gates, per embedder name (package data; `bench fit-gate --write` re-fits them).
GATE_CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "data" / "gate_calibration.json"
#: θ_high = θ_low of a gate that sends nothing to recollection (s̄, a mean cosine, is >= -1).
_NEVER = -1.0


def gate_routes(means: np.ndarray, entropies: np.ndarray, gate: Any) -> np.ndarray:
    """Which probes `choose_path` sends to recollection under `gate`'s thresholds, vectorised.

    Args:
        means: s̄ per probe.
        entropies: H per probe.
        gate: Anything with `theta_high`, `theta_low` and `tau` (a `GateCalibration`, a
            `RecallConfig`).

    Returns:
        A boolean array, `True` where the gate chooses recollection.
    """
    m = np.asarray(means, dtype=np.float64)
    h = np.asarray(entropies, dtype=np.float64)
    return (m < gate.theta_high) & ((m <= gate.theta_low) | (h > gate.tau))


def _candidates(x: np.ndarray, n: int = 41) -> np.ndarray:
    """Candidate thresholds: `x` at `n` evenly spaced quantiles, and one above its maximum."""
    qs = np.unique(np.quantile(x, np.linspace(0.0, 1.0, n)))
    return np.concatenate([qs, [float(x.max()) + 1.0]])


def fit_gate(
    means: np.ndarray,
    entropies: np.ndarray,
    gains: np.ndarray,
    *,
    max_share: float = 0.3,
) -> GateCalibration:
    """Fit θ_high, θ_low and τ to the most coverage gained by routing to recollection.

    Every gate of the paper's form (`choose_path`) over a grid of cut points (41 quantiles of s̄
    for each θ, of H for τ) is scored by the summed gain of the questions it routes, among
    gates routing at most `max_share` of them; ties go to the gate routing fewer. When no gate
    gains anything, the fit routes nothing (θ_high = θ_low = -1).

    Args:
        means: s̄ per dev question.
        entropies: H per dev question.
        gains: Coverage on the recollection path minus coverage on the familiarity path.
        max_share: Most of the questions the gate may route to recollection.

    Returns:
        A `GateCalibration` whose `recollection_rate` is the in-sample share routed.

    Raises:
        InvalidInputError: Mismatched or empty inputs, or `max_share` outside [0, 1].
    """
    m = np.asarray(means, dtype=np.float64).ravel()
    h = np.asarray(entropies, dtype=np.float64).ravel()
    g = np.asarray(gains, dtype=np.float64).ravel()
    if not m.shape == h.shape == g.shape:
        raise InvalidInputError("means, entropies and gains must have the same length")
    ok = np.isfinite(m) & np.isfinite(h) & np.isfinite(g)
    m, h, g = m[ok], h[ok], g[ok]
    if m.size == 0:
        raise InvalidInputError("no finite gate signals to fit the gate on")
    if not 0.0 <= max_share <= 1.0:
        raise InvalidInputError(f"max_share must be in [0, 1], got {max_share!r}")
    thetas, taus = _candidates(m), _candidates(h)
    below = m[None, :] < thetas[:, None]  # (theta, question): s̄ < θ
    at_or_below = m[None, :] <= thetas[:, None]
    noisy = h[None, :] > taus[:, None]  # (tau, question)
    best = (0.0, 0, _NEVER, _NEVER, float(h.max()) + 1.0)
    most = math.floor(max_share * m.size + 1e-9)
    for i, th_high in enumerate(thetas):
        for j in range(i + 1):  # θ_low <= θ_high
            routed = below[i][None, :] & (at_or_below[j][None, :] | noisy)  # (tau, question)
            count = routed.sum(axis=1)
            gain = routed.astype(np.float64) @ g
            gain[count > most] = -np.inf
            t = int(np.lexsort((count, -gain))[0])  # most gain, then fewest routed
            if gain[t] > best[0] + 1e-12 or (
                abs(gain[t] - best[0]) <= 1e-12 and gain[t] > 0 and count[t] < best[1]
            ):
                best = (float(gain[t]), int(count[t]), float(th_high), float(thetas[j]),
                        float(taus[t]))  # fmt: skip
    _, _, th_high, th_low, tau = best
    return _calibration(m, h, th_high, th_low, tau)


def _digest(embedders: dict[str, Any]) -> str:
    canonical = json.dumps(embedders, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@lru_cache(maxsize=4)
def _read(path: Path) -> dict[str, Any]:
    """The `embedders` table of a calibration file, its checksum verified."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidFileError(path, "", f"not a readable gate calibration: {exc}") from exc
    embedders = raw.get("embedders") if isinstance(raw, dict) else None
    if not isinstance(embedders, dict):
        raise InvalidFileError(path, "embedders", "missing")
    if raw.get("sha256") != _digest(embedders):
        raise InvalidFileError(path, "sha256", "checksum mismatch: the file was changed by hand")
    return embedders


def fitted_gate(
    embedder_name: str, probe_k: int, lam: float, path: Path | None = None
) -> tuple[GateCalibration | None, str]:
    """The gate fitted for an embedder, or `None` and the reason there is none.

    Args:
        embedder_name: The memory's `embedder.name`.
        probe_k: Probe size of the gate in use (a fit holds for the probe size it was made at).
        lam: λ of the gate in use (likewise).
        path: Calibration file (default: the package's `GATE_CALIBRATION_FILE`).

    Returns:
        `(calibration, "")` or `(None, reason)`.

    Raises:
        InvalidFileError: The file does not parse or its checksum does not match.
    """
    where = GATE_CALIBRATION_FILE if path is None else path
    entry = _read(where).get(embedder_name)
    if entry is None:
        return None, f"no RF-Mem gate fitted for embedder {embedder_name!r} in {where.name}"
    if (entry["probe_k"], entry["lam"]) != (probe_k, lam):
        return None, (
            f"the RF-Mem gate for {embedder_name!r} was fitted at probe_k={entry['probe_k']}, "
            f"lam={entry['lam']}, not probe_k={probe_k}, lam={lam}"
        )
    return (
        GateCalibration(
            theta_high=float(entry["theta_high"]),
            theta_low=float(entry["theta_low"]),
            tau=float(entry["tau"]),
            n=int(entry["n"]),
            mean_quantiles=dict(entry["mean_quantiles"]),
            entropy_quantiles=dict(entry["entropy_quantiles"]),
            recollection_rate=float(entry["recollection_rate"]),
        ),
        "",
    )


def write_gate_calibration(
    embedder_name: str,
    calibration: GateCalibration,
    *,
    probe_k: int,
    lam: float,
    measured: dict[str, Any],
    path: Path | None = None,
) -> Path:
    """Store `calibration` as the fitted gate of `embedder_name` (other embedders' stay).

    Args:
        embedder_name: The embedder's `name`.
        calibration: The fit (`fit_gate`).
        probe_k: Probe size it was fitted at.
        lam: λ it was fitted at.
        measured: What the fit was measured to do (data, share routed, gains, cross-validated).
        path: Calibration file (default: the package's `GATE_CALIBRATION_FILE`).

    Returns:
        The file written.
    """
    where = GATE_CALIBRATION_FILE if path is None else path
    embedders = dict(_read(where))
    embedders[embedder_name] = {
        "theta_high": calibration.theta_high,
        "theta_low": calibration.theta_low,
        "tau": calibration.tau,
        "probe_k": probe_k,
        "lam": lam,
        "n": calibration.n,
        "mean_quantiles": calibration.mean_quantiles,
        "entropy_quantiles": calibration.entropy_quantiles,
        "recollection_rate": calibration.recollection_rate,
        "measured": measured,
    }
    body = {"embedders": embedders, "sha256": _digest(embedders)}
    tmp = where.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True, allow_nan=False) + "\n", "utf-8")
    os.replace(tmp, where)
    _read.cache_clear()
    return where
