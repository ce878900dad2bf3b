"""`ReflectiveNodePostprocessor`: the citation-trained reranker for any LlamaIndex retriever.

Pipeline over the nodes a retriever returned (in its order):

1. keys: each node's text, optionally denoised by the engine's denoiser (`denoise=True`; used
   for scoring only: the nodes returned keep their text, ids and metadata untouched);
2. candidates: the first `candidate_k` nodes, or, with `recollect=True`, the `candidate_k`
   nodes RF-Mem recollection (`reflective_memory.recall`) picks among all given nodes' key
   embeddings;
3. scores: `memory.rerank_texts` over the keys, i.e. the engine's reranker for the user (the
   one `memory.retrieve` applies) over the core embedder's vectors of query and keys; an
   untrained reranker, or an engine with reranking off, gives their cosine;
4. with `now` (or with node times alone): when the query names a period ("two weeks ago",
   "in March"), the nodes said in it (`metadata["timestamp"]`) come first, in that order;
5. the `top_n` best nodes, with the new scores.

Every ranking is remembered (a bounded number of them) so that `feedback(response)` can map a
query engine's source nodes back onto it and hand the answer to `memory.feedback`: the engine's
reranker learns from the citations and is saved with the store, as for `memory.retrieve`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from ._compat import require_llama_index

require_llama_index()

from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402
from llama_index.core.callbacks import CBEventType, EventPayload  # noqa: E402
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.events.rerank import (  # noqa: E402
    ReRankEndEvent,
    ReRankStartEvent,
)
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle  # noqa: E402
from reflective_memory import (  # noqa: E402
    FeedbackResult,
    RankedTexts,
    ReflectiveMemory,
    register_instructions,
)
from reflective_memory.embed import encode_query  # noqa: E402
from reflective_memory.errors import ConfigError, InvalidInputError  # noqa: E402
from reflective_memory.recall import ArrayIndex, recall  # noqa: E402
from reflective_memory.text import parse_timestamp  # noqa: E402
from reflective_memory.validation import MESSAGE_TIME_KEY  # noqa: E402

__all__ = ["ReflectiveNodePostprocessor", "Ranking"]

logger = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

try:  # the instruction of LlamaIndex's citation prompts, which an answer must not echo
    from llama_index.core.query_engine.citation_query_engine import (  # noqa: E402
        CITATION_QA_TEMPLATE,
        CITATION_REFINE_TEMPLATE,
    )

    register_instructions(
        CITATION_QA_TEMPLATE.get_template().split("Example:")[0],
        CITATION_REFINE_TEMPLATE.get_template().split("Example:")[0],
    )
except (ImportError, AttributeError):  # pragma: no cover - other llama-index versions
    pass

_SOURCE_PREFIX = re.compile(r"^\s*Source\s+\d+\s*:\s*", re.IGNORECASE)
# LlamaIndex's citation prompts number sources "Source 1:"; answers may name them that way.
_SOURCE_WORD = re.compile(r"\bsources?\s+(\d+)\b", re.IGNORECASE)

#: `recollector(query_vec (d,), candidate_vecs (n, d), k) -> positions` (best first, <= k).
Recollector = Callable[[np.ndarray, np.ndarray, int], Sequence[int]]


@dataclass
class Ranking:
    """One ranking made by the postprocessor, kept for feedback.

    Attributes:
        ranked: What `memory.rerank_texts` returned for the candidates' keys.
        node_ids: Node id of each candidate, in candidate order.
        texts: Raw text of each candidate (to recognise re-chunked citation nodes).
    """

    ranked: RankedTexts
    node_ids: list[str]
    texts: list[str]

    @property
    def ranking_id(self) -> str:
        """Id of the ranking (its `RerankRecord.retrieval_id`)."""
        return self.ranked.record.retrieval_id

    @property
    def shown(self) -> list[int]:
        """Candidate positions returned, best first."""
        return list(self.ranked.order)


class ReflectiveNodePostprocessor(BaseNodePostprocessor):
    """Rerank any retriever's nodes with the user's citation-trained reranker.

    Args:
        memory: The core `ReflectiveMemory`: its embedder, its reranker for `user_id`, its
            denoiser and its RF-Mem settings (`config.recall`) are used.
        user_id: The user whose reranker ranks and learns (per user, or the engine's shared one
            with `config.rerank.scope="shared"`).
        top_n: Nodes returned (RMM's top-M).
        candidate_k: Nodes considered (RMM's top-K), taken in the retriever's order unless
            `recollect` is on.
        reranker: An explicit reranker instead of the engine's (neither saved nor used by
            `memory.retrieve`): an object with `rerank(query_vec, candidate_vecs, prior, *,
            explore)` returning `order` and `scores`, and `partial_fit(episode)` (see
            `reflective_memory.rmm.feedback.CallerReranker`). Default: the engine's reranker
            for `user_id`; plain cosine (and no learning) when the engine has
            `config.rerank.enabled` off.
        denoise: Score denoised node text (`denoiser`, else the engine's `memory.denoiser`);
            nodes keep their text. If the denoiser fails, the raw text is scored.
        denoiser: An object with `denoise(list[str]) -> list[str]`.
        recollect: Choose the candidates among all given nodes with `reflective_memory.recall`
            and the engine's `config.recall` settings; its default `familiarity` mode (a plain
            top-K) is replaced by `recollection`, a configured `rfmem` gate is kept.
        recollector: Custom recollection function (see `Recollector`).
        metadata_mode: Which node content is scored (default: text without metadata).
        citation_base: Number of the first source in answers (`1` for LlamaIndex's
            `CitationQueryEngine`, which writes `Source 1:` ...).
        max_rankings: Rankings remembered for `feedback`.
        now: When queries are asked (any timestamp `add_turn` takes; None: the newest node
            time). A query naming a period ("two weeks ago") puts the nodes said in it
            first; a node's time is its `metadata[time_key]`.
        time_key: The node metadata key holding when a node was said (a time that does not
            parse counts as unknown).

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> from llama_index.core.schema import TextNode
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=1)
        >>> nodes = [NodeWithScore(node=TextNode(text=t, id_=t[:3]), score=0.5)
        ...          for t in ["cats purr", "dogs bark loudly"]]
        >>> [n.node.node_id for n in pp.postprocess_nodes(nodes, query_str="why do dogs bark")]
        ['dog']
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: ReflectiveMemory = Field(exclude=True, description="The core ReflectiveMemory.")
    user_id: str = Field(description="The user whose reranker ranks and learns.")
    top_n: int = Field(default=5, ge=1, description="Nodes returned (top-M).")
    candidate_k: int = Field(default=20, ge=1, description="Nodes considered (top-K).")
    reranker: Any = Field(default=None, exclude=True, description="Reranker override.")
    denoise: bool = Field(default=False, description="Score denoised node text.")
    denoiser: Any = Field(default=None, exclude=True, description="Denoiser override.")
    recollect: bool = Field(default=False, description="Pick candidates by recollection.")
    recollector: Any = Field(default=None, exclude=True, description="Recollection override.")
    metadata_mode: MetadataMode = Field(
        default=MetadataMode.NONE, description="Which node content is scored."
    )
    citation_base: int = Field(default=1, ge=0, description="Number of the first source.")
    max_rankings: int = Field(default=64, ge=1, description="Rankings kept for feedback.")
    now: datetime | str | float | None = Field(
        default=None,
        description="When queries are asked, for 'two weeks ago' (None: the newest node time).",
    )
    time_key: str = Field(
        default=MESSAGE_TIME_KEY, description="Node metadata key of when the node was said."
    )

    _rankings: OrderedDict[str, Ranking] = PrivateAttr(default_factory=OrderedDict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, *, memory: Any, user_id: str, **kwargs: Any) -> None:
        if not isinstance(memory, ReflectiveMemory):
            raise InvalidInputError(
                f"memory must be a ReflectiveMemory, got {type(memory).__name__}"
            )
        if not isinstance(user_id, str) or not user_id.strip():
            raise InvalidInputError("user_id must be a non-empty str")
        kwargs["now"] = parse_timestamp(kwargs.get("now"))
        super().__init__(memory=memory, user_id=user_id, **kwargs)
        if self.denoise and self._denoiser() is None:
            raise ConfigError(
                "denoise=True needs a denoiser: pass denoiser=... or configure one on the memory"
            )

    @classmethod
    def class_name(cls) -> str:
        """Name used in LlamaIndex serialisation."""
        return "ReflectiveNodePostprocessor"

    # -- hooks ----------------------------------------------------------------------------
    def _reranker(self) -> Any | None:
        """The caller's reranker, if one was given; None: the memory's turn ranker ranks."""
        return self.reranker

    def _denoiser(self) -> Any | None:
        return self.denoiser if self.denoiser is not None else self.memory.denoiser

    def _recollector(self) -> Recollector:
        if self.recollector is not None:
            return self.recollector  # type: ignore[no-any-return]
        cfg = self.memory.config.recall
        if cfg.mode == "familiarity":
            cfg = cfg.replace(mode="recollection")

        def run(query: np.ndarray, vecs: np.ndarray, k: int) -> list[int]:
            return [int(p) for p in recall(ArrayIndex(vecs), query, k, cfg).positions]

        return run

    @property
    def model_name(self) -> str:
        """What the rerank events report as the model."""
        rr = self._reranker()
        return f"reflective-reranker:{type(rr).__name__ if rr is not None else 'turn-ranker'}"

    # -- ranking --------------------------------------------------------------------------
    def _time(self, node: NodeWithScore) -> datetime | None:
        """When a node was said (`metadata[time_key]`), None when unknown or unreadable."""
        value = (node.node.metadata or {}).get(self.time_key)
        try:
            return parse_timestamp(value)
        except InvalidInputError:
            logger.debug("node %s has an unreadable time %r", node.node.node_id, value)
            return None

    def _keys(self, texts: list[str]) -> list[str]:
        if not self.denoise:
            return texts
        denoiser = self._denoiser()
        try:
            out = denoiser.denoise(list(texts))  # type: ignore[union-attr]
        except Exception as exc:  # score the raw text rather than fail the query
            logger.warning("denoiser failed for user %s; scoring raw text: %s", self.user_id, exc)
            return texts
        if isinstance(out, str) or len(out) != len(texts):
            raise InvalidInputError("the denoiser must return one text per input text")
        pairs = zip(out, texts, strict=True)
        return [k if isinstance(k, str) and k.strip() else t for k, t in pairs]

    def _rank(self, nodes: list[NodeWithScore], query: str) -> list[NodeWithScore]:
        texts = [n.node.get_content(metadata_mode=self.metadata_mode) for n in nodes]
        keys = self._keys(texts)
        pool = list(range(len(nodes)))[: self.candidate_k]
        if self.recollect and len(nodes) > self.candidate_k:
            embedder = self.memory.embedder
            qvec = np.asarray(encode_query(embedder, query), dtype=np.float32).reshape(-1)
            all_vecs = np.asarray(embedder.encode(keys), dtype=np.float32)
            picked = [int(p) for p in self._recollector()(qvec, all_vecs, self.candidate_k)]
            pool = [p for p in dict.fromkeys(picked) if 0 <= p < len(nodes)][: self.candidate_k]
        node_ids = [nodes[p].node.node_id for p in pool]
        ranked = self.memory.rerank_texts(
            self.user_id,
            query,
            [keys[p] for p in pool],
            ids=node_ids,
            top_n=self.top_n,
            reranker=self.reranker,
            times=[self._time(nodes[p]) for p in pool],
            now=self.now,
        )
        with self._lock:
            self._rankings[ranked.record.retrieval_id] = Ranking(
                ranked, node_ids, [texts[p] for p in pool]
            )
            while len(self._rankings) > self.max_rankings:
                self._rankings.popitem(last=False)
        return [
            NodeWithScore(node=nodes[pool[i]].node, score=score)
            for i, score in zip(ranked.order, ranked.scores, strict=True)
        ]

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        dispatcher.event(
            ReRankStartEvent(
                query=query_bundle, nodes=nodes, top_n=self.top_n, model_name=self.model_name
            )
        )
        if query_bundle is None:
            raise InvalidInputError("ReflectiveNodePostprocessor needs the query")
        if not nodes:
            dispatcher.event(ReRankEndEvent(nodes=[]))
            return []
        with self.callback_manager.event(
            CBEventType.RERANKING,
            payload={
                EventPayload.NODES: nodes,
                EventPayload.MODEL_NAME: self.model_name,
                EventPayload.QUERY_STR: query_bundle.query_str,
                EventPayload.TOP_K: self.top_n,
            },
        ) as event:
            out = self._rank(list(nodes), query_bundle.query_str)
            event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out

    # -- feedback -------------------------------------------------------------------------
    @property
    def rankings(self) -> list[Ranking]:
        """Remembered rankings, oldest first."""
        with self._lock:
            return list(self._rankings.values())

    def _locate(self, node: NodeWithScore, ranking: Ranking) -> int | None:
        """Candidate position of a source node (same id, or a re-chunked piece of it)."""
        nid = node.node.node_id
        if nid in ranking.node_ids:
            return ranking.node_ids.index(nid)
        text = _SOURCE_PREFIX.sub("", node.node.get_content(metadata_mode=MetadataMode.NONE))
        text = text.strip()
        if not text:
            return None
        for i, cand in enumerate(ranking.texts):
            if text in cand:
                return i
        return None

    def _match(self, sources: list[NodeWithScore]) -> tuple[Ranking, list[int | None]] | None:
        for ranking in reversed(self.rankings):
            where = [self._locate(s, ranking) for s in sources]
            if any(w is not None for w in where):
                return ranking, where
        return None

    def feedback(self, response: Any, *, cited: Sequence[int] | None = None) -> FeedbackResult:
        """Turn a query engine's cited answer into reranker training (`memory.feedback`).

        The answer's citations (`[1]`, `[1, 3]`, `Source 2`, `[NO_CITE]`; numbered from
        `citation_base` over `response.source_nodes`) name source nodes, which are mapped back to
        the nodes this postprocessor returned for that query (by id, or as a re-chunked piece of
        one); each returned node gets reward +1 when cited and -1 when not. The engine's
        reranker for `user_id` learns the episode and is saved with the store after each
        optimizer step (one per `config.rerank.batch_size` episodes); an explicit `reranker`
        gets `partial_fit`. An answer that echoes the prompt's instructions back teaches
        nothing.

        Args:
            response: A LlamaIndex `Response` (anything with `response` and `source_nodes`).
            cited: Source numbers cited (same numbering), instead of parsing the answer.

        Returns:
            The same `FeedbackResult` as `ReflectiveMemory.feedback`: `retrieval_id` is the
            ranking's id, `cited` the cited positions among the nodes this postprocessor
            returned (0-based, best first), `rewards` the reward of each returned node by node
            id, `learned` whether a reranker learned, `updates` / `pending` the engine
            reranker's step report, and `reason` why nothing was learned.

        Raises:
            InvalidInputError: The response has no source nodes this postprocessor ranked, or
                `cited` names no source.
        """
        sources = list(getattr(response, "source_nodes", None) or [])
        if not sources:
            raise InvalidInputError("the response has no source nodes to give feedback on")
        found = self._match(sources)
        if found is None:
            raise InvalidInputError(
                "none of the response's source nodes was ranked by this postprocessor "
                f"(it remembers the last {self.max_rankings} rankings)"
            )
        ranking, where = found
        shown_at = {p: j for j, p in enumerate(ranking.ranked.order)}
        numbering = {
            self.citation_base + s: None if w is None else shown_at.get(w)
            for s, w in enumerate(where)
        }
        answer = None
        if cited is None:  # LlamaIndex's prompts name sources "Source 1"
            answer = _SOURCE_WORD.sub(r"[\1]", str(getattr(response, "response", "") or ""))
        return self.memory.feedback(ranking.ranked, answer, cited=cited, numbering=numbering)
