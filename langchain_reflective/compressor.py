"""`ReflectiveCompressor`: the citation-trained reranker over any retriever's documents.

Use it in a `ContextualCompressionRetriever` over any base retriever. Documents and the query are
embedded with the core's embedder and ordered by the user's reranker: by default the engine's own
(`memory.rerank_stage.reranker(user_id)`, RMM's residual linear reranker), the one
`memory.retrieve(user_id, ...)` applies. The best `top_n` are kept. `feedback(query, documents,
answer)` reads the answer's citations (`[0]`, `[0, 2]`, `[NO_CITE]`; positions among the
documents as shown, parsed by `reflective_memory.rmm.citations`) as REINFORCE rewards; the
engine's reranker learns them and is saved with the store, exactly like `memory.feedback`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError
from reflective_memory.rmm.citations import echoes_instructions, parse_citations
from reflective_memory.rmm.episodes import Episode
from reflective_memory.rmm.features import citation_rewards, features_for
from reflective_memory.rmm.feedback import FeedbackResult

__all__ = ["ReflectiveCompressor", "CitationReranker"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 128


class ReflectiveCompressor(BaseDocumentCompressor):
    """Rerank any retriever's documents with the citation-trained reranker and keep the best.

    Args (fields):
        memory: The core memory: its embedder embeds query and documents, its reranker for
            `user_id` ranks them and learns from feedback.
        user_id: The user whose reranker ranks and learns (per user, or the engine's shared one
            with `config.rerank.scope="shared"`).
        top_n: Documents kept (RMM's top-M).
        reranker: An explicit reranker instead of the engine's: an object with
            `rerank(query, candidates, prior)` returning an object with `order` and `scores`,
            and `partial_fit(episode)`. It is neither saved nor used by `memory.retrieve`.
            `None` (default): the engine's reranker for `user_id`; when the engine has reranking
            off (`config.rerank.enabled=False`), plain cosine order and feedback is not learned.
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
        description="Reranker with rerank(query, candidates, prior) and partial_fit(episode); "
        "None: the engine's reranker for user_id (cosine order when config.rerank.enabled is off).",
    )
    explore: bool = Field(
        default=False, description="Sample the kept documents with Gumbel noise (learning)."
    )

    _episodes: OrderedDict[tuple[str, tuple[str, ...]], dict[str, Any]] = PrivateAttr(
        default_factory=OrderedDict
    )
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def get_reranker(self) -> Any | None:
        """The reranker in use: the explicit one, else the engine's for `user_id`.

        Returns `None` (cosine order) when no reranker was given and the engine has reranking
        off. The engine's reranker is looked up on every call, so a reranker saved by another
        process, or dropped by `memory.delete_user`, is picked up.
        """
        if self.reranker is not None:
            return self.reranker
        if not self.memory.config.rerank.enabled:
            return None
        return self.memory.rerank_stage.reranker(self.user_id)

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
        feats = None
        if reranker is None:
            order = [int(i) for i in np.argsort(-cos, kind="stable")]
            scores = cos
        else:
            kw: dict[str, Any] = {"explore": True} if self.explore else {}
            feats = features_for(reranker, [d.page_content for d in docs])
            if feats is not None:
                kw["features"] = feats
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
        self._remember(
            key, {"query": q, "candidates": m, "shown": shown, "prior": cos, "features": feats}
        )
        return out

    def feedback(self, query: str, documents: Sequence[Document], answer: str) -> FeedbackResult:
        """Train the reranker from the citations of an answer.

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
            `rewards` by document id (the position as a string for documents without an id),
            `learned` (whether a reranker received the episode), `updates` / `pending` (the
            engine reranker takes one step per `config.rerank.batch_size` episodes and is saved
            after each step), and `reason` when nothing was learned.
        """
        docs = list(documents)
        if not docs:
            raise InvalidInputError("feedback needs the documents that were shown")
        if not isinstance(answer, str):
            raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
        result = FeedbackResult("", self.user_id)
        if echoes_instructions(answer):
            result.reason = "the answer echoes the prompt's instructions"
            return result
        parsed = parse_citations(answer, len(docs))
        cited = list(parsed.indices)
        rewards = citation_rewards(len(docs), cited)
        result.cited = tuple(cited)
        result.no_cite, result.out_of_range, result.repeated = (
            parsed.no_cite,
            parsed.out_of_range,
            parsed.repeated,
        )
        result.rewards = {
            (d.id if d.id else str(i)): float(r)
            for i, (d, r) in enumerate(zip(docs, rewards, strict=True))
        }
        reranker = self.get_reranker()
        if reranker is None:
            result.reason = "reranking is off (config.rerank.enabled)"
            logger.info("citations of user %s not learned: %s", self.user_id, result.reason)
            return result
        key = (query, tuple(d.page_content for d in docs))
        with self._lock:
            cached = self._episodes.pop(key, None)
        if cached is None:
            q, m = self._embed(query, docs)
            cached = {
                "query": q,
                "candidates": m,
                "shown": list(range(len(docs))),
                "prior": m @ q,
                "features": features_for(reranker, [d.page_content for d in docs]),
            }
        episode = Episode(rewards=rewards, **cached)
        if self.reranker is None:
            fit = self.memory.rerank_stage.learn(self.user_id, episode)
            result.updates, result.pending, result.loss = fit.updates, fit.pending, fit.loss
        else:
            self.reranker.partial_fit(episode)
            fit = getattr(self.reranker, "last_fit_", None)
            result.updates = int(getattr(fit, "updates", 0) or 0)
            result.pending = int(getattr(fit, "pending", 0) or 0)
        result.learned = True
        return result


#: The name used in the issue text; the same class.
CitationReranker = ReflectiveCompressor
