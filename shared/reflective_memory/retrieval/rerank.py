"""The reranking stage: RMM's citation-trained reranker reorders the head of the ranking."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.retrieval.candidates import EmbedQuery
from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.storage.base import MemoryStore

if TYPE_CHECKING:
    from reflective_memory.rmm.feedback import RerankStage

__all__ = ["Rerank"]


class Rerank:
    """Rerank the first `rerank.top_k` candidates (untrained, the order is kept).

    Args:
        rerankers: The memory's rerankers (RMM retrospective reflection).
        query: Embeds the search text when no stage did (lexical mode).
        store: Reads candidate memories for the side features that need them.
    """

    name = "rerank"
    repeat = True

    def __init__(self, rerankers: RerankStage, query: EmbedQuery, store: MemoryStore) -> None:
        self.rerankers, self.query, self.store = rerankers, query, store

    def run(self, state: RetrievalState) -> None:
        """Reorder `state.order` / `state.scores`; set `state.rerank`."""
        req = state.request
        if state.qvec is None:
            state.qvec = self.query.vector(state.search_query)
        state.order, state.scores, state.rerank = self.rerankers.apply(
            req.user_id,
            state.index,
            state.qvec,
            state.order,
            state.scores,
            explore=req.explore,
            retrieval_id=req.retrieval_id,
            query=state.search_query,
            fetch=lambda ids: self.store.memories(req.user_id, ids),
        )
