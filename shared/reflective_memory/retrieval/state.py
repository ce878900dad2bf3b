"""The typed state one retrieval carries through the pipeline's stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory.recall import RecallConfig

if TYPE_CHECKING:
    from reflective_memory.retrieval.features import TurnFeatures
    from reflective_memory.retrieval.timeframe import TimeFrame
    from reflective_memory.retrieval.turn_votes import TurnVotes
    from reflective_memory.storage.user_index import UserIndex
    from reflective_memory.types import Hit, RerankRecord

__all__ = ["RetrievalRequest", "RetrievalState"]


@dataclass(frozen=True)
class RetrievalRequest:
    """One `retrieve` call's arguments, validated and resolved against the config.

    Attributes:
        user_id: Whose memories are searched.
        query: The question as asked.
        k: Most hits (`None` with a budget).
        budget: Token (or word) budget of the hits' texts.
        mode: `hybrid`, `dense` or `lexical`.
        recall: RF-Mem settings of this call.
        views: Memory kinds ranked as units (`None`: every kind, as passages).
        explore: Retrieve for learning (an interleaving of two rankings, or Gumbel noise).
        retrieval_id: Id feedback on this retrieval refers to.
        exclude: Ids of turns never returned (the reader sees them already).
        now: When the question is asked (relative times resolve against it; `None`: the
            user's newest turn).
    """

    user_id: str
    query: str
    k: int | None
    budget: int | None
    mode: str
    recall: RecallConfig
    views: tuple[str, ...] | None
    explore: bool
    retrieval_id: str
    exclude: frozenset[str] = frozenset()
    now: datetime | None = None


@dataclass
class RetrievalState:
    """What the stages know about one retrieval so far; each stage fills its part.

    Attributes:
        request: The call.
        index: The user's indexes at one store version (`None`: nothing stored).
        search_query: The text the rankers search with (the question without a focused
            speaker's name).
        speaker: The one speaker the question names (or asks about in the first or second
            person), if speaker focus applies.
        speakers: Who counts as a speaker for the focus: the user's speakers, or only the two
            chat roles when the question's person (not a name) chose the speaker (a turn that
            holds the question word for word is then kept whoever said it: the words of an
            assistant's "I ..." turn still find it).
        frame: The period the question is anchored in ("two weeks ago"), resolved.
        qvec: The query vector (`None` until embedded; never in lexical mode without a
            reranker).
        n: Candidates each ranker contributes (widened when the hits do not fill the cut).
        recall: RF-Mem settings after gate calibration.
        gate: The calibrated gate thresholds, when calibration applied.
        dense: Dense candidates: index positions and cosines.
        dense_trace: RF-Mem's record of the dense search (path, gate signals, rounds).
        lexical: Lexical candidates: index positions and BM25 scores.
        order: Ranked index positions (after fusion; after reranking).
        scores: Each ranked position's scores by ranker.
        rerank: What was shown (the typed record feedback learns from: the shown turns'
            feature rows, by passage).
        votes: Turn votes of the small-to-big stage.
        recency: Whether the question read as present tense (with `passages.recency` on).
        features: The voted turns' feature rows, when the learned ranker scored them.
        feature_ids: The turn id of each feature row.
        teams: For an interleaved retrieval, each voted turn's team (`retrieval.interleave`).
        hits: The result, best first.
        filled: Whether the hits reached `k` or the budget (else: candidates ran out).
        tokens_used: Budget the hits use (passages).
        ranked_units: Units the votes were collected from.
        unit_scores: Each voting unit's scores by ranker (passages show the best of them).
        timings: Milliseconds per stage.
    """

    request: RetrievalRequest
    index: UserIndex | None
    search_query: str
    speaker: str | None = None
    speakers: tuple[str, ...] = ()
    frame: TimeFrame | None = None
    qvec: np.ndarray | None = None
    n: int = 0
    recall: RecallConfig | None = None
    gate: dict[str, float] | None = None
    dense: tuple[np.ndarray, np.ndarray] | None = None
    dense_trace: dict[str, Any] | None = None
    lexical: tuple[np.ndarray, np.ndarray] | None = None
    order: list[int] = field(default_factory=list)
    scores: list[dict[str, float]] = field(default_factory=list)
    rerank: RerankRecord | None = None
    votes: TurnVotes | None = None
    recency: bool = False
    features: TurnFeatures | None = None
    feature_ids: list[str] = field(default_factory=list)
    teams: dict[tuple[str, int], int] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    filled: bool = False
    tokens_used: int = 0
    ranked_units: int = 0
    unit_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def diagnostics(self) -> dict[str, Any]:
        """The `Retrieval.diagnostics` dict, built from this state."""
        req = self.request
        out: dict[str, Any] = {
            "mode": req.mode,
            "path": "lexical" if req.mode == "lexical" else "empty",
            "timings_ms": self.timings,
            "index_size": 0 if self.index is None else len(self.index),
            "k": req.k,
            "budget_tokens": req.budget,
        }
        if req.views is not None:
            out["views"] = list(req.views)
        if self.index is None:  # nothing stored for the user
            return out
        if self.speaker is not None:
            out["speaker"] = self.speaker
        if self.search_query != req.query:
            out["search_query"] = self.search_query
        if self.frame is not None:
            out["time_frame"] = {
                "phrase": self.frame.phrase,
                "start": self.frame.start.isoformat(),
                "end": self.frame.end.isoformat(),
            }
        if self.gate is not None:
            out["gate_calibration"] = dict(self.gate)
        if self.dense_trace is not None:
            out["recall"] = self.dense_trace
            out["ann"] = self.index.dense.kind
            for key in ("path", "mean_score", "entropy", "rounds", "hits_per_round"):
                out[key] = self.dense_trace[key]
        counts = {
            "dense": 0 if self.dense is None else int(len(self.dense[0])),
            "lexical": 0 if self.lexical is None else int(len(self.lexical[0])),
        }
        if self.dense is not None and self.lexical is not None:
            counts["fused"] = len(self.order)
        out["candidates"] = counts
        if self.rerank is not None:
            out["rerank"] = self.rerank.as_diagnostics()
        if self.votes is not None:
            out["passages"] = {
                "units_ranked": self.ranked_units,
                "turns_voted": len(self.votes.turn),
                "turns_packed": sum(len(h.memory.turn_ids) for h in self.hits),
                "tokens_used": self.tokens_used,
                "present_tense": self.recency,
                "speaker": self.speaker,
            }
        return out
