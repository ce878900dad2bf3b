"""RMM retrospective reflection: a residual linear reranker trained by REINFORCE on citations."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save_file
from safetensors.torch import save as save_bytes

from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.rmm.config import EPISODE_BASELINE
from reflective_memory.rmm.episodes import Episode, FitReport, RerankResult
from reflective_memory.rmm.features import (
    FEATURES,
    Candidates,
    candidate_features,
    project_signs,
    sign_vector,
)

__all__ = ["Reranker"]

logger = logging.getLogger(__name__)


_FORMAT_VERSION = 1


class Reranker:
    """Residual linear reranker over retriever embeddings, learned by REINFORCE.

    Args:
        dim: Embedding dimension.
        top_m: Memories selected from the candidates (paper: 5 of K = 20).
        tau: Gumbel-softmax temperature (paper: 0.5).
        learning_rate: `eta` (paper: 1e-3).
        baseline: REINFORCE baseline `b` (paper: 0.5), or `"episode"`: the mean reward of the
            episode's shown memories, so an episode teaches only through the contrast between
            cited and uncited memories (a constant `b` also pushes every shown memory down or
            up together, a large source of variance: pure-noise feedback then scrambles the
            ranking). A one-memory episode teaches nothing under `"episode"`.
        batch_size: Episodes per optimizer step (paper: 4).
        optimizer: `adam` (default) or `sgd` (plain `W -= eta * grad`).
        weight_decay: Decoupled L2 decay toward zero per step (`W -= eta * weight_decay * W`;
            AdamW for `adam`). Zero is the identity start, so decay pulls the reranker back to
            the retriever's order unless feedback keeps pushing. 0 (default): the paper's update.
        memory_bias: Extension (not in the paper): add a learned query-independent term `b . m_i`
            to every score, so the reranker can learn which kinds of memories get cited for
            any query (it starts at zero). Off by default.
        features: Extension (not in the paper): names of side features per candidate (see
            `FEATURES`; `("cost",)` is the memory's length), scored by a learned weight vector
            `w_f . f_i` that starts at zero. With features, every call must pass their `(K, F)`
            values; `features_of(candidates)` / `feature_matrix(texts)` compute them.
        feature_learning_rate: Extension: learning rate of the feature weights `w_f` (None:
            `learning_rate`). The few feature weights can take larger steps than the maps.
        signed_features: Extension: keep each feature weight on its allowed side of zero
            (`FEATURE_SIGNS`) after every step.
        seed: Seed of the Gumbel noise generator (None: nondeterministic).

    Example:
        >>> import numpy as np
        >>> r = Reranker(dim=4, top_m=2)
        >>> q = np.array([1, 0, 0, 0], dtype=np.float32)
        >>> m = np.eye(4, dtype=np.float32)[[2, 0, 1]]
        >>> r.rerank(q, m).order[:2]
        [1, 0]
    """

    def __init__(
        self,
        dim: int,
        *,
        top_m: int = 5,
        tau: float = 0.5,
        learning_rate: float = 1e-3,
        baseline: float | str = 0.5,
        batch_size: int = 4,
        optimizer: str = "adam",
        weight_decay: float = 0.0,
        memory_bias: bool = False,
        features: Sequence[str] = (),
        feature_learning_rate: float | None = None,
        signed_features: bool = False,
        seed: int | None = None,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"dim must be a positive int, got {dim!r}")
        if isinstance(top_m, bool) or not isinstance(top_m, int) or top_m < 1:
            raise ConfigError(f"top_m must be a positive int, got {top_m!r}")
        if not tau > 0:
            raise ConfigError(f"tau must be > 0, got {tau!r}")
        if not learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {learning_rate!r}")
        if feature_learning_rate is not None and not feature_learning_rate > 0:
            raise ConfigError(
                f"feature_learning_rate must be None or > 0, got {feature_learning_rate!r}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if optimizer not in ("adam", "sgd"):
            raise ConfigError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
        if not weight_decay >= 0:
            raise ConfigError(f"weight_decay must be >= 0, got {weight_decay!r}")
        if not isinstance(memory_bias, bool):
            raise ConfigError(f"memory_bias must be a bool, got {memory_bias!r}")
        if isinstance(features, str) or not all(f in FEATURES for f in features):
            raise ConfigError(
                f"features must be a sequence of names from {sorted(FEATURES)}, got {features!r}"
            )
        if len(set(features)) != len(features):
            raise ConfigError(f"features must not repeat, got {features!r}")
        if isinstance(baseline, str):
            if baseline != EPISODE_BASELINE:
                raise ConfigError(
                    f"baseline must be a number or {EPISODE_BASELINE!r}, got {baseline!r}"
                )
        elif isinstance(baseline, bool) or not isinstance(baseline, (int, float)):
            raise ConfigError(f"baseline must be a number or {EPISODE_BASELINE!r}")
        self.dim = dim
        self.top_m = top_m
        self.tau = float(tau)
        self.learning_rate = float(learning_rate)
        self.baseline: float | str = baseline if isinstance(baseline, str) else float(baseline)
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.weight_decay = float(weight_decay)
        self.memory_bias = memory_bias
        self.features = tuple(features)
        self.feature_learning_rate = (
            None if feature_learning_rate is None else float(feature_learning_rate)
        )
        self.signed_features = bool(signed_features)
        self.seed = seed
        self._gen = np.random.default_rng(seed)
        self._reset()

    # ----------------------------------------------------------------- state
    def _reset(self) -> None:
        self.w_q_ = torch.zeros(self.dim, self.dim, dtype=torch.float32, requires_grad=True)
        self.w_m_ = torch.zeros(self.dim, self.dim, dtype=torch.float32, requires_grad=True)
        self.b_m_ = torch.zeros(self.dim, dtype=torch.float32, requires_grad=True)
        self.w_f_ = torch.zeros(self.n_features, dtype=torch.float32, requires_grad=True)
        self._opt = self._make_optimizer()
        self.n_updates_ = 0
        self.n_episodes_ = 0
        self.pending_: list[Episode] = []
        self.last_fit_: FitReport | None = None

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params: list[Any] = [self.w_q_, self.w_m_]
        if self.memory_bias:
            params.append(self.b_m_)
        if self.n_features:
            flr = self.feature_learning_rate
            if flr is None:
                params.append(self.w_f_)
            else:
                params = [{"params": params}, {"params": [self.w_f_], "lr": flr}]
        wd = self.weight_decay
        if self.optimizer == "adam":
            if wd > 0:
                return torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=wd)
            return torch.optim.Adam(params, lr=self.learning_rate)
        return torch.optim.SGD(params, lr=self.learning_rate, weight_decay=wd)

    @property
    def n_features(self) -> int:
        """Number of side features per candidate."""
        return len(self.features)

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
        """True while both adaptation maps are exactly zero (no learning has happened)."""
        with torch.no_grad():
            return bool(
                torch.all(self.w_q_ == 0)
                and torch.all(self.w_m_ == 0)
                and torch.all(self.b_m_ == 0)
                and torch.all(self.w_f_ == 0)
            )

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters (scikit-learn style)."""
        return {
            "dim": self.dim,
            "top_m": self.top_m,
            "tau": self.tau,
            "learning_rate": self.learning_rate,
            "baseline": self.baseline,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "weight_decay": self.weight_decay,
            "memory_bias": self.memory_bias,
            "features": list(self.features),
            "feature_learning_rate": self.feature_learning_rate,
            "signed_features": self.signed_features,
            "seed": self.seed,
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
        if self.memory_bias:
            s = s + m @ self.b_m_
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
        if self.memory_bias:
            u = u + self.b_m_.detach().numpy()
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
            top_m: Size of the sampled head (default `self.top_m`); the rest follows by score.
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
        m = min(self.top_m if top_m is None else top_m, k)
        u = self._gen.uniform(np.finfo(np.float32).tiny, 1.0, size=k)
        perturbed = scores.astype(np.float64) / self.tau - np.log(-np.log(u))
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
        s = torch.from_numpy(self.score(query, candidates, prior, features, offset)) / self.tau
        return torch.softmax(s, dim=0).numpy()

    # -------------------------------------------------------------- learning
    def log_prob(self, episode: Episode) -> torch.Tensor:
        """Per-position Plackett–Luce log-probabilities of an episode's shown order."""
        ep = episode.checked(self.dim)
        q, m, p, f = self._inputs(ep.query, ep.candidates, ep.prior, ep.features)
        logits = self._scores_t(q, m, p, f) / self.tau
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
        self._opt.zero_grad()
        total = torch.zeros(())
        for ep in episodes:
            lp = self.log_prob(ep)
            r = torch.from_numpy(ep.rewards)
            adv = r - (r.mean() if self.baseline == EPISODE_BASELINE else self.baseline)
            total = total - (adv * lp).sum()
        loss = total / len(episodes)
        loss.backward()
        self._opt.step()
        if self.signed_features and self.n_features:
            with torch.no_grad():
                w = project_signs(self.w_f_.numpy(), sign_vector(self.features))
                self.w_f_.copy_(torch.from_numpy(w.astype(np.float32)))
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
        while len(self.pending_) >= self.batch_size:
            batch, self.pending_ = (
                self.pending_[: self.batch_size],
                self.pending_[self.batch_size :],
            )
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
        """Tensors and JSON config of the whole state (weights, optimizer, buffered episodes)."""
        tensors: dict[str, torch.Tensor] = {
            "w_q": self.w_q_.detach().clone().contiguous(),
            "w_m": self.w_m_.detach().clone().contiguous(),
            "b_m": self.b_m_.detach().clone().contiguous(),
            "w_f": self.w_f_.detach().clone().contiguous(),
        }
        opt_state = self._opt.state_dict()
        opt_meta: dict[str, Any] = {}
        for pid, st in opt_state["state"].items():
            for key, val in st.items():
                if isinstance(val, torch.Tensor):
                    tensors[f"opt.{pid}.{key}"] = val.detach().clone().contiguous()
                else:
                    opt_meta[f"{pid}.{key}"] = val
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
                "optimizer": opt_meta,
            },
        }
        return tensors, config

    def to_bytes(self) -> bytes:
        """The whole state as one safetensors blob (config in its metadata), for any store."""
        tensors, config = self._snapshot()
        return bytes(save_bytes(tensors, metadata={"config": json.dumps(config)}))

    @classmethod
    def from_bytes(cls, data: bytes, **overrides: Any) -> Reranker:
        """Rebuild a reranker from `to_bytes` output (see `load` for `overrides`).

        Raises:
            ModelLoadError: The bytes are not a reranker state.
        """
        try:
            if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 8:
                raise ValueError("too short")
            raw = bytes(data)
            n = int.from_bytes(raw[:8], "little")
            header = json.loads(raw[8 : 8 + n])
            config = json.loads(header["__metadata__"]["config"])
            tensors = load_bytes(raw)
        except (ValueError, KeyError, TypeError, SafetensorError) as exc:
            raise ModelLoadError(f"not a reranker state: {exc}") from exc
        return cls._restore(tensors, config, overrides, "bytes")

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
        # always read as one consistent snapshot; the JSON file is the readable copy.
        _atomic(st_path, lambda p: save_file(tensors, str(p), metadata={"config": text}))
        _atomic(js_path, lambda p: Path(p).write_text(text))
        return js_path

    @classmethod
    def load(cls, path: str | os.PathLike[str], **overrides: Any) -> Reranker:
        """Load a reranker written by `save`.

        Args:
            path: The base path (with or without `.json` / `.safetensors`).
            **overrides: Constructor parameters to change (e.g. `seed`); `dim` cannot change.

        Raises:
            ModelLoadError: Files missing, unreadable or inconsistent.
        """
        base = _base(path)
        st_path, js_path = _paths(base)
        try:
            with safe_open(str(st_path), framework="pt") as fh:
                meta = fh.metadata() or {}
            tensors = load_file(str(st_path))
            config = (
                json.loads(meta["config"]) if "config" in meta else json.loads(js_path.read_text())
            )
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelLoadError(f"cannot read reranker at {base}: {exc}") from exc
        return cls._restore(tensors, config, overrides, str(base))

    @classmethod
    def _restore(
        cls,
        tensors: dict[str, torch.Tensor],
        config: dict[str, Any],
        overrides: dict[str, Any],
        where: str,
    ) -> Reranker:
        if not isinstance(config, dict) or config.get("format_version") != _FORMAT_VERSION:
            raise ModelLoadError(f"unsupported reranker format in {where}")
        params = dict(config["init_parameters"])
        if "dim" in overrides and overrides["dim"] != params["dim"]:
            raise ConfigError("a saved reranker's dim cannot be changed")
        params.update(overrides)
        obj = cls(**params)
        try:
            with torch.no_grad():
                obj.w_q_.copy_(tensors["w_q"])
                obj.w_m_.copy_(tensors["w_m"])
                if obj.memory_bias and "b_m" in tensors:  # absent in older files
                    obj.b_m_.copy_(tensors["b_m"])
                if obj.features and list(obj.features) == list(
                    config["init_parameters"].get("features", [])
                ):
                    obj.w_f_.copy_(tensors["w_f"])
            state = config["state"]
            opt_sd = obj._opt.state_dict()
            saved = config["init_parameters"]
            if (
                obj.optimizer == saved.get("optimizer")
                and obj.memory_bias == saved.get("memory_bias", False)
                and list(obj.features) == list(saved.get("features", []))
                and (obj.feature_learning_rate is None)
                == (saved.get("feature_learning_rate") is None)
            ):
                restored: dict[int, dict[str, Any]] = {}
                for key, tensor in tensors.items():
                    if key.startswith("opt."):
                        _, pid, name = key.split(".", 2)
                        restored.setdefault(int(pid), {})[name] = tensor
                for key, val in state.get("optimizer", {}).items():
                    pid, name = key.split(".", 1)
                    restored.setdefault(int(pid), {})[name] = val
                if restored:
                    opt_sd["state"] = restored
                    obj._opt.load_state_dict(opt_sd)
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
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ModelLoadError(f"reranker state at {where} is inconsistent: {exc}") from exc
        return obj

    def __repr__(self) -> str:
        return (
            f"Reranker(dim={self.dim}, top_m={self.top_m}, tau={self.tau}, "
            f"updates={self.n_updates_}, pending={len(self.pending_)})"
        )


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
