"""Records of the reranker: ranking results, ranked texts, feedback episodes and fit reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.types import RerankRecord

__all__ = ["RerankResult", "RankedTexts", "Episode", "FitReport"]

logger = logging.getLogger(__name__)


_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RerankResult:
    """The reranker's ordering of K candidates.

    Attributes:
        order: Candidate positions, best first (all K of them).
        scores: `(K,)` reranker scores, by candidate position.
        sampled: The head was sampled (exploration) rather than taken by score.
    """

    order: list[int]
    scores: np.ndarray
    sampled: bool


@dataclass(frozen=True)
class RankedTexts:
    """Texts from any retriever as the reranker ordered them (`ReflectiveMemory.rerank_texts`).

    Attributes:
        order: Positions (into the texts given) of the texts to show, best first.
        scores: Each shown text's log-score by the user's turn ranker (or by the caller's
            reranker), as `order`.
        cosines: Each shown text's cosine with the query, as `order`.
        texts: The texts given, in the order given (the attribution fallback of feedback
            embeds the shown ones).
        record: What was shown: give it (or this object) to `ReflectiveMemory.feedback`,
            whose citations `[i]` name `order[i]`.
    """

    order: tuple[int, ...]
    scores: tuple[float, ...]
    cosines: tuple[float, ...]
    texts: tuple[str, ...]
    record: RerankRecord


@dataclass
class Episode:
    """One retrieval plus the feedback on it: a REINFORCE sample.

    Attributes:
        query: `(dim,)` query embedding.
        candidates: `(K, dim)` candidate memory embeddings, in the retriever's order.
        shown: Candidate positions shown to the generator, in the order shown.
        rewards: `(len(shown),)` reward per shown memory (+1 cited, -1 not).
        prior: Optional `(K,)` prior scores (see `rank_prior`).
        features: Optional `(K, F)` side features per candidate (see `cost_features`).
    """

    query: np.ndarray
    candidates: np.ndarray
    shown: list[int]
    rewards: np.ndarray
    prior: np.ndarray | None = None
    features: np.ndarray | None = None

    def checked(self, dim: int) -> Episode:
        """Return a validated float32 copy; raise `InvalidInputError` on bad shapes."""
        q = np.asarray(self.query, dtype=np.float32).reshape(-1)
        c = np.asarray(self.candidates, dtype=np.float32)
        if q.shape[0] != dim or c.ndim != 2 or c.shape[1] != dim or c.shape[0] == 0:
            raise InvalidInputError(
                f"episode shapes do not fit dim {dim}: query {q.shape}, candidates {c.shape}"
            )
        shown = [int(i) for i in self.shown]
        if not shown or len(set(shown)) != len(shown) or min(shown) < 0 or max(shown) >= len(c):
            raise InvalidInputError(f"shown must be distinct positions < {len(c)}, got {shown}")
        r = np.asarray(self.rewards, dtype=np.float32).reshape(-1)
        if r.shape[0] != len(shown) or not np.all(np.isfinite(r)):
            raise InvalidInputError("rewards must give one finite value per shown memory")
        p = None
        if self.prior is not None:
            p = np.asarray(self.prior, dtype=np.float32).reshape(-1)
            if p.shape[0] != len(c):
                raise InvalidInputError("prior must give one score per candidate")
        f = None
        if self.features is not None:
            f = np.asarray(self.features, dtype=np.float32)
            if f.ndim != 2 or f.shape[0] != len(c) or not np.all(np.isfinite(f)):
                raise InvalidInputError("features must be a finite (K, F) array")
        return Episode(q, c, shown, r, p, f)


@dataclass
class FitReport:
    """What one `partial_fit` call did.

    Attributes:
        episodes: Episodes received.
        updates: Optimizer steps taken.
        pending: Episodes buffered for the next step.
        loss: Mean REINFORCE loss of the last step (None if no step was taken).
    """

    episodes: int = 0
    updates: int = 0
    pending: int = 0
    loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
