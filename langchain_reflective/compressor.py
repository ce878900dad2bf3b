"""`ReflectiveCompressor`: the citation-trained reranker over any retriever's documents.

Use it in a `ContextualCompressionRetriever` over any base retriever. The documents go to the
core's `ReflectiveMemory.rerank_texts`: embedded with the core's embedder and ordered by the
user's reranker, the one `memory.retrieve(user_id, ...)` applies (RMM's residual linear
reranker). The best `top_n` are kept. `feedback(query, documents, answer)` hands the answer to
`ReflectiveMemory.feedback`, which reads its citations (`[0]`, `[0, 2]`, `[NO_CITE]`; positions
among the documents as shown) as REINFORCE rewards; the engine's reranker learns them and is
saved with the store, exactly as for `memory.retrieve`'s results.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr
from reflective_memory import FeedbackResult, RankedTexts, ReflectiveMemory
from reflective_memory.errors import InvalidInputError

__all__ = ["ReflectiveCompressor", "CitationReranker"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 128
_Key = tuple[str, tuple[str, ...]]


class ReflectiveCompressor(BaseDocumentCompressor):
    """Rerank any retriever's documents with the citation-trained reranker and keep the best.

    Args (fields):
        memory: The core memory: its embedder embeds query and documents, its reranker for
            `user_id` ranks them and learns from feedback.
        user_id: The user whose reranker ranks and learns (per user, or the engine's shared one
            with `config.rerank.scope="shared"`).
        top_n: Documents kept (RMM's top-M).
        reranker: An explicit reranker instead of the engine's: an object with
            `rerank(query, candidates, prior, *, explore)` returning an object with `order` and
            `scores`, and `partial_fit(episode)` (see
            `reflective_memory.rmm.feedback.CallerReranker`). It is neither saved nor used by
            `memory.retrieve`. `None` (default): the engine's reranker for `user_id`; when the
            engine has reranking off (`config.rerank.enabled=False`), plain cosine order and
            feedback is not learned.
        explore: Sample the head with Gumbel noise (while learning) instead of taking it by score.

    Example:
        >>> from langchain_core.documents import Document
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=1)
        >>> docs = [Document(page_content="cats purr"), Document(page_content="dogs bark")]
        >>> comp.compress_documents(docs, "why do dogs bark")[0].page_content
        'dogs bark'
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: ReflectiveMemory = Field(description="The core memory; its embedder embeds documents.")
    user_id: str = Field(description="The user whose citations train the reranker.")
    top_n: int = Field(default=5, ge=1, description="Documents kept after reranking.")
    reranker: Any | None = Field(
        default=None,
        description="Reranker with rerank(query, candidates, prior, *, explore) and "
        "partial_fit(episode); None: the memory's citation-taught turn ranker for user_id.",
    )
    explore: bool = Field(
        default=False, description="Sample the kept documents with Gumbel noise (learning)."
    )

    _rankings: OrderedDict[_Key, RankedTexts] = PrivateAttr(default_factory=OrderedDict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def get_reranker(self) -> Any | None:
        """The caller's reranker, if one was given; None: the memory's turn ranker ranks.

        The memory's weights for `user_id` (`memory.ranker_weights(user_id)`) are read on
        every call, so what feedback taught, or `memory.delete_user` erased, is picked up.
        """
        return self.reranker

    def _rank(self, query: str, docs: list[Document], **kw: Any) -> RankedTexts:
        return self.memory.rerank_texts(
            self.user_id,
            query,
            [d.page_content for d in docs],
            ids=[d.id for d in docs],
            reranker=self.reranker,
            **kw,
        )

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Keep the `top_n` documents the reranker scores best, best first.

        Each returned document is a copy whose metadata gain `relevance_score` (the reranker's
        or cosine score) and `cosine_score`.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty str")
        docs = list(documents)
        if not docs:
            return []
        ranked = self._rank(query, docs, top_n=self.top_n, explore=self.explore)
        out = []
        for i, score, cos in zip(ranked.order, ranked.scores, ranked.cosines, strict=True):
            d = docs[i]
            meta = {**d.metadata, "relevance_score": score, "cosine_score": cos}
            out.append(Document(page_content=d.page_content, metadata=meta, id=d.id))
        with self._lock:
            self._rankings[(query, tuple(d.page_content for d in out))] = ranked
            while len(self._rankings) > _CACHE_SIZE:
                self._rankings.popitem(last=False)
        return out

    def feedback(self, query: str, documents: Sequence[Document], answer: str) -> FeedbackResult:
        """Train the reranker from the citations of an answer (`ReflectiveMemory.feedback`).

        Only the answer is read; an answer that echoes the prompt's instructions back teaches
        nothing.

        Args:
            query: The query the documents were compressed for.
            documents: The documents shown to the model, in the order shown (normally this
                compressor's output for `query`; other lists are learned from as given).
            answer: The model's answer citing documents by position, `[0]`, `[0, 2]`, or
                `[NO_CITE]`.

        Returns:
            The same `FeedbackResult` as `ReflectiveMemory.feedback`: `cited` positions,
            `rewards` by document id (the documents' positions as given to `rerank_texts`, as
            strings, when they have no distinct ids), `learned` (whether a reranker received
            the episode), `updates` / `pending` (the engine reranker takes one step per
            `config.rerank.batch_size` episodes and is saved after each step), and `reason`
            when nothing was learned.
        """
        docs = list(documents)
        if not docs:
            raise InvalidInputError("feedback needs the documents that were shown")
        if not isinstance(answer, str):
            raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
        with self._lock:
            ranked = self._rankings.pop((query, tuple(d.page_content for d in docs)), None)
        if ranked is None:  # documents not compressed here: learned from as given
            ranked = self._rank(query, docs, keep_order=True)
        return self.memory.feedback(ranked, answer)


#: The name used in the issue text; the same class.
CitationReranker = ReflectiveCompressor
