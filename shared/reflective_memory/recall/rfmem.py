"""RF-Mem: familiarity/recollection adaptive retrieval (gate, familiarity, recollection)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.recall.vectors import as_vector_index

__all__ = [
    "RecallConfig",
    "RecollectionTrace",
    "RecallResult",
    "gate_signals",
    "choose_path",
    "familiarity",
    "recollect",
    "recall",
    "PATHS",
    "MODES",
]

logger = logging.getLogger(__name__)


#: Paths a retrieval can take. `empty` means the index held nothing.
PATHS = ("familiarity", "recollection", "empty")
#: `rfmem` gates between the two paths; the other two force one path.
MODES = ("rfmem", "familiarity", "recollection")
_KMEANS = ("faiss", "sklearn")


@dataclass(frozen=True)
class RecallConfig:
    """Parameters of RF-Mem retrieval, with the paper's defaults.

    Override per call with `config.replace(alpha=0.3)` or `recall(..., alpha=0.3)`.

    Attributes:
        mode: `rfmem` (gate between the paths), `familiarity` (always top-K; the default: the
            RF-Mem gate was never worse but within noise of it on the dev sets, and costs a
            calibration per index) or `recollection` (always expand).
        probe_k: Probe hits the gate statistics are computed over (the paper finds 10–20
            enough, Appendix D.5). The probe search itself fetches `max(probe_k, k)` hits and
            doubles as the familiarity result.
        lam: λ, sharpness of the tempered softmax over probe scores (paper: 20).
        theta_high: Mean probe score at or above which the query is familiar (paper: 0.6).
        theta_low: Mean probe score at or below which recollection runs (paper: 0.3 at turn
            level, 0.0 for session-level memories).
        tau: Entropy threshold for the middle band: familiarity iff `H <= tau` (paper's best
            range 0.2–0.25, Appendix D.2).
        beam: B, recollection beam width and the most clusters per candidate set (paper: 3).
        fanout: F, per-round candidates per beam query are `N = (B + r) · F` (paper: 2).
        rounds: R, most recollection rounds (paper: 3).
        alpha: α of the mix `norm(α x + (1 − α) g + x_t)` (paper: 0.3–0.6).
        rescore: Rank the recollected union by similarity to the original query instead of the
            similarity to the branch query that found each item (Algorithm 3's order).
        fill: When recollection gathers fewer than `k` items, append the probe's remaining
            hits (already computed, so free) after the recollected ones.
        kmeans: `faiss` (fast, default) or `sklearn`.
        kmeans_iters: Lloyd iterations per clustering.
        seed: Random seed of the clustering; fixed seed = deterministic results.
        calibrate: With `mode="rfmem"` and the thresholds left at their defaults, a
            `ReflectiveMemory` gates with the θ_high, θ_low and τ fitted for its embedder on the
            dev sets (`reflective_memory.recall.fitted_gate`; `reflective-memory bench
            fit-gate` re-fits them) instead of the numbers above, which stay for an embedder
            without a fit.
    """

    mode: str = "familiarity"
    probe_k: int = 10
    lam: float = 20.0
    theta_high: float = 0.6
    theta_low: float = 0.3
    tau: float = 0.2
    beam: int = 3
    fanout: int = 2
    rounds: int = 3
    alpha: float = 0.5
    rescore: bool = True
    fill: bool = True
    kmeans: str = "faiss"
    kmeans_iters: int = 20
    seed: int = 0
    calibrate: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> RecallConfig:
        """Check every field; raise `ConfigError` naming the first bad one."""
        if self.mode not in MODES:
            raise ConfigError(f"recall mode must be one of {MODES}, got {self.mode!r}")
        if self.kmeans not in _KMEANS:
            raise ConfigError(f"kmeans must be one of {_KMEANS}, got {self.kmeans!r}")
        for name in ("probe_k", "beam", "fanout", "rounds", "kmeans_iters"):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ConfigError(f"{name} must be a positive integer, got {val!r}")
        for name in ("lam", "theta_high", "theta_low", "tau", "alpha"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or isinstance(val, bool) or not math.isfinite(val):
                raise ConfigError(f"{name} must be a finite number, got {val!r}")
        if self.lam <= 0:
            raise ConfigError(f"lam must be > 0, got {self.lam!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if self.theta_low > self.theta_high:
            raise ConfigError(
                f"theta_low ({self.theta_low}) must not exceed theta_high ({self.theta_high})"
            )
        if self.tau < 0:
            raise ConfigError(f"tau must be >= 0, got {self.tau!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.calibrate, bool):
            raise ConfigError(f"calibrate must be True or False, got {self.calibrate!r}")
        return self

    def replace(self, **overrides: Any) -> RecallConfig:
        """Return a copy with `overrides` applied (validated; unknown names raise)."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ConfigError(f"unknown RecallConfig fields: {sorted(unknown)}")
        return replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecallConfig:
        """Build from `to_dict` output; unknown keys raise `ConfigError`."""
        return cls().replace(**data)


@dataclass
class RecollectionTrace:
    """What the recollection loop did.

    Attributes:
        rounds: Rounds run.
        hits_per_round: New unique items added to the union in each round.
        searches: Query vectors searched in total.
    """

    rounds: int = 0
    hits_per_round: list[int] = field(default_factory=list)
    searches: int = 0


@dataclass
class RecallResult:
    """Ranked positions in the index, with the gate signals and timings.

    Attributes:
        positions: Index positions, best first (no `-1`, no duplicates, at most `k`).
        scores: Ranking score of each position (cosine to the query for familiarity and for
            re-scored recollection; the finding branch query's similarity otherwise).
        cosine: Cosine of each position to the original query.
        path: `familiarity`, `recollection` or `empty`.
        mean_score: s̄ over the probe's first `probe_k` hits (`nan` when empty).
        entropy: H of the tempered softmax over the same hits (`nan` when empty).
        trace: Recollection trace (rounds 0 on the familiarity path).
        filled: Items appended from the probe because recollection gathered fewer than `k`.
        timings_ms: `probe`, `recollection` and `total` milliseconds.
    """

    positions: np.ndarray
    scores: np.ndarray
    cosine: np.ndarray
    path: str
    mean_score: float
    entropy: float
    trace: RecollectionTrace = field(default_factory=RecollectionTrace)
    filled: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)

    def diagnostics(self) -> dict[str, Any]:
        """The diagnostics a `Retrieval` carries: path, s̄, H, rounds, hits per round, ms."""
        return {
            "path": self.path,
            "mean_score": None if math.isnan(self.mean_score) else round(self.mean_score, 6),
            "entropy": None if math.isnan(self.entropy) else round(self.entropy, 6),
            "rounds": self.trace.rounds,
            "hits_per_round": list(self.trace.hits_per_round),
            "searches": self.trace.searches,
            "filled": self.filled,
            "ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
        }


