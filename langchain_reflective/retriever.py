"""`ReflectiveRetriever`: a user's long-term memories as a LangChain retriever."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Hit, Retrieval

from ._common import iso

__all__ = ["ReflectiveRetriever", "hit_to_document"]


def hit_to_document(hit: Hit, retrieval: Retrieval) -> Document:
    """Convert one ranked hit into a `Document`.

    `page_content` is the memory's text (the raw turns the model should read); the metadata
    carry the memory id, score and component scores, rank, session id, turn ids, granularity,
    timestamps as ISO-8601 strings (`None` when unknown), the retrieval path and retrieval id.
    """
    mem = hit.memory
    return Document(
        id=mem.id,
        page_content=mem.text,
        metadata={
            "memory_id": mem.id,
            "user_id": mem.user_id,
            "score": hit.score,
            "rank": hit.rank,
            "scores": dict(hit.scores),
            "session_id": mem.session_id,
            "turn_ids": list(mem.turn_ids),
            "granularity": mem.granularity,
            "created_at": iso(mem.created_at),
            "updated_at": iso(mem.updated_at),
            "start_time": iso(mem.start_time),
            "end_time": iso(mem.end_time),
            "retrieval_path": retrieval.diagnostics.get("path"),
            "retrieval_id": retrieval.retrieval_id,
        },
    )


class ReflectiveRetriever(BaseRetriever):
    """Retrieve one user's memories from a `ReflectiveMemory`.

    `k`, `budget_tokens` and `now` can be given per call: `retriever.invoke(query, k=3)`,
    `retriever.invoke("what did I do two weeks ago?", now="2025-06-01")`.

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> _ = mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        >>> _ = mem.end_session("ana", "s1")
        >>> docs = ReflectiveRetriever(memory=mem, user_id="ana").invoke("dog", k=1)
        >>> docs[0].metadata["turn_ids"]
        ['s1:0']
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: ReflectiveMemory = Field(description="The core memory store to search.")
    user_id: str = Field(description="Whose memories are searched.")
    k: int | None = Field(
        default=None,
        description="Turns returned per query as documents (None: passages filling the budget, "
        "by default the core's `search.default_budget_tokens`, 500).",
    )
    budget_tokens: int | None = Field(
        default=None,
        description="Pack documents into this many tokens (the core's token rule) instead of "
        "or together with `k`.",
    )
    mode: str | None = Field(
        default=None,
        description="Ranking override: 'hybrid', 'dense' or 'lexical' (None: the core config).",
    )
    now: datetime | str | float | None = Field(
        default=None,
        description="When queries are asked, for 'two weeks ago' (any timestamp add_turn takes; "
        "None: the user's newest turn); `invoke(query, now=...)` overrides it per call.",
    )

    def __init__(self, **kwargs: Any) -> None:
        """Check `now` first (`InvalidInputError` naming it), then the pydantic fields."""
        kwargs["now"] = parse_timestamp(kwargs.get("now"))
        super().__init__(**kwargs)

    def _options(self, k: int | None, budget_tokens: int | None, now: Any) -> dict[str, Any]:
        return {
            "k": self.k if k is None else k,
            "budget_tokens": self.budget_tokens if budget_tokens is None else budget_tokens,
            "mode": self.mode,
            "now": self.now if now is None else now,
        }

    def retrieve(
        self,
        query: str,
        *,
        k: int | None = None,
        budget_tokens: int | None = None,
        now: datetime | str | float | None = None,
    ) -> Retrieval:
        """The core `Retrieval` for a query (hits, diagnostics, usage), for feedback."""
        return self.memory.retrieve(self.user_id, query, **self._options(k, budget_tokens, now))

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        budget_tokens: int | None = None,
        now: datetime | str | float | None = None,
    ) -> list[Document]:
        retrieval = self.retrieve(query, k=k, budget_tokens=budget_tokens, now=now)
        return [hit_to_document(h, retrieval) for h in retrieval.hits]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        budget_tokens: int | None = None,
        now: datetime | str | float | None = None,
    ) -> list[Document]:
        retrieval = await self.memory.aretrieve(
            self.user_id, query, **self._options(k, budget_tokens, now)
        )
        return [hit_to_document(h, retrieval) for h in retrieval.hits]
