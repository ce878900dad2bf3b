"""`ReflectiveNodePostprocessor`: the citation-trained reranker for any LlamaIndex retriever.

Pipeline over the nodes a retriever returned (in its order):

1. keys: each node's text, optionally denoised by the engine's denoiser (`denoise=True`; used
   for scoring only: the nodes returned keep their text, ids and metadata untouched);
2. candidates: the first `candidate_k` nodes, or, with `recollect=True`, the `candidate_k`
   nodes RF-Mem recollection (`reflective_memory.recall`) picks among all given nodes' key
   embeddings;
3. scores: the engine's reranker for the user (`memory.rerank_stage.reranker(user_id)`, the one
   `memory.retrieve` applies) over the core embedder's vectors of query and keys; an untrained
   reranker, or an engine with reranking off, gives their cosine;
4. the `top_n` best nodes, with the new scores.

Every ranking is remembered (a bounded number of them) so that `feedback(response)` can turn the
citations in a query engine's answer into a REINFORCE episode: the engine's reranker learns it and
is saved with the store (`RerankStage.learn`), exactly like `memory.feedback`.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from reflective_memory.engine import ReflectiveMemory  # noqa: E402
from reflective_memory.errors import ConfigError, InvalidInputError  # noqa: E402
from reflective_memory.recall import ArrayIndex, recall  # noqa: E402
from reflective_memory.rmm.citations import (  # noqa: E402
    echoes_instructions,
    parse_citations,
    register_instructions,
)
from reflective_memory.rmm.episodes import Episode  # noqa: E402
from reflective_memory.rmm.features import citation_rewards, features_for  # noqa: E402
from reflective_memory.rmm.feedback import FeedbackResult  # noqa: E402

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
        ranking_id: Id of the ranking.
        query: The query text.
        query_vec: `(dim,)` query embedding.
        candidate_vecs: `(K, dim)` candidate key embeddings, in candidate order.
        node_ids: Node id of each candidate.
        texts: Raw text of each candidate (to recognise re-chunked citation nodes).
        shown: Candidate positions returned, best first.
        features: `(K, F)` reranker side features of the candidates (None if it takes none).
    """

    ranking_id: str
    query: str
    query_vec: np.ndarray
    candidate_vecs: np.ndarray
    node_ids: list[str]
    texts: list[str]
    shown: list[int]
    features: np.ndarray | None = None


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
            `memory.retrieve`): an object with `score(query_vec, candidate_vecs, prior=None) ->
            (K,) scores` and, to learn, `partial_fit(episode)`. Default: the engine's reranker
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

    _rankings: OrderedDict[str, Ranking] = PrivateAttr(default_factory=OrderedDict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, *, memory: Any, user_id: str, **kwargs: Any) -> None:
        if not isinstance(memory, ReflectiveMemory):
            raise InvalidInputError(
                f"memory must be a ReflectiveMemory, got {type(memory).__name__}"
            )
        if not isinstance(user_id, str) or not user_id.strip():
            raise InvalidInputError("user_id must be a non-empty str")
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
        """The reranker to use: the explicit one, else the engine's for this user.

        `None` (cosine scores) when no reranker was given and the engine has reranking off.
        """
        if self.reranker is not None:
            return self.reranker
        if not self.memory.config.rerank.enabled:
            return None
        return self.memory.rerank_stage.reranker(self.user_id)

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
        return f"reflective-reranker:{type(rr).__name__ if rr is not None else 'cosine'}"

    # -- ranking --------------------------------------------------------------------------
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
        embedder = self.memory.embedder
        texts = [n.node.get_content(metadata_mode=self.metadata_mode) for n in nodes]
        qvec = np.asarray(embedder.encode(query), dtype=np.float32).reshape(-1)
        keys = self._keys(texts)
        pool = list(range(len(nodes)))
        if self.recollect and len(nodes) > self.candidate_k:
            all_vecs = np.asarray(embedder.encode(keys), dtype=np.float32)
            picked = [int(p) for p in self._recollector()(qvec, all_vecs, self.candidate_k)]
            pool = [p for p in dict.fromkeys(picked) if 0 <= p < len(nodes)][: self.candidate_k]
            vecs = all_vecs[pool]
        else:
            pool = pool[: self.candidate_k]
            vecs = np.asarray(embedder.encode([keys[p] for p in pool]), dtype=np.float32)
        vecs = vecs.reshape(len(pool), -1)
        reranker = self._reranker()
        feats = None
        if reranker is None:
            scores = vecs @ qvec
        else:
            feats = features_for(reranker, [keys[p] for p in pool])
            kw = {} if feats is None else {"features": feats}
            scores = np.asarray(reranker.score(qvec, vecs, **kw), dtype=np.float32).reshape(-1)
        order = [int(i) for i in np.argsort(-scores, kind="stable")[: self.top_n]]
        ranking = Ranking(
            ranking_id=uuid.uuid4().hex,
            query=query,
            query_vec=qvec,
            candidate_vecs=vecs,
            node_ids=[nodes[p].node.node_id for p in pool],
            texts=[texts[p] for p in pool],
            shown=order,
            features=feats,
        )
        with self._lock:
            self._rankings[ranking.ranking_id] = ranking
            while len(self._rankings) > self.max_rankings:
                self._rankings.popitem(last=False)
        return [NodeWithScore(node=nodes[pool[i]].node, score=float(scores[i])) for i in order]

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
        """Turn a query engine's cited answer into reranker training.

        The answer's citations (`[1]`, `[1, 3]`, `Source 2`, `[NO_CITE]`; numbered from
        `citation_base` over `response.source_nodes`; parsed by
        `reflective_memory.rmm.citations`) are mapped back to the nodes this postprocessor
        returned for that query; each returned node gets reward +1 when cited and -1 when not.
        The engine's reranker for `user_id` learns the episode and is saved with the store after
        each optimizer step (one per `config.rerank.batch_size` episodes); an explicit
        `reranker` gets `partial_fit`. An answer that echoes the prompt's instructions back
        teaches nothing.

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
            InvalidInputError: The response has no source nodes this postprocessor ranked.
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
        result = FeedbackResult(ranking.ranking_id, self.user_id)
        if cited is not None:
            numbers = [int(c) for c in cited]
        else:
            answer = str(getattr(response, "response", "") or "")
            if echoes_instructions(answer):
                result.reason = "the answer echoes the prompt's instructions"
                return result
            parsed = parse_citations(
                _SOURCE_WORD.sub(r"[\1]", answer), len(where) + self.citation_base
            )
            numbers = list(parsed.indices)
            result.no_cite, result.out_of_range = parsed.no_cite, parsed.out_of_range
            result.repeated = parsed.repeated
            if not parsed.found:
                result.reason = "the answer has no citation"
        cited_pos: set[int] = set()
        for n in numbers:
            i = n - self.citation_base
            if 0 <= i < len(where) and where[i] is not None:
                cited_pos.add(int(where[i]))  # type: ignore[arg-type]
        hits = [j for j, p in enumerate(ranking.shown) if p in cited_pos]
        rewards = citation_rewards(len(ranking.shown), hits)
        result.cited = tuple(hits)
        result.rewards = {
            ranking.node_ids[p]: float(r) for p, r in zip(ranking.shown, rewards, strict=True)
        }
        if result.reason:
            return result
        episode = Episode(
            query=ranking.query_vec,
            candidates=ranking.candidate_vecs,
            shown=list(ranking.shown),
            rewards=rewards,
            features=ranking.features,
        )
        if self.reranker is not None:
            if not callable(getattr(self.reranker, "partial_fit", None)):
                result.reason = "the reranker given cannot learn (no partial_fit)"
                logger.info("feedback for user %s not learned: %s", self.user_id, result.reason)
                return result
            self.reranker.partial_fit(episode)
        elif not self.memory.config.rerank.enabled:
            result.reason = "reranking is off (config.rerank.enabled)"
            logger.info("feedback for user %s not learned: %s", self.user_id, result.reason)
            return result
        else:
            fit = self.memory.rerank_stage.learn(self.user_id, episode)
            result.updates, result.pending, result.loss = fit.updates, fit.pending, fit.loss
        result.learned = True
        return result