def _as_query(query: np.ndarray) -> np.ndarray:
    q = np.asarray(query, dtype=np.float32)
    if q.ndim == 2 and q.shape[0] == 1:
        q = q[0]
    if q.ndim != 1 or q.size == 0:
        raise InvalidInputError(f"query must be one vector of shape (d,), got {q.shape}")
    if not np.all(np.isfinite(q)):
        raise InvalidInputError("query vector contains NaN or infinity")
    return _norm(q)


def _norm(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


def _check_k(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}")
    return int(k)


def gate_signals(scores: np.ndarray, lam: float = 20.0) -> tuple[float, float]:
    """Mean score s̄ and entropy H of a probe list (Eqs. 1–2 of the paper).

    Args:
        scores: Probe similarities (any order; `-inf` padding is ignored).
        lam: λ, the softmax sharpness.

    Returns:
        `(mean, entropy)`; `(nan, nan)` for an empty list. Entropy uses natural logs, so it lies
        in `[0, log k]`.

    Example:
        >>> m, h = gate_signals(np.array([0.9, 0.1, 0.1]), lam=20.0)
        >>> round(m, 3), h < 0.01
        (0.367, True)
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    s = s[np.isfinite(s)]
    if s.size == 0:
        return float("nan"), float("nan")
    z = lam * (s - s.max())
    p = np.exp(z)
    p /= p.sum()
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum())
    return float(s.mean()), max(entropy, 0.0)


def choose_path(mean_score: float, entropy: float, config: RecallConfig) -> str:
    """The paper's gate (Eq. 3): familiarity or recollection.

    Familiarity if `s̄ >= θ_high`; recollection if `s̄ <= θ_low`; in between, familiarity iff
    `H <= τ`. `mode` other than `rfmem` forces its path; an empty probe gives `empty`.
    """
    if math.isnan(mean_score):
        return "empty"
    if config.mode == "familiarity":
        return "familiarity"
    if config.mode == "recollection":
        return "recollection"
    if mean_score >= config.theta_high:
        return "familiarity"
    if mean_score <= config.theta_low:
        return "recollection"
    return "familiarity" if entropy <= config.tau else "recollection"


def _valid(scores: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = positions >= 0
    return scores[keep], positions[keep]


def familiarity(index: Any, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2: top-`k` positions and cosine scores for one query vector."""
    k = _check_k(k)
    idx = as_vector_index(index)
    q = _as_query(query)
    if idx.ntotal == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.int64)
    s, p = idx.search(q[None, :], k)
    return _valid(s[0], p[0])


