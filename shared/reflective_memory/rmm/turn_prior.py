"""Which kind of turn answers: a vote prior over turn features, learned from citations.

An extension of RMM's retrospective reflection (not in the paper). RMM's reranker reorders the
top K units of one question; what feedback teaches that carries over to *other* questions is
rather which kind of turn an answer cites: first-person statements ("I moved to Lisbon in
March") more than questions or two-word replies. `TurnPrior` is a logistic model over a few
generic turn features (`TURN_FEATURES`; none names a word or a speaker of any dataset). Each
answer is one step of class-balanced logistic regression: the turns of the cited passages are
positive, the other turns shown are negative (an answer that cites nothing, or everything, says
nothing and is skipped). Steps shrink as `1 / sqrt(answers)` and turns are scored with the
running average of the weights (Polyak averaging), so the prior settles instead of following the
last answers. At retrieval every voted turn's vote is multiplied by `exp(strength * trust * z)`,
z its decision value centred over the voted turns and clipped to [-3, 3] (the prior only reorders
turns the question already found). `trust` is earned: every answer is predicted before it is
learned, and the prior acts only as far as the mean AUC of those predictions is above chance
(full strength from 0.6), so citations that say nothing about the kind of turn (noise) move
nothing.

One model serves all users of a memory (a prior: ~35 answers per user are too few, and the
kind of turn that answers is not personal). It holds 2·F + 2 numbers and no text, so erasing a
user leaves it as it is, like the reranker's prior.

Measured (BENCHMARKS.md, "Per-user reranking"): fit offline on RMM-quality simulated citations
of REALTALK dev's teaching halves, +1.1 / +1.7 / +0.4 points of held-out coverage at 250 / 500 /
1,000 words (`bench transfer`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.passages import TurnVotes
from reflective_memory.types import Turn

__all__ = ["TURN_FEATURES", "TurnPrior", "turn_features"]

#: Generic turn features, in column order.
TURN_FEATURES = (
    "question",
    "log_words",
    "digit",
    "first_person",
    "log_rank",
    "voters",
    "short",
)
_FIRST_PERSON = re.compile(r"\b(i|i'm|im|i've|my|me|we|our)\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_FORMAT_VERSION = 1
_CLIP = 3.0
#: AUC above chance at which the prior acts with its full strength.
_TRUST_SPAN = 0.1


def _auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of `scores` for the `positive` rows (ties count one half)."""
    s = np.asarray(scores, dtype=np.float64)
    pos, neg = s[positive], s[~positive]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def _text_features(text: str) -> tuple[float, float, float, float, float]:
    """The features of a turn that depend on its text alone."""
    words = text.count(" ") + 1
    return (
        float("?" in text),
        float(np.log1p(words)),
        float(_DIGIT.search(text) is not None),
        float(_FIRST_PERSON.search(text) is not None),
        float(words <= 3),
    )


def turn_features(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    keys: Sequence[tuple[str, int]] | None = None,
    cache: dict[Any, tuple[float, ...]] | None = None,
) -> tuple[list[tuple[str, int]], np.ndarray]:
    """Voted turns and their `(n, len(TURN_FEATURES))` features.

    Args:
        votes: Votes of one retrieval (`reflective_memory.passages.collect_votes`).
        session_turns: The turns of a session, in order.
        keys: The turns wanted (default: every voted turn); vote ranks are over all of them.
        cache: Text features by `("turn_features", session_id, position)`, kept by the caller
            across retrievals (a turn's text does not change while its index lives).

    Returns:
        `(keys, features)`: the `(session_id, position)` keys in vote-table order (or as
        given), and one row per key: has a question mark, log(1 + words), has a digit, has a
        first-person word, log(1 + vote rank), number of units voting for it, at most 3 words.
    """
    every = list(votes.turn)
    want = every if keys is None else [k for k in keys if k in votes.turn]
    if not want:
        return want, np.zeros((0, len(TURN_FEATURES)))
    v = np.fromiter((votes.turn[k] for k in every), dtype=np.float64, count=len(every))
    rank = np.empty(len(v))
    rank[np.argsort(-v, kind="stable")] = np.arange(len(v))
    at = {k: i for i, k in enumerate(every)} if keys is not None else None
    out = np.empty((len(want), len(TURN_FEATURES)))
    for i, key in enumerate(want):
        ck = ("turn_features", key[0], key[1])
        text = cache.get(ck) if cache is not None else None
        if text is None:
            text = _text_features(session_turns(key[0])[key[1]].text)
            if cache is not None:
                cache[ck] = text
        q, words, digit, first, short = text
        r = rank[i if at is None else at[key]]
        out[i] = (q, words, digit, first, np.log1p(r), len(votes.sources.get(key, ())), short)
    return want, out


