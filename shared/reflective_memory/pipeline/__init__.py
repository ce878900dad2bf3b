"""Retrieval as a visible pipeline: ordered stages over one typed state.

- `state`: `RetrievalRequest` (a checked call) and `RetrievalState` (what stages fill in).
- `runner`: `Stage` (one `run`) and `Pipeline` (runs stages in order, times them, widens).
- `candidates`: query embedding, dense candidates (RF-Mem), lexical candidates (BM25).
- `fusion`: `SearchConfig` and reciprocal-rank fusion.
- `rerank`: RMM's citation-trained reranker on the head of the ranking.
- `votes`: speaker focus, and ranked units resolved to turn votes (small-to-big).
- `packing`: passages for the reader, or ranked units as they are.
- `retriever`: `Retriever`, which composes the pipeline per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.pipeline.fusion import SearchConfig
    from reflective_memory.pipeline.retriever import Retriever
    from reflective_memory.pipeline.runner import Pipeline, Stage
    from reflective_memory.pipeline.state import RetrievalRequest, RetrievalState

_EXPORTS = {
    "SearchConfig": "reflective_memory.pipeline.fusion",
    "Retriever": "reflective_memory.pipeline.retriever",
    "Pipeline": "reflective_memory.pipeline.runner",
    "Stage": "reflective_memory.pipeline.runner",
    "RetrievalRequest": "reflective_memory.pipeline.state",
    "RetrievalState": "reflective_memory.pipeline.state",
}

__all__ = [
    "SearchConfig",
    "Retriever",
    "Pipeline",
    "Stage",
    "RetrievalRequest",
    "RetrievalState",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