def _kmeans_labels(x: np.ndarray, k: int, config: RecallConfig) -> np.ndarray:
    """Cluster rows of `x` into `k` groups; return a label per row."""
    if k <= 1:
        return np.zeros(len(x), dtype=np.int64)
    if config.kmeans == "sklearn":
        from sklearn.cluster import KMeans

        km = KMeans(n_clusters=k, n_init=1, max_iter=config.kmeans_iters, random_state=config.seed)
        return km.fit_predict(x.astype(np.float64)).astype(np.int64)
    import faiss

    km = faiss.Kmeans(
        x.shape[1],
        k,
        niter=config.kmeans_iters,
        seed=config.seed,
        min_points_per_centroid=1,
        max_points_per_centroid=1 << 20,
        verbose=False,
    )
    km.train(np.ascontiguousarray(x, dtype=np.float32))
    _, lab = km.index.search(np.ascontiguousarray(x, dtype=np.float32), 1)
    return lab[:, 0].astype(np.int64)


def recollect(
    index: Any,
    query: np.ndarray,
    k: int,
    config: RecallConfig | None = None,
    probe: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, RecollectionTrace]:
    """Algorithm 3: retrieve → cluster → α-mix → iterate.

    Round `r` searches each beam query for `N = (B + r) · F` candidates, clusters each
    candidate set into `min(B, |C|)` groups by KMeans, turns each group into a new query
    `norm(α x + (1 − α) g + x_t)` (g the normalised group mean, x the parent query, x_t the
    original query), keeps the `B` branches whose groups score highest under their new query,
    and adds those groups' unseen items to the union, scored by the new query. It stops when the
    union holds `k` items or after `R` rounds, and returns the union's top `k`.

    Args:
        index: A `VectorIndex` (or anything `as_vector_index` accepts).
        query: Query vector `(d,)` (normalised here).
        k: Items wanted.
        config: Parameters (`beam`, `fanout`, `rounds`, `alpha`, `rescore`, `kmeans`, `seed`).
        probe: Positions of an exact-same-index top-n search for `query` already made (the
            gate's probe); round 0 reuses its first `B · F` instead of searching again when
            it holds that many (or the whole index).

    Returns:
        `(positions, scores, cosine, trace)`: positions best first, their ranking scores (see
        `RecallConfig.rescore`), their cosine to the original query, and the loop's trace.
    """
    cfg = RecallConfig() if config is None else config
    k = _check_k(k)
    idx = as_vector_index(index)
    x_t = _as_query(query)
    trace = RecollectionTrace()
    empty = np.zeros(0, np.int64)
    if idx.ntotal == 0:
        return empty, np.zeros(0, np.float32), np.zeros(0, np.float32), trace
    beam: list[np.ndarray] = [x_t]
    bag: dict[int, float] = {}  # insertion-ordered: position -> branch score
    for r in range(cfg.rounds):
        n = (cfg.beam + r) * cfg.fanout
        if r == 0 and probe is not None and (len(probe) >= n or len(probe) == idx.ntotal):
            pos = np.asarray(probe[:n], dtype=np.int64)[None, :]
        else:
            queries = np.stack(beam).astype(np.float32)
            _, pos = idx.search(queries, n)
            trace.searches += len(beam)
        flat = np.unique(pos[pos >= 0])
        if flat.size == 0:
            break
        vec_of = dict(zip(flat.tolist(), idx.vectors(flat), strict=True))
        branches: list[tuple[float, int, np.ndarray, list[int]]] = []
        for parent, row in zip(beam, pos, strict=True):
            cand = [int(p) for p in row if p >= 0]
            if not cand:
                continue
            z = np.stack([vec_of[p] for p in cand])
            labels = _kmeans_labels(z, min(cfg.beam, len(cand)), cfg)
            for b in np.unique(labels):
                members = [cand[i] for i in np.flatnonzero(labels == b)]
                g = _norm(z[labels == b].mean(axis=0))
                x_new = _norm(cfg.alpha * parent + (1.0 - cfg.alpha) * g + x_t)
                branch_score = float((z[labels == b] @ x_new).sum())
                branches.append((branch_score, len(branches), x_new, members))
        if not branches:
            break
        trace.rounds = r + 1
        branches.sort(key=lambda t: (-t[0], t[1]))
        kept = branches[: cfg.beam]
        added = 0
        for _, _, x_new, members in kept:
            for p in members:
                if p not in bag:
                    bag[p] = float(vec_of[p] @ x_new)
                    added += 1
        trace.hits_per_round.append(added)
        beam = [t[2] for t in kept]
        if len(bag) >= k:
            break
    if not bag:
        return empty, np.zeros(0, np.float32), np.zeros(0, np.float32), trace
    positions = np.fromiter(bag.keys(), dtype=np.int64, count=len(bag))
    branch_scores = np.fromiter(bag.values(), dtype=np.float32, count=len(bag))
    cosine = (idx.vectors(positions) @ x_t).astype(np.float32)
    rank_by = cosine if cfg.rescore else branch_scores
    order = np.argsort(-rank_by, kind="stable")[:k]
    return positions[order], rank_by[order], cosine[order], trace


