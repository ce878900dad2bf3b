"""Per-user adaptation on top of a shared prior reranker.

A user gives tens of feedback episodes, far too few to learn RMM's two `dim x dim` maps from
scratch, and what those maps learn is tied to the directions of the questions asked. So with
`rerank_scope="user"` (the default) a user's ranking is scored by

    s_i = prior(q, m_i, f_i) + delta_u . f_i

where `prior` is one `Reranker` shared by the users of a memory (RMM's residual maps plus
side-feature weights `w_f`, learned from every user's feedback) and `delta_u` is a small vector
of per-user offsets to the feature weights, learned from that user's feedback only by the same
REINFORCE rule on the same Plackett–Luce policy, and pulled back toward zero (the prior) at
every step. `UserAdapter` holds `delta_u`: F floats plus counters, serialisable to a few hundred
bytes of JSON (`to_bytes` / `from_bytes`), saved with the user's data and erased with the user.
`PersonalReranker` is the view that scores with prior + offsets; it offers the scoring API of
`Reranker`, so adapters that rank their own candidates use it unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.rmm.config import EPISODE_BASELINE, RerankConfig
from reflective_memory.rmm.episodes import Episode, RerankResult
from reflective_memory.rmm.features import Candidates, project_signs
from reflective_memory.rmm.reranker import MAX_ABS_WEIGHT, Reranker
from reflective_memory.rmm.sealed import unseal

__all__ = ["UserAdapter", "PersonalReranker"]

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
#: The `RerankConfig` fields an adapter uses, by their names in states saved before 0.2.
_ADAPTER_FIELDS = {
    "features": "features",
    "learning_rate": "user_learning_rate",
    "decay": "user_decay",
    "tau": "tau",
    "baseline": "baseline",
}
#: Largest norm of one episode's gradient step direction (guards against a freak episode).
_MAX_GRAD_NORM = 5.0


class UserAdapter:
    """One user's offsets to the prior's feature weights, learned by REINFORCE.

    Args:
        config: Hyperparameters (`RerankConfig`, which holds their defaults and validates
            them): `features` (the prior's side features, in the same order),
            `user_learning_rate` (step size per episode, plain SGD), `user_decay` (pull toward
            zero per episode as a fraction of the step, `delta -= lr * decay * delta`: without
            fresh evidence a user's ranking drifts back to the prior), `tau` and `baseline`
            (the prior's policy). `None`: `RerankConfig()`.

    Example:
        >>> a = UserAdapter(RerankConfig(features=("cost",), user_learning_rate=0.1))
        >>> a.is_zero
        True
    """

    def __init__(self, config: RerankConfig | None = None) -> None:
        if config is not None and not isinstance(config, RerankConfig):
            raise ConfigError(f"config must be a RerankConfig, got {type(config).__name__}")
        self.config = RerankConfig() if config is None else config
        self.delta_ = np.zeros(len(self.features), dtype=np.float64)
        self.n_episodes_ = 0
        self.n_updates_ = 0

    @property
    def features(self) -> tuple[str, ...]:
        """Names of the side features (`config.features`)."""
        return self.config.features

    @property
    def is_zero(self) -> bool:
        """True while the user ranks exactly as the prior does."""
        return not np.any(self.delta_)

    def offsets(self, features: np.ndarray | None) -> np.ndarray | None:
        """`(K,)` per-candidate score offsets `f_i . delta` (None without features)."""
        if features is None or not self.features:
            return None
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != len(self.features):
            raise InvalidInputError(
                f"features must have shape (K, {len(self.features)}), got {f.shape}"
            )
        return (f @ self.delta_).astype(np.float32)

    def gradient(self, episode: Episode, base_scores: np.ndarray) -> np.ndarray:
        """REINFORCE gradient (ascent direction) of the episode's reward w.r.t. the offsets.

        Args:
            episode: Shown order, rewards and the `(K, F)` features of the candidates.
            base_scores: `(K,)` scores of the prior for the same candidates (without offsets).
        """
        f = np.asarray(episode.features, dtype=np.float64)
        base = np.asarray(base_scores, dtype=np.float64).reshape(-1)
        if f.ndim != 2 or f.shape != (base.shape[0], len(self.features)):
            raise InvalidInputError("episode features do not fit the adapter")
        tau, baseline = self.config.tau, self.config.baseline
        logits = (base + f @ self.delta_) / tau
        r = np.asarray(episode.rewards, dtype=np.float64)
        adv = r - (r.mean() if baseline == EPISODE_BASELINE else float(baseline))
        avail = np.ones(len(base), dtype=bool)
        grad = np.zeros(len(self.features), dtype=np.float64)
        for a, i in zip(adv, episode.shown, strict=True):
            z = np.where(avail, logits, -np.inf)
            p = np.exp(z - z.max())
            p /= p.sum()
            grad += a * (f[i] - p @ f) / tau
            avail[i] = False
        return grad

    def update(
        self,
        episode: Episode,
        base_scores: np.ndarray,
        prior_weights: np.ndarray | None = None,
        signs: np.ndarray | None = None,
    ) -> float:
        """One policy-gradient step on one episode; returns the step's norm.

        An episode without features, or whose rewards do not differ under the episode
        baseline, leaves the offsets exactly as they were (decay included: nothing learned,
        nothing forgotten). With `signs` (see `FEATURE_SIGNS`) and the prior's feature weights,
        the offsets are clipped so that prior + offsets keeps every weight on its allowed side.
        """
        self.n_episodes_ += 1
        lr, decay = self.config.user_learning_rate, self.config.user_decay
        if episode.features is None or not self.features or lr == 0:
            return 0.0
        grad = self.gradient(episode, base_scores)
        if not np.any(grad):
            return 0.0
        norm = float(np.linalg.norm(grad))
        if norm > _MAX_GRAD_NORM:
            grad *= _MAX_GRAD_NORM / norm
        before = self.delta_.copy()
        self.delta_ = (self.delta_ + lr * grad) * (1.0 - lr * decay)
        if signs is not None and prior_weights is not None:
            w = np.asarray(prior_weights, dtype=np.float64).reshape(-1)
            self.delta_ = project_signs(w + self.delta_, np.asarray(signs)) - w
        self.n_updates_ += 1
        return float(np.linalg.norm(self.delta_ - before))

    # ----------------------------------------------------------- persistence
    def get_params(self) -> dict[str, Any]:
        """Constructor parameters: the hyperparameters of `config` the adapter uses."""
        return {"config": {k: _plain(getattr(self.config, k)) for k in _ADAPTER_FIELDS.values()}}

    def to_bytes(self) -> bytes:
        """The state as UTF-8 JSON (`{"type", "init_parameters", "state"}`)."""
        doc = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "format_version": _FORMAT_VERSION,
            "init_parameters": self.get_params(),
            "state": {
                "delta": [float(x) for x in self.delta_],
                "n_episodes": self.n_episodes_,
                "n_updates": self.n_updates_,
            },
        }
        return json.dumps(doc).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, config: RerankConfig | None = None) -> UserAdapter:
        """Rebuild from `to_bytes` output (or that output sealed: `reflective_memory.rmm.sealed`).

        Offsets saved for other features than `config`'s are dropped (the user starts again
        from the prior). States written before 0.2 load too (a memory-credit table in them,
        removed in 0.2, is ignored).

        Args:
            data: The bytes.
            config: Hyperparameters to use instead of the saved ones (`None`: the saved ones).

        Raises:
            ModelLoadError: Not an adapter state.
        """
        try:
            doc = json.loads(unseal(data)[0].decode("utf-8"))
            if doc.get("format_version") != _FORMAT_VERSION:
                raise ValueError("unsupported format")
            params = dict(doc["init_parameters"])
            if "config" in params:
                fields = dict(params["config"])
            else:  # before 0.2: flat constructor arguments under the adapter's own names
                fields = {new: params[old] for old, new in _ADAPTER_FIELDS.items() if old in params}
            fields["features"] = tuple(fields.get("features", ()))
            saved = RerankConfig(**fields)
            obj = cls(saved if config is None else config)
            delta = np.asarray(doc["state"]["delta"], dtype=np.float64)
            if delta.shape != (len(saved.features),):
                raise ValueError(
                    f"offsets of shape {delta.shape} for {len(saved.features)} features"
                )
            if not np.all(np.isfinite(delta)):
                raise ValueError("non-finite offsets")
            if delta.size and float(np.abs(delta).max()) > MAX_ABS_WEIGHT:
                raise ValueError(f"offsets beyond the bound {MAX_ABS_WEIGHT:g}")
            if obj.features == saved.features:
                obj.delta_ = delta
                obj.n_episodes_ = int(doc["state"]["n_episodes"])
                obj.n_updates_ = int(doc["state"]["n_updates"])
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            UnicodeDecodeError,
            ConfigError,
        ) as exc:
            raise ModelLoadError(f"not a user adapter state: {exc}") from exc
        return obj

    def __repr__(self) -> str:
        return f"UserAdapter(features={list(self.features)}, updates={self.n_updates_})"


def _plain(value: Any) -> Any:
    """A config value as JSON (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


class PersonalReranker:
    """A user's view of the reranker: the shared prior plus the user's own offsets.

    Offers the scoring API of `Reranker` (`score`, `rerank`, `probabilities`,
    `features_of`, `feature_matrix`); learning goes through `RerankStage.learn`, which updates
    both parts.

    Args:
        prior: The shared reranker.
        adapter: The user's offsets (same feature names as the prior).
    """

    def __init__(self, prior: Reranker, adapter: UserAdapter) -> None:
        if tuple(adapter.features) != tuple(prior.features):
            raise ConfigError("the user adapter and the prior must use the same features")
        self.prior = prior
        self.adapter = adapter

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self.prior.dim

    @property
    def top_m(self) -> int:
        """Size of the sampled head."""
        return self.prior.config.top_m

    @property
    def tau(self) -> float:
        """Policy temperature."""
        return self.prior.config.tau

    @property
    def features(self) -> tuple[str, ...]:
        """Side-feature names."""
        return self.prior.features

    @property
    def n_features(self) -> int:
        """Number of side features."""
        return self.prior.n_features

    @property
    def n_updates_(self) -> int:
        """Steps the user's own offsets took."""
        return self.adapter.n_updates_

    @property
    def is_identity(self) -> bool:
        """True while this user's ranking is the retriever's (prior untrained, no offsets)."""
        return self.prior.is_identity and self.adapter.is_zero

    def feature_matrix(self, texts: Sequence[str], query: str | None = None) -> np.ndarray | None:
        """See `Reranker.feature_matrix`."""
        return self.prior.feature_matrix(texts, query=query)

    def features_of(self, candidates: Candidates) -> np.ndarray | None:
        """See `Reranker.features_of`."""
        return self.prior.features_of(candidates)

    def _offset(self, features: np.ndarray | None, offset: np.ndarray | None) -> np.ndarray | None:
        own = self.adapter.offsets(features)
        if offset is None:
            return own
        return np.asarray(offset, dtype=np.float32) if own is None else own + offset

    def score(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        features: np.ndarray | None = None,
        offset: np.ndarray | None = None,
    ) -> np.ndarray:
        """Prior scores plus the user's offsets (see `Reranker.score`)."""
        return self.prior.score(query, candidates, prior, features, self._offset(features, offset))

    def rerank(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        *,
        explore: bool = False,
        top_m: int | None = None,
        features: np.ndarray | None = None,
        offset: np.ndarray | None = None,
    ) -> RerankResult:
        """Order the candidates (see `Reranker.rerank`)."""
        return self.prior.rerank(
            query,
            candidates,
            prior,
            explore=explore,
            top_m=top_m,
            features=features,
            offset=self._offset(features, offset),
        )

    def probabilities(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        features: np.ndarray | None = None,
    ) -> np.ndarray:
        """See `Reranker.probabilities`."""
        return self.prior.probabilities(
            query, candidates, prior, features, self._offset(features, None)
        )

    def __repr__(self) -> str:
        return f"PersonalReranker(prior={self.prior!r}, adapter={self.adapter!r})"
