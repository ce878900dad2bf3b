"""Side features of memories for the reranker, and the rank prior and citation rewards."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reflective_memory.config import RERANK_FEATURES

__all__ = ["rank_prior", "cost_features", "features_for", "citation_rewards", "FEATURES"]

logger = logging.getLogger(__name__)


_FORMAT_VERSION = 1


def rank_prior(dense_scores: np.ndarray) -> np.ndarray:
    """Cosine-scale prior scores that keep the retriever's order.

    Args:
        dense_scores: `(K,)` dense cosines of the candidates, listed in the retriever's order.

    Returns:
        The same values sorted descending: candidate `j` (the retriever's `j`-th) gets the `j`-th
        largest cosine. For a dense retriever this is the input itself.
    """
    s = np.asarray(dense_scores, dtype=np.float32).reshape(-1)
    return np.sort(s)[::-1].copy()


def cost_features(texts: Sequence[str]) -> np.ndarray:
    """The `cost` side feature of candidate memories: `(K, 1)` with `log(1 + words)` per text.

    What a memory costs in the prompt. Generators tend to cite short, specific memories (a
    user's own statement) over long generic ones, and under a context budget a short memory
    leaves room for more; a reranker with `features=("cost",)` learns how much that matters.
    """
    return np.log1p(np.array([len(t.split()) for t in texts], dtype=np.float32)).reshape(-1, 1)


#: Side features a reranker can learn a weight for, by name: texts -> `(K, 1)` column.
FEATURES: dict[str, Callable[[Sequence[str]], np.ndarray]] = {"cost": cost_features}
assert set(FEATURES) == set(RERANK_FEATURES)


def features_for(reranker: Any, texts: Sequence[str]) -> np.ndarray | None:
    """Side features a reranker expects for candidates with these texts (None if it takes none).

    Works for any object: one without `feature_matrix` (e.g. a user's own reranker) gets None.
    """
    fm = getattr(reranker, "feature_matrix", None)
    return fm(list(texts)) if callable(fm) else None


def citation_rewards(n_shown: int, cited: Sequence[int]) -> np.ndarray:
    """RMM rewards: `+1` for each shown position that was cited, `-1` for the others."""
    rewards = -np.ones(n_shown, dtype=np.float32)
    for i in cited:
        if 0 <= int(i) < n_shown:
            rewards[int(i)] = 1.0
    return rewards