def recall(
    index: Any,
    query: np.ndarray,
    k: int,
    config: RecallConfig | None = None,
    **overrides: Any,
) -> RecallResult:
    """RF-Mem retrieval of `k` positions for one query vector (Algorithm 1).

    Runs one probe search for `max(k, probe_k)` hits, computes s̄ and H over the first `probe_k`,
    and either returns the probe's top `k` (familiarity) or runs `recollect` (recollection).

    Args:
        index: A `VectorIndex` holding one user's memories.
        query: Query vector `(d,)`.
        k: Items wanted.
        config: Parameters; `None` uses the paper's defaults.
        **overrides: Per-call overrides of `config` fields.

    Returns:
        A `RecallResult`.

    Raises:
        InvalidInputError: Bad query, `k` or index.
        ConfigError: Bad parameter override.
    """
    cfg = RecallConfig() if config is None else config
    if overrides:
        cfg = cfg.replace(**overrides)
    k = _check_k(k)
    idx = as_vector_index(index)
    x_t = _as_query(query)
    t0 = time.perf_counter()
    if idx.ntotal == 0:
        nothing = np.zeros(0, np.float32)
        return RecallResult(
            np.zeros(0, np.int64), nothing, nothing, "empty", float("nan"), float("nan"),
            timings_ms={"probe": 0.0, "recollection": 0.0, "total": 0.0},
        )  # fmt: skip
    s, p = idx.search(x_t[None, :], max(k, cfg.probe_k))
    probe_s, probe_p = _valid(s[0], p[0])
    mean, ent = gate_signals(probe_s[: cfg.probe_k], cfg.lam)
    path = choose_path(mean, ent, cfg)
    t1 = time.perf_counter()
    trace = RecollectionTrace()
    filled = 0
    if path == "recollection":
        pos, scores, cos, trace = recollect(idx, x_t, k, cfg, probe=probe_p)
        if cfg.fill and len(pos) < k:
            have = set(pos.tolist())
            extra = [i for i, q in enumerate(probe_p.tolist()) if q not in have][: k - len(pos)]
            if extra:
                filled = len(extra)
                pos = np.concatenate([pos, probe_p[extra]])
                scores = np.concatenate([scores, probe_s[extra]])
                cos = np.concatenate([cos, probe_s[extra]])
    elif path == "familiarity":
        pos, scores = probe_p[:k], probe_s[:k]
        cos = scores
    else:
        pos, scores, cos = probe_p[:0], probe_s[:0], probe_s[:0]
    t2 = time.perf_counter()
    return RecallResult(
        positions=pos.astype(np.int64),
        scores=scores.astype(np.float32),
        cosine=cos.astype(np.float32),
        path=path,
        mean_score=mean,
        entropy=ent,
        trace=trace,
        filled=filled,
        timings_ms={
            "probe": (t1 - t0) * 1000.0,
            "recollection": (t2 - t1) * 1000.0,
            "total": (t2 - t0) * 1000.0,
        },
    )
