"""Learned ranking of candidate turns: the cues the pipeline computes, weighed by one model.

- `features`: `FEATURES` (names, in order) and `turn_features`, one row per voted turn.
- `model`: `TurnRanker`, a log-linear scorer fitted offline on the dev sets and shipped as
  checksummed JSON (`reflective_memory/data/turn_ranker.json`); `fit_ranker` refits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.ranking.features import FEATURES, TurnFeatures, turn_features
    from reflective_memory.ranking.model import TurnRanker, fit_ranker, load_ranker

_EXPORTS = {
    "FEATURES": "reflective_memory.ranking.features",
    "TurnFeatures": "reflective_memory.ranking.features",
    "turn_features": "reflective_memory.ranking.features",
    "TurnRanker": "reflective_memory.ranking.model",
    "fit_ranker": "reflective_memory.ranking.model",
    "load_ranker": "reflective_memory.ranking.model",
}

__all__ = [
    "FEATURES",
    "TurnFeatures",
    "turn_features",
    "TurnRanker",
    "fit_ranker",
    "load_ranker",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
