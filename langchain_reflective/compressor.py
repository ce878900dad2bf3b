"""`ReflectiveCompressor`: the citation-trained reranker over any retriever's documents.

Use it in a `ContextualCompressionRetriever` over any base retriever. Documents and the query are
embedded with the core's embedder; the documents are ordered by the reranker (RMM's residual
linear reranker, `shared.rerank.Reranker`, when the core provides it) or, without one, by cosine
similarity to the query, and the best `top_n` are kept. `feedback(query, documents, answer)`
turns the answer's citations (`[0]`, `[0, 2]`, `[NO_CITE]`; positions among the documents as
shown) into REINFORCE rewards for the reranker.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr

from shared.engine import ReflectiveMemory
from shared.errors import InvalidInputError

from ._common import parse_cited

__all__ = ["ReflectiveCompressor", "CitationReranker", "FeedbackEpisode"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 128


@dataclass
class FeedbackEpisode:
    """One reranking plus the feedback on it (same fields as `shared.rerank.Episode`).

    Attributes:
        query: `(dim,)` query embedding.
        candidates: `(K, dim)` candidate embeddings in the base retriever's order.
        shown: Candidate positions shown to the model, in the order shown.
        rewards: One reward per shown candidate (+1 cited, -1 not).
        prior: `(K,)` prior scores (cosine to the query).
    """

    query: np.ndarray
    candidates: np.ndarray
    shown: list[int]
    rewards: np.ndarray
    prior: np.ndarray | None = None


def _episode(**fields: Any) -> Any:
    """A `shared.rerank.Episode` when the core has one, else a `FeedbackEpisode`."""
    try:
        from shared.rerank import Episode  # type: ignore[import-not-found]
    except ImportError:
        return FeedbackEpisode(**fields)
    return Episode(**fields)


def _default_reranker(dim: int, top_m: int) -> Any | None:
    try:
        from shared.rerank import Reranker  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Reranker(dim, top_m=top_m)


def _parse(answer: str, n: int) -> list[int]:
    """Cited positions; the core's citation parser when it has one."""
    try:
        from shared.citations import parse_citations  # type: ignore[import-not-found]
    except ImportError:
        return parse_cited(answer, n)
    return [int(i) for i in parse_citations(answer, n).indices]


class ReflectiveCompressor(BaseDocumentCompressor):
    """Rerank any retriever's documents with the citation-trained reranker and keep the best.

    Args (fields):
        memory: Supplies the embedder (and, through `shared.rerank`, the reranker class).
        user_id: The user whose feedback trains this compressor's reranker.
        top_n: Documents kept (RMM's top-M).
        reranker: A reranker object with `rerank(query, candidates, prior)` returning an object
            with `order` and `partial_fit(episode)`; `None` uses `shared.rerank.Reranker` when
            the core provides it, else plain cosine ordering (feedback is then not learned).
        explore: Sample the head with Gumbel noise (while learning) instead of taking it by score.

    Example:
        >>> from langchain_core.documents import Document
        >>> from shared import ReflectiveMemory, HashingEmbedder
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
        description="Reranker with rerank(query, candidates, prior) and partial_fit(episode); "
        "None: the core's RMM reranker when available, else cosine order.",
    )
    explore: bool = Field(
        default=False, description="Sample the kept documents with Gumbel noise (learning)."
    )

    _episodes: OrderedDict[tuple[str, tuple[str, ...]], dict[str, Any]] = PrivateAttr(
        default_factory=OrderedDict
    )
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _resolved: bool = PrivateAttr(default=False)

    def get_reranker(self) -> Any | None:
        """The reranker in use (created on first use), or `None` for cosine ordering."""
        if self.reranker is None and not self._resolved:
            self.reranker = _default_reranker(self.memory.embedder.dim, self.top_n)
            self._resolved = True
        return self.reranker

    def _embed(self, query: str, documents: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
        emb = self.memory.embedder
        q = np.asarray(emb.encode(query), dtype=np.float32).reshape(-1)
        m = np.asarray(emb.encode([d.page_content for d in documents]), dtype=np.float32)
        return q, m.reshape(len(documents), -1)

    def _remember(self, key: tuple[str, tuple[str, ...]], value: dict[str, Any]) -> None:
        with self._lock:
            self._episodes[key] = value
            self._episodes.move_to_end(key)
            while len(self._episodes) > _CACHE_SIZE:
                self._episodes.popitem(last=False)

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
        q, m = self._embed(query, docs)
        cos = m @ q
        reranker = self.get_reranker()
        if reranker is None:
            order = [int(i) for i in np.argsort(-cos, kind="stable")]
            scores = cos
        else:
            kw = {"explore": True} if self.explore else {}
            result = reranker.rerank(q, m, cos, **kw)
            order = [int(i) for i in result.order]
            scores = np.asarray(result.scores, dtype=np.float32)
        shown = order[: self.top_n]
        out = []
        for i in shown:
            d = docs[i]
            meta = {
                **d.metadata,
                "relevance_score": float(scores[i]),
                "cosine_score": float(cos[i]),
            }
            out.append(Document(page_content=d.page_content, metadata=meta, id=d.id))
        key = (query, tuple(d.page_content for d in out))
        self._remember(key, {"query": q, "candidates": m, "shown": shown, "prior": cos})
        return out

    def feedback(self, query: str, documents: Sequence[Document], answer: str) -> dict[str, Any]:
        """Train the reranker from the citations of an answer.

        Args:
            query: The query the documents were compressed for.
            documents: The documents shown to the model, in the order shown (normally this
                compressor's output for `query`; other lists are learned from as given).
            answer: The model's answer citing documents by position, `[0]`, `[0, 2]`, or
                `[NO_CITE]`.

        Returns:
            `cited` positions, `rewards`, and `trained` (whether a reranker received the
            episode) with `updates` (optimizer steps it took, when it reports them).
        """
        docs = list(documents)
        if not docs:
            raise InvalidInputError("feedback needs the documents that were shown")
        if not isinstance(answer, str):
            raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
        cited = _parse(answer, len(docs))
        rewards = np.array([1.0 if i in cited else -1.0 for i in range(len(docs))], np.float32)
        report: dict[str, Any] = {"cited": cited, "rewards": rewards.tolist(), "trained": False}
        reranker = self.get_reranker()
        if reranker is None:
            logger.warning("no reranker available: citations of user %s not learned", self.user_id)
            return report
        key = (query, tuple(d.page_content for d in docs))
        with self._lock:
            cached = self._episodes.pop(key, None)
        if cached is None:
            q, m = self._embed(query, docs)
            cached = {"query": q, "candidates": m, "shown": list(range(len(docs))), "prior": m @ q}
        reranker.partial_fit(_episode(rewards=rewards, **cached))
        report["trained"] = True
        last = getattr(reranker, "last_fit_", None)
        report["updates"] = getattr(last, "updates", None)
        return report


#: The name used in the issue text; the same class.
CitationReranker = ReflectiveCompressor
