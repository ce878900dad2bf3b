"""RMM retrospective reflection: a residual linear reranker trained by REINFORCE on citations."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError, safe_open

from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.lazy import LazyModule
from reflective_memory.rmm.config import EPISODE_BASELINE, RerankConfig
from reflective_memory.rmm.episodes import Episode, FitReport, RerankResult
from reflective_memory.rmm.features import (
    Candidates,
    candidate_features,
    project_signs,
    sign_vector,
)
from reflective_memory.rmm.sealed import unseal

if TYPE_CHECKING:
    import torch
else:  # torch loads when a reranker is first built, not when the engine is imported
    torch = LazyModule("torch")

__all__ = ["Reranker", "MAX_ABS_WEIGHT", "MAX_ABS_VALUE"]

logger = logging.getLogger(__name__)


def load_bytes(raw: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors payload (`safetensors.torch.load`, imported on first use)."""
    from safetensors.torch import load

    return load(raw)


def save_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors payload of `tensors` (`safetensors.torch.save`, imported on first use)."""
    from safetensors.torch import save

    return save(tensors, metadata=metadata)


_FORMAT_VERSION = 1
#: Largest magnitude a saved weight may have: far above anything SGD reaches on scores of
#: unit-length embeddings, far below what a flipped exponent bit gives (up to 3.4e38).
MAX_ABS_WEIGHT = 1e3
#: Largest magnitude of any other saved value (buffered episodes' embeddings, scores, features).
MAX_ABS_VALUE = 1e6
_WEIGHTS = ("w_q", "w_m", "w_f")
#: Key of the safetensors file's SHA-256 in the JSON file `save` writes beside it.
_FILE_CHECKSUM = "safetensors_sha256"
#: The `RerankConfig` fields a reranker uses (saved with it).
_CONFIG_FIELDS = (
    "top_m",
    "tau",
    "learning_rate",
    "baseline",
    "batch_size",
    "features",
    "feature_learning_rate",
    "signed_features",
    "seed",
)


class Reranker:
    """Residual linear reranker over retriever embeddings, learned by REINFORCE.

    Scores `s_i = (q + W_q q) . (m_i + W_m m_i) + w_f . f_i` (plus, with a prior, the prior's
    scale: see `score`). `W_q`, `W_m` and `w_f` start at zero, so an untrained reranker keeps
    the retriever's order; each optimizer step is plain SGD, `W -= eta * grad`.

    Args:
        dim: Embedding dimension.
        config: Hyperparameters (`top_m`, `tau`, `learning_rate`, `baseline`, `batch_size`,
            `features`, `feature_learning_rate`, `signed_features`, `seed`; see
            `RerankConfig`, which holds their defaults and validates them). `None`:
            `RerankConfig()`. RMM's paper form is `RerankConfig(features=(),
            learning_rate=1e-3, baseline=0.5, signed_features=False)`.

    Example:
        >>> import numpy as np
        >>> r = Reranker(dim=4, config=RerankConfig(top_m=2, features=()))
        >>> q = np.array([1, 0, 0, 0], dtype=np.float32)
        >>> m = np.eye(4, dtype=np.float32)[[2, 0, 1]]
        >>> r.rerank(q, m).order[:2]
        [1, 0]
    """

    def __init__(self, dim: int, config: RerankConfig | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"dim must be a positive int, got {dim!r}")
        if config is not None and not isinstance(config, RerankConfig):
            raise ConfigError(f"config must be a RerankConfig, got {type(config).__name__}")
        self.dim = dim
        self.config = RerankConfig() if config is None else config
        self._gen = np.random.default_rng(self.config.seed)
        self._reset()

    # ----------------------------------------------------------------- state
    def _reset(self) -> None:
        # allocated (and torch imported) on first use: an untrained reranker that only keeps
        # the retriever's order never needs them
        self._weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.n_updates_ = 0
        self.n_episodes_ = 0
        self.pending_: list[Episode] = []
        self.last_fit_: FitReport | None = None

    def _params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._weights is None:
            d, f = self.dim, self.n_features
            self._weights = (
                torch.zeros(d, d, dtype=torch.float32, requires_grad=True),
                torch.zeros(d, d, dtype=torch.float32, requires_grad=True),
                torch.zeros(f, dtype=torch.float32, requires_grad=True),
            )
        return self._weights

    @property
    def w_q_(self) -> torch.Tensor:
        """Learned query map (`dim × dim`, residual)."""
        return self._params()[0]

    @property
    def w_m_(self) -> torch.Tensor:
        """Learned memory map (`dim × dim`, residual)."""
        return self._params()[1]

    @property
    def w_f_(self) -> torch.Tensor:
        """Learned side-feature weights (`n_features`)."""
        return self._params()[2]

    @property
    def features(self) -> tuple[str, ...]:
        """Names of the side features scored (`config.features`)."""
        return self.config.features

    @property
    def n_features(self) -> int:
        """Number of side features per candidate."""
        return len(self.config.features)

    def feature_matrix(self, texts: Sequence[str], query: str | None = None) -> np.ndarray | None:
        """The `(K, F)` side features of candidates known only by text (None without features).

        Features that need more than the text and the query (retriever scores, stored
        memories) come out neutral; `features_of` takes everything known.
        """
        return self.features_of(Candidates(list(texts), query=query))

    def features_of(self, candidates: Candidates) -> np.ndarray | None:
        """The `(K, F)` side features of these candidates (None without features)."""
        return candidate_features(self.features, candidates)

    @property
    def is_identity(self) -> bool:
        """True while the adaptation maps and feature weights are exactly zero (untrained)."""
        if self._weights is None:
            return True
        with torch.no_grad():
            return bool(
                torch.all(self.w_q_ == 0)
                and torch.all(self.w_m_ == 0)
                and torch.all(self.w_f_ == 0)
            )

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters: `dim` and the hyperparameters of `config` it uses."""
        return {
            "dim": self.dim,
            "config": {name: _plain(getattr(self.config, name)) for name in _CONFIG_FIELDS},
        }

    # --------------------------------------------------------------- scoring
    def _scores_t(
        self,
        q: torch.Tensor,
        m: torch.Tensor,
        prior: torch.Tensor | None,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q2 = q + self.w_q_ @ q
        m2 = m + m @ self.w_m_.T
        s = m2 @ q2
        if features is not None:
            s = s + features @ self.w_f_
        if prior is not None:
            s = s - (m @ q).detach() + prior
        return s

    def score(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        features: np.ndarray | None = None,
        offset: np.ndarray | None = None,
    ) -> np.ndarray:
        """Reranker scores of candidates for one query.

        Args:
            query: `(dim,)` query embedding.
            candidates: `(K, dim)` candidate embeddings.
            prior: Optional `(K,)` prior scores on the cosine scale (see `rank_prior`).
            features: `(K, n_features)` side features; required exactly when `n_features > 0`.
            offset: Optional `(K,)` scores added on top (e.g. a user's own adaptation).

        Returns:
            `(K,)` float32 scores.
        """
        ins = self._inputs(query, candidates, prior, features)
        q, m, p, f = (None if t is None else t.numpy() for t in ins)
        # `_scores_t` as single-threaded einsum mat-vecs, (m + m W_m^T) q' = m (q' + W_m^T q'):
        # BLAS / torch thread pools cost 10-30 ms per tiny call on a busy machine.
        w_q, w_m = self.w_q_.detach().numpy(), self.w_m_.detach().numpy()
        q2 = q + np.einsum("ij,j->i", w_q, q)
        u = q2 + np.einsum("ji,j->i", w_m, q2)
        if p is not None:
            u = u - q
        out = np.einsum("kd,d->k", m, u)
        if f is not None:
            out = out + np.einsum("kf,f->k", f, self.w_f_.detach().numpy())
        if p is not None:
            out = out + p
        out = np.asarray(out, dtype=np.float32)
        if offset is not None:
            off = np.asarray(offset, dtype=np.float32).reshape(-1)
            if off.shape != out.shape or not np.all(np.isfinite(off)):
                raise InvalidInputError("offset must give one finite score per candidate")
            out = out + off
        return out

    def _inputs(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None,
        features: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        m = np.asarray(candidates, dtype=np.float32)
        if m.ndim == 1:
            m = m.reshape(1, -1)
        if q.shape[0] != self.dim or m.ndim != 2 or m.shape[1] != self.dim:
            raise InvalidInputError(
                f"expected query ({self.dim},) and candidates (K, {self.dim}), got {q.shape} "
                f"and {m.shape}"
            )
        p = None
        if prior is not None:
            pa = np.asarray(prior, dtype=np.float32).reshape(-1)
            if pa.shape[0] != m.shape[0]:
                raise InvalidInputError("prior must give one score per candidate")
            p = torch.from_numpy(pa.copy())
        f = None
        if self.n_features == 0:
            if features is not None:
                raise InvalidInputError("this reranker takes no features (n_features=0)")
        else:
            if features is None:
                raise InvalidInputError(
                    f"this reranker scores {self.n_features} side feature(s) per candidate; "
                    "pass features"
                )
            fa = np.asarray(features, dtype=np.float32)
            if fa.shape != (m.shape[0], self.n_features) or not np.all(np.isfinite(fa)):
                raise InvalidInputError(
                    f"features must be finite with shape ({m.shape[0]}, {self.n_features}), "
                    f"got {fa.shape}"
                )
            f = torch.from_numpy(fa.copy())
        return torch.from_numpy(q.copy()), torch.from_numpy(m.copy()), p, f

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
        """Order the candidates.

        Args:
            query: `(dim,)` query embedding.
            candidates: `(K, dim)` candidate embeddings in the retriever's order.
            prior: Optional `(K,)` prior scores (see `rank_prior`).
            explore: Sample the head with Gumbel noise (learning) instead of taking it by score.
            top_m: Size of the sampled head (default `config.top_m`); the rest follows by score.
            features: `(K, n_features)` side features (required when `n_features > 0`).
            offset: Optional `(K,)` scores added on top (see `score`).

        Returns:
            A `RerankResult` with all K positions ordered.
        """
        scores = self.score(query, candidates, prior, features, offset)
        k = scores.shape[0]
        # Stable sort: equal scores keep the retriever's order.
        by_score = [int(i) for i in np.argsort(-scores, kind="stable")]
        if not explore or k <= 1:
            return RerankResult(by_score, scores, False)
        m = min(self.config.top_m if top_m is None else top_m, k)
        u = self._gen.uniform(np.finfo(np.float32).tiny, 1.0, size=k)
        perturbed = scores.astype(np.float64) / self.config.tau - np.log(-np.log(u))
        head = [int(i) for i in np.argsort(-perturbed, kind="stable")[:m]]
        chosen = set(head)
        return RerankResult(head + [i for i in by_score if i not in chosen], scores, True)

    def probabilities(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        features: np.ndarray | None = None,
        offset: np.ndarray | None = None,
    ) -> np.ndarray:
        """`softmax(s / tau)` over the candidates: each one's chance to be sampled first."""
        s = torch.from_numpy(self.score(query, candidates, prior, features, offset))
        s = s / self.config.tau
        return torch.softmax(s, dim=0).numpy()

    # -------------------------------------------------------------- learning
    def log_prob(self, episode: Episode) -> torch.Tensor:
        """Per-position Plackett–Luce log-probabilities of an episode's shown order."""
        ep = episode.checked(self.dim)
        q, m, p, f = self._inputs(ep.query, ep.candidates, ep.prior, ep.features)
        logits = self._scores_t(q, m, p, f) / self.config.tau
        mask = torch.zeros(logits.shape[0], dtype=torch.bool)
        out = []
        for i in ep.shown:
            avail = logits.masked_fill(mask, float("-inf"))
            out.append(logits[i] - torch.logsumexp(avail, dim=0))
            mask = mask.clone()
            mask[i] = True
        return torch.stack(out)

    def _step(self, episodes: list[Episode]) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny tensors: a thread pool only adds waits on a busy box
        try:
            return self._step_batch(episodes)
        finally:
            torch.set_num_threads(threads)

    def _step_batch(self, episodes: list[Episode]) -> float:
        """One plain SGD step on the mean REINFORCE loss of `episodes`: `W -= eta * grad`."""
        cfg = self.config
        params = [self.w_q_, self.w_m_, self.w_f_]
        for w in params:
            w.grad = None
        total = torch.zeros(())
        for ep in episodes:
            lp = self.log_prob(ep)
            r = torch.from_numpy(ep.rewards)
            adv = r - (r.mean() if cfg.baseline == EPISODE_BASELINE else cfg.baseline)
            total = total - (adv * lp).sum()
        loss = total / len(episodes)
        loss.backward()
        f_lr = cfg.learning_rate if cfg.feature_learning_rate is None else cfg.feature_learning_rate
        with torch.no_grad():
            for w, lr in zip(params, (cfg.learning_rate, cfg.learning_rate, f_lr), strict=True):
                if w.grad is not None:
                    w -= lr * w.grad
                    w.grad = None
            if cfg.signed_features and self.n_features:
                signed = project_signs(self.w_f_.numpy(), sign_vector(self.features))
                self.w_f_.copy_(torch.from_numpy(signed.astype(np.float32)))
        self.n_updates_ += 1
        return float(loss.detach())

    def partial_fit(
        self, episodes: Episode | Sequence[Episode], *, flush: bool = False
    ) -> Reranker:
        """Buffer feedback episodes; take one REINFORCE step per full batch.

        Args:
            episodes: One episode or several.
            flush: Also step on a final partial batch.

        Returns:
            self. `last_fit_` holds a `FitReport` of this call.
        """
        eps = [episodes] if isinstance(episodes, Episode) else list(episodes)
        checked = [ep.checked(self.dim) for ep in eps]
        report = FitReport(episodes=len(checked))
        self.pending_.extend(checked)
        self.n_episodes_ += len(checked)
        size = self.config.batch_size
        while len(self.pending_) >= size:
            batch, self.pending_ = self.pending_[:size], self.pending_[size:]
            report.loss = self._step(batch)
            report.updates += 1
        if flush and self.pending_:
            report.loss = self._step(self.pending_)
            report.updates += 1
            self.pending_ = []
        report.pending = len(self.pending_)
        self.last_fit_ = report
        return self

    # ----------------------------------------------------------- persistence
    def _snapshot(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors and JSON config of the whole state (weights and buffered episodes)."""
        tensors: dict[str, torch.Tensor] = {
            "w_q": self.w_q_.detach().clone().contiguous(),
            "w_m": self.w_m_.detach().clone().contiguous(),
            "w_f": self.w_f_.detach().clone().contiguous(),
        }
        pending_meta = []
        for i, ep in enumerate(self.pending_):
            tensors[f"pending.{i}.query"] = torch.from_numpy(ep.query.copy())
            tensors[f"pending.{i}.candidates"] = torch.from_numpy(ep.candidates.copy())
            tensors[f"pending.{i}.rewards"] = torch.from_numpy(ep.rewards.copy())
            if ep.prior is not None:
                tensors[f"pending.{i}.prior"] = torch.from_numpy(ep.prior.copy())
            if ep.features is not None:
                tensors[f"pending.{i}.features"] = torch.from_numpy(ep.features.copy())
            has_p, has_f = ep.prior is not None, ep.features is not None
            pending_meta.append({"shown": ep.shown, "prior": has_p, "features": has_f})
        config = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "format_version": _FORMAT_VERSION,
            "init_parameters": self.get_params(),
            "state": {
                "n_updates": self.n_updates_,
                "n_episodes": self.n_episodes_,
                "pending": pending_meta,
            },
        }
        return tensors, config

    def to_bytes(self) -> bytes:
        """The whole state as one safetensors blob (config in its metadata), for any store."""
        tensors, config = self._snapshot()
        return bytes(save_bytes(tensors, metadata={"config": json.dumps(config)}))

    @classmethod
    def from_bytes(cls, data: bytes, config: RerankConfig | None = None) -> Reranker:
        """Rebuild a reranker from `to_bytes` output (see `load` for `config`).

        The output sealed with a checksum (`reflective_memory.rmm.sealed`, as state stores hold
        it) loads too, once the checksum is verified. The weights must have the shapes of the
        saved `dim` and features, and every value must be finite and within `MAX_ABS_WEIGHT`
        (weights) or `MAX_ABS_VALUE` (buffered episodes).

        Raises:
            ModelLoadError: The bytes are not a reranker state, or a damaged one.
        """
        try:
            if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 8:
                raise ValueError("too short")
            raw, _ = unseal(data)
            n = int.from_bytes(raw[:8], "little")
            header = json.loads(raw[8 : 8 + n])
            saved = json.loads(header["__metadata__"]["config"])
            tensors = load_bytes(raw)
        except (ValueError, KeyError, TypeError, SafetensorError) as exc:
            raise ModelLoadError(f"not a reranker state: {exc}") from exc
        return cls._restore(tensors, saved, config, "bytes")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save atomically as `<path>.safetensors` + `<path>.json`; return the JSON path.

        `path` may end in `.json` / `.safetensors` or have no suffix.
        """
        base = _base(path)
        base.parent.mkdir(parents=True, exist_ok=True)
        tensors, config = self._snapshot()
        st_path, js_path = _paths(base)
        text = json.dumps(config, indent=2)
        # The config also travels inside the safetensors metadata, so weights and config are
        # always read as one consistent snapshot; the JSON file is the readable copy, with the
        # checksum of the safetensors file that `load` verifies.
        payload = bytes(save_bytes(tensors, metadata={"config": text}))
        readable = {**config, _FILE_CHECKSUM: hashlib.sha256(payload).hexdigest()}
        _atomic(st_path, lambda p: Path(p).write_bytes(payload))
        _atomic(js_path, lambda p: Path(p).write_text(json.dumps(readable, indent=2)))
        return js_path

    @classmethod
    def load(cls, path: str | os.PathLike[str], config: RerankConfig | None = None) -> Reranker:
        """Load a reranker written by `save`.

        Files written before 0.2 load too: their `optimizer` and `weight_decay` settings and
        Adam state are dropped (training goes on with plain SGD); one that learned a
        `memory_bias` term (removed in 0.2) is refused, as it would score differently.

        Args:
            path: The base path (with or without `.json` / `.safetensors`).
            config: Hyperparameters to use instead of the saved ones (the weights, buffered
                episodes and counters are kept; weights of side features not saved start at
                zero). `None`: the saved hyperparameters.

        Raises:
            ModelLoadError: Files missing, unreadable, inconsistent, damaged (the checksum in
                the JSON file, or the checks of `from_bytes`), or from a reranker that learned
                a `memory_bias` term.
        """
        base = _base(path)
        st_path, js_path = _paths(base)
        try:
            raw = st_path.read_bytes()
            readable = json.loads(js_path.read_text()) if js_path.exists() else {}
            digest = readable.get(_FILE_CHECKSUM)  # files saved before checksums have none
            if digest is not None and digest != hashlib.sha256(raw).hexdigest():
                raise ModelLoadError(f"checksum mismatch: {st_path} was changed after saving")
            with safe_open(str(st_path), framework="pt") as fh:
                meta = fh.metadata() or {}
            tensors = load_bytes(raw)
            saved = json.loads(meta["config"]) if "config" in meta else readable
        except (OSError, ValueError, KeyError, AttributeError, SafetensorError) as exc:
            raise ModelLoadError(f"cannot read reranker at {base}: {exc}") from exc
        return cls._restore(tensors, saved, config, str(base))

    @classmethod
    def _restore(
        cls,
        tensors: dict[str, torch.Tensor],
        saved: dict[str, Any],
        config: RerankConfig | None,
        where: str,
    ) -> Reranker:
        if not isinstance(saved, dict) or saved.get("format_version") != _FORMAT_VERSION:
            raise ModelLoadError(f"unsupported reranker format in {where}")
        try:
            params = dict(saved["init_parameters"])
            # before 0.2 the hyperparameters were flat constructor arguments
            fields = dict(params.get("config", params))
            bias = tensors.get("b_m")
            if fields.get("memory_bias") and bias is not None and bool(torch.any(bias != 0)):
                raise ModelLoadError(
                    f"the reranker in {where} learned a memory_bias term, removed in 0.2 "
                    "(measured neutral or negative); start a fresh reranker"
                )
            saved_cfg = RerankConfig(
                **{k: _config_value(k, fields[k]) for k in _CONFIG_FIELDS if k in fields}
            )
            dim = int(params["dim"])
            _check_tensors(tensors, dim, len(saved_cfg.features), where)
            obj = cls(dim, saved_cfg if config is None else config)
            same_features = list(obj.features) == list(saved_cfg.features)
            with torch.no_grad():
                obj.w_q_.copy_(tensors["w_q"])
                obj.w_m_.copy_(tensors["w_m"])
                if obj.n_features and same_features:
                    obj.w_f_.copy_(tensors["w_f"])
            state = saved["state"]
            obj.n_updates_ = int(state["n_updates"])
            obj.n_episodes_ = int(state["n_episodes"])
            obj.pending_ = []
            for i, meta in enumerate(state["pending"]):
                obj.pending_.append(
                    Episode(
                        query=tensors[f"pending.{i}.query"].numpy(),
                        candidates=tensors[f"pending.{i}.candidates"].numpy(),
                        shown=[int(x) for x in meta["shown"]],
                        rewards=tensors[f"pending.{i}.rewards"].numpy(),
                        prior=tensors[f"pending.{i}.prior"].numpy() if meta["prior"] else None,
                        features=(
                            tensors[f"pending.{i}.features"].numpy()
                            if meta.get("features")
                            else None
                        ),
                    ).checked(obj.dim)
                )
        except (KeyError, RuntimeError, ValueError, TypeError, ConfigError) as exc:
            raise ModelLoadError(f"reranker state at {where} is inconsistent: {exc}") from exc
        if not same_features and obj.pending_:
            logger.info("dropping %d buffered episodes saved for other features", len(obj.pending_))
            obj.pending_ = []
        return obj

    def __repr__(self) -> str:
        return (
            f"Reranker(dim={self.dim}, top_m={self.config.top_m}, tau={self.config.tau}, "
            f"updates={self.n_updates_}, pending={len(self.pending_)})"
        )


def _check_tensors(tensors: dict[str, torch.Tensor], dim: int, n_features: int, where: str) -> None:
    """Check saved tensors before they are used: shapes, finite values, sane magnitudes.

    Raises:
        ModelLoadError: A weight has the wrong shape (copying would broadcast it), or a value is
            NaN, infinite or beyond `MAX_ABS_WEIGHT` / `MAX_ABS_VALUE` (damaged state).
    """
    expected = {"w_q": (dim, dim), "w_m": (dim, dim), "w_f": (n_features,)}
    for name, shape in expected.items():
        got = tensors.get(name)
        if got is None and name == "w_f":
            continue
        if got is None or tuple(got.shape) != shape:
            found = "missing" if got is None else f"shape {tuple(got.shape)}"
            raise ModelLoadError(f"reranker state at {where}: {name} is {found}, expected {shape}")
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        values = tensor.detach().to(torch.float64)
        if not bool(torch.all(torch.isfinite(values))):
            raise ModelLoadError(f"reranker state at {where}: {name} holds NaN or infinite values")
        bound = MAX_ABS_WEIGHT if name in _WEIGHTS else MAX_ABS_VALUE
        peak = float(values.abs().max()) if values.numel() else 0.0
        if peak > bound:
            raise ModelLoadError(
                f"reranker state at {where}: {name} holds {peak:.3g}, beyond the bound {bound:g}"
            )


def _plain(value: Any) -> Any:
    """A config value as JSON (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


def _config_value(name: str, value: Any) -> Any:
    """A saved config value as `RerankConfig` takes it (lists as tuples)."""
    return tuple(value) if name == "features" else value


def _base(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.suffix in (".json", ".safetensors"):
        p = p.with_suffix("")
    return p


def _paths(base: Path) -> tuple[Path, Path]:
    return base.parent / f"{base.name}.safetensors", base.parent / f"{base.name}.json"


def _atomic(target: Path, write: Any) -> None:
    """Write via a temporary file in the same folder, then rename over the target."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