class TurnPrior:
    """Online class-balanced logistic regression over `TURN_FEATURES`.

    Args:
        learning_rate: SGD step per answer.
        l2: Weight decay per step.
        min_episodes: Answers learned before the prior changes any vote.

    Example:
        >>> tp = TurnPrior()
        >>> tp.trained
        False
    """

    def __init__(
        self, *, learning_rate: float = 0.5, l2: float = 1e-3, min_episodes: int = 8
    ) -> None:
        if not learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {learning_rate!r}")
        if not l2 >= 0:
            raise ConfigError(f"l2 must be >= 0, got {l2!r}")
        if isinstance(min_episodes, bool) or not isinstance(min_episodes, int) or min_episodes < 1:
            raise ConfigError(f"min_episodes must be an int >= 1, got {min_episodes!r}")
        self.learning_rate = float(learning_rate)
        self.l2 = float(l2)
        self.min_episodes = min_episodes
        f = len(TURN_FEATURES)
        self.weights_ = np.zeros(f)  # the SGD iterate
        self.bias_ = 0.0
        self.average_ = np.zeros(f)  # its running (Polyak) average: what scores turns
        self.auc_ = 0.5  # mean prequential AUC (each answer predicted before it is learned)
        self.auc_m2_ = 0.0  # sum of squared deviations of those AUCs (Welford)
        # running feature statistics for standardisation (Welford over every row seen)
        self.n_rows_ = 0
        self.mean_ = np.zeros(f)
        self.m2_ = np.zeros(f)
        self.n_episodes_ = 0

    @property
    def trust(self) -> float:
        """How much of the strength to use, in [0, 1], from how well the prior predicted.

        Each answer is first predicted, then learned (prequential validation). The prior acts
        as far as a lower confidence bound of the mean AUC of those predictions (mean minus
        two standard errors) is above chance (0.5), fully from `0.5 + _TRUST_SPAN`. Citations
        unrelated to the turns (noise) keep the bound at or below chance, so they move no
        vote; a few lucky answers do not either.
        """
        n = self.n_episodes_ - 1  # answers predicted (the first one is not)
        if n < 2:
            return 0.0
        se = np.sqrt(self.auc_m2_ / (n - 1) / n)
        return float(np.clip((self.auc_ - 2.0 * se - 0.5) / _TRUST_SPAN, 0.0, 1.0))

    @property
    def trained(self) -> bool:
        """Whether the prior changes votes: enough answers, predicted better than chance."""
        return self.n_episodes_ >= self.min_episodes and self.trust > 0

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments."""
        return {
            "learning_rate": self.learning_rate,
            "l2": self.l2,
            "min_episodes": self.min_episodes,
        }

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        sd = np.sqrt(self.m2_ / max(self.n_rows_ - 1, 1))
        return (x - self.mean_) / np.where(sd > 1e-9, sd, 1.0)

    def decision(self, x: np.ndarray) -> np.ndarray:
        """`(n,)` decision values of feature rows `x`."""
        return self._standardise(np.asarray(x, dtype=np.float64)) @ self.average_

    def partial_fit(self, x: np.ndarray, y: Sequence[bool] | np.ndarray) -> TurnPrior:
        """Learn from one answer: shown turns' features `x` and whether each was cited.

        Raises:
            InvalidInputError: Shapes that do not fit or values that are not finite.
        """
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if x.ndim != 2 or x.shape[1] != len(TURN_FEATURES) or x.shape[0] != y.shape[0]:
            raise InvalidInputError(
                f"expected ({y.shape[0]}, {len(TURN_FEATURES)}) features, got {x.shape}"
            )
        if not np.isfinite(x).all():
            raise InvalidInputError("turn features must be finite")
        pos = y > 0.5
        if pos.all() or not pos.any():
            return self  # no contrast: nothing to learn
        for row in x:  # Welford update of the running mean / variance
            self.n_rows_ += 1
            d = row - self.mean_
            self.mean_ += d / self.n_rows_
            self.m2_ += d * (row - self.mean_)
        xs = self._standardise(x)
        if self.n_episodes_ > 0:  # predict first, then learn
            auc = _auc(xs @ self.average_, pos)
            d = auc - self.auc_
            self.auc_ += d / self.n_episodes_  # mean over the answers predicted so far
            self.auc_m2_ += d * (auc - self.auc_)
        p = 1.0 / (1.0 + np.exp(-(xs @ self.weights_ + self.bias_)))
        w = np.where(pos, 0.5 / pos.sum(), 0.5 / (~pos).sum())  # each class weighs one half
        err = w * (p - pos)
        rate = self.learning_rate / np.sqrt(1.0 + self.n_episodes_)  # Robbins-Monro steps
        self.weights_ -= rate * (xs.T @ err + self.l2 * self.weights_)
        self.bias_ -= rate * float(err.sum())
        self.n_episodes_ += 1
        self.average_ += (self.weights_ - self.average_) / self.n_episodes_
        return self

    def scale_votes(
        self,
        votes: TurnVotes,
        session_turns: Callable[[str], Sequence[Turn]],
        strength: float,
        features: tuple[list[tuple[str, int]], np.ndarray] | None = None,
    ) -> int:
        """Multiply each voted turn's vote by `exp(strength * z)` (no-op until `trained`).

        Args:
            votes: A retrieval's votes (changed in place).
            session_turns: The turns of a session, in order.
            strength: Scaling strength; 0 changes nothing.
            features: `turn_features(votes, session_turns)` when already computed.

        Returns:
            How many votes were scaled.
        """
        if not self.trained or strength <= 0 or not votes.turn:
            return 0
        keys, x = turn_features(votes, session_turns) if features is None else features
        z = self.decision(x)
        z = np.clip(z - z.mean(), -_CLIP, _CLIP)
        for key, factor in zip(keys, np.exp(strength * self.trust * z), strict=True):
            votes.turn[key] *= float(factor)
        return len(keys)

    # ------------------------------------------------------------ persistence
    def to_bytes(self) -> bytes:
        """The state as UTF-8 JSON (`{"type", "init_parameters", "state"}`)."""
        doc = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "format_version": _FORMAT_VERSION,
            "features": list(TURN_FEATURES),
            "init_parameters": self.get_params(),
            "state": {
                "weights": self.weights_.tolist(),
                "bias": self.bias_,
                "average": self.average_.tolist(),
                "auc": self.auc_,
                "auc_m2": self.auc_m2_,
                "n_rows": self.n_rows_,
                "mean": self.mean_.tolist(),
                "m2": self.m2_.tolist(),
                "n_episodes": self.n_episodes_,
            },
        }
        return json.dumps(doc).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, **overrides: Any) -> TurnPrior:
        """Rebuild from `to_bytes` output; `overrides` replace saved hyperparameters.

        Raises:
            ModelLoadError: Not a turn-prior state, or one saved for other features.
        """
        try:
            doc = json.loads(bytes(data).decode("utf-8"))
            if doc.get("format_version") != _FORMAT_VERSION:
                raise ValueError("unsupported format")
            if doc.get("features") != list(TURN_FEATURES):
                raise ValueError("saved for other features")
            tp = cls(**{**doc["init_parameters"], **overrides})
            st = doc["state"]
            f = len(TURN_FEATURES)
            names = ("weights", "average", "mean", "m2")
            arrays = [np.asarray(st[k], dtype=np.float64) for k in names]
            if any(a.shape != (f,) or not np.isfinite(a).all() for a in arrays):
                raise ValueError("state arrays do not fit")
            tp.weights_, tp.average_, tp.mean_, tp.m2_ = arrays
            tp.auc_ = float(np.clip(float(st["auc"]), 0.0, 1.0))
            tp.auc_m2_ = max(0.0, float(st["auc_m2"]))
            tp.bias_ = float(st["bias"])
            tp.n_rows_ = int(st["n_rows"])
            tp.n_episodes_ = int(st["n_episodes"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"not a turn-prior state: {exc}") from exc
        return tp

    def __repr__(self) -> str:
        return (
            f"TurnPrior(episodes={self.n_episodes_}, auc={self.auc_:.3f}, trained={self.trained})"
        )
