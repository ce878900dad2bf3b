"""Retrieval, in one place: the ordered stages over one typed state, and what they compute.

The pipeline:

- `state`: `RetrievalRequest` (a checked call) and `RetrievalState` (what stages fill in).
- `runner`: `Stage` (one `run`) and `Pipeline` (runs stages in order, times them, widens).
- `retriever`: `Retriever`, which composes the stage list per call (the one place that says
  what runs).
- `candidates`: query embedding, dense candidates (RF-Mem), lexical candidates (BM25).
- `fusion`: `SearchConfig` and reciprocal-rank fusion.
- `rerank`: RMM's citation-trained reranker on the head of the ranking.
- `votes`: question cues, and ranked units resolved to turn votes (small-to-big).
- `packing`: passages for the reader, or ranked units as they are.

What the stages use:

- `cues`: what a question asks beyond its words (present tense, "when", addressed roles).
- `speakers`: who said a turn (names and roles in stored text).
- `timeframe`: the period a question is anchored in, resolved against `now`.
- `time_words`: "now" and named dates beyond English, from dateparser's locale data.
- `units`: `UnitConfig`; the units (turns, exchanges, segments) a session is indexed as.
- `turn_votes`: votes per turn, and the question's cues read against the voted turns.
- `features`: one feature row per voted turn (`FEATURES`, `turn_features`).
- `ranker`: `TurnRanker`, the learned log-linear model shipped as checksummed JSON
  (`reflective_memory/data/turn_ranker.json`); `fit_ranker` refits it.
- `passages`: `PassageConfig`; voted turns packed into dated passages within a budget.
- `excerpts`: the part of a long turn that is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.retrieval.features import FEATURES, TurnFeatures, turn_features
    from reflective_memory.retrieval.fusion import SearchConfig
    from reflective_memory.retrieval.passages import PassageConfig
    from reflective_memory.retrieval.ranker import TurnRanker, fit_ranker, load_ranker
    from reflective_memory.retrieval.retriever import Retriever
    from reflective_memory.retrieval.runner import Pipeline, Stage
    from reflective_memory.retrieval.state import RetrievalRequest, RetrievalState
    from reflective_memory.retrieval.units import UnitConfig

_EXPORTS = {
    "SearchConfig": "reflective_memory.retrieval.fusion",
    "Retriever": "reflective_memory.retrieval.retriever",
    "Pipeline": "reflective_memory.retrieval.runner",
    "Stage": "reflective_memory.retrieval.runner",
    "RetrievalRequest": "reflective_memory.retrieval.state",
    "RetrievalState": "reflective_memory.retrieval.state",
    "FEATURES": "reflective_memory.retrieval.features",
    "TurnFeatures": "reflective_memory.retrieval.features",
    "turn_features": "reflective_memory.retrieval.features",
    "PassageConfig": "reflective_memory.retrieval.passages",
    "TurnRanker": "reflective_memory.retrieval.ranker",
    "fit_ranker": "reflective_memory.retrieval.ranker",
    "load_ranker": "reflective_memory.retrieval.ranker",
    "UnitConfig": "reflective_memory.retrieval.units",
}

__all__ = [
    "SearchConfig",
    "Retriever",
    "Pipeline",
    "Stage",
    "RetrievalRequest",
    "RetrievalState",
    "FEATURES",
    "TurnFeatures",
    "turn_features",
    "PassageConfig",
    "TurnRanker",
    "fit_ranker",
    "load_ranker",
    "UnitConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
