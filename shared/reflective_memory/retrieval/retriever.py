"""`Retriever`: the read side of a memory; composes and runs the retrieval pipeline per call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING, Any

from reflective_memory import tracing
from reflective_memory.conditional.reflection import reflective_retrieve
from reflective_memory.errors import InvalidInputError
from reflective_memory.llm import LLMClient
from reflective_memory.recall import RecallConfig
from reflective_memory.retrieval.candidates import DenseCandidates, EmbedQuery, LexicalCandidates
from reflective_memory.retrieval.fusion import SEARCH_MODES, Fusion
from reflective_memory.retrieval.packing import PassagePacking, UnitPacking, wanted
from reflective_memory.retrieval.passages import prepare_turns
from reflective_memory.retrieval.rerank import ShownTurns
from reflective_memory.retrieval.runner import Pipeline, Stage
from reflective_memory.retrieval.state import RetrievalRequest, RetrievalState
from reflective_memory.retrieval.votes import (
    CONTEXT_UNITS,
    DistinctCandidates,
    QuestionCues,
    UserTurns,
    Votes,
)
from reflective_memory.storage.base import MemoryStore
from reflective_memory.storage.index import IndexCache
from reflective_memory.storage.reads import reads_of_call
from reflective_memory.text import parse_timestamp
from reflective_memory.types import GRANULARITIES, Retrieval
from reflective_memory.validation import (
    check_flag,
    check_id,
    check_ids,
    check_positive,
    check_query,
    check_texts,
)

if TYPE_CHECKING:
    from reflective_memory.config import MemoryConfig
    from reflective_memory.embed import Embedder
    from reflective_memory.rmm.feedback import RerankStage

__all__ = ["Retriever"]


class Retriever:
    """Answers `retrieve`: validates the call, runs the stages, reports what happened.

    The stages, in order: question cues (speaker, present tense, time frame), query
    embedding, dense candidates (RF-Mem), lexical candidates (BM25), fusion, turn votes
    weighed by the citation-taught turn ranker and passage packing (small-to-big), and the
    record of the shown turns feedback learns from (RMM) — or unit packing when passages are
    off or `views` are asked for. A stage a call does not need (dense search in lexical mode,
    the record when learning is off) is not in its pipeline.

    Args:
        config: The memory's settings.
        store: The store of record.
        indexes: The users' index caches.
        embedder: The memory's embedder.
        rerankers: RMM's rerankers.
        llm: The LLM for self-reflection retrieval, if any.
        count: Token counter of budgets.
    """

    def __init__(
        self,
        config: MemoryConfig,
        store: MemoryStore,
        indexes: IndexCache,
        embedder: Embedder,
        rerankers: RerankStage,
        llm: LLMClient | None,
        count: Callable[[str], int],
    ) -> None:
        self.config, self.store, self.indexes, self.llm = config, store, indexes, llm
        prepare = partial(prepare_turns, count=count, excerpt_length=config.passages.excerpt_length)
        turns = UserTurns(store, prepare if config.passages.enabled else None)
        self.query = EmbedQuery(embedder, config.units.embed_max_chars)
        self.cues = QuestionCues(config.passages, turns)
        self.dense, self.lexical = DenseCandidates(embedder.name), LexicalCandidates()
        self.distinct = DistinctCandidates(turns)
        self.fusion = Fusion(config.search)
        learning = rerankers.learning
        self.shown = ShownTurns(learning.weights, learning.episodes)
        context_units = any(g in CONTEXT_UNITS for g in config.units.granularities)
        self.votes = Votes(
            config.passages,
            config.search.rrf_k,
            turns,
            context_units,
            learning.weights,
            learning.explore_noise,
            learning.rivals,
            learning.coin,
        )
        self.passages = PassagePacking(config.passages, config.units.date_prefix, turns, count)
        self.units = UnitPacking(store, count)

    async def aclose(self) -> None:
        """Finish the running loop's batched query embeddings (native async; see `EmbedQuery`)."""
        await self.query.aclose()

    def stages(self, request: RetrievalRequest) -> list[Stage]:
        """The pipeline for one call (an ablation is the same list without a stage)."""
        cfg = self.config
        passages = cfg.passages.enabled and request.views is None
        out: list[Stage] = []
        p = cfg.passages
        if passages and (p.speaker_focus or p.person_focus or p.recency or p.time_frame):
            out.append(self.cues)
        if request.mode != "lexical":
            out += [self.query, self.dense]
        if request.mode != "dense":
            out.append(self.lexical)
        if passages:
            out.append(self.distinct)
        out.append(self.fusion)
        out += [self.votes, self.passages] if passages else [self.units]
        if passages and cfg.rerank.enabled:
            out.append(self.shown)
        return out

    def retrieve(
        self,
        user_id: str,
        query: str,
        *,
        k: int | None = None,
        budget_tokens: int | None = None,
        mode: str | None = None,
        recall: RecallConfig | dict[str, Any] | None = None,
        views: Sequence[str] | None = None,
        reflect: bool | None = None,
        explore: bool | None = None,
        exclude_turns: Collection[str] | None = None,
        now: datetime | str | None = None,
    ) -> Retrieval:
        """See `ReflectiveMemory.retrieve`."""
        t_start = time.perf_counter()
        request = self.request(
            user_id, query, k, budget_tokens, mode, recall, views, explore, exclude_turns, now
        )
        cfg = self.config.conditional
        if cfg.self_reflection if check_flag("reflect", reflect) is None else reflect:
            return self._reflective(request, t_start)
        return self.run(request, t_start)

    def request(
        self,
        user_id: Any,
        query: Any,
        k: Any,
        budget: Any,
        mode: Any,
        recall: Any,
        views: Any,
        explore: Any,
        exclude: Any = None,
        now: Any = None,
    ) -> RetrievalRequest:
        """Check a call's arguments (before any work) and resolve them against the config."""
        check_id("user_id", user_id)
        check_query(query, self.config.search.max_query_chars)
        k, budget = check_positive("k", k), check_positive("budget_tokens", budget)
        cfg = self.config
        mode = cfg.search.mode if mode is None else mode
        if not isinstance(mode, str) or mode not in SEARCH_MODES:
            raise InvalidInputError(f"mode must be hybrid, dense or lexical, got {mode!r}")
        if recall is None:
            recall = cfg.recall
        elif isinstance(recall, dict):
            if not all(isinstance(name, str) for name in recall):
                raise InvalidInputError("recall must map RecallConfig field names (str) to values")
            recall = cfg.recall.replace(**recall)
        elif not isinstance(recall, RecallConfig):
            raise InvalidInputError(
                f"recall must be a RecallConfig, a dict or None, got {type(recall).__name__}"
            )
        if k is None and budget is None:
            k = cfg.search.default_k
            budget = cfg.search.default_budget_tokens if k is None else None
        views = cfg.search.views if views is None else tuple(check_texts("views", views))
        if views is not None and (not views or any(v not in GRANULARITIES for v in views)):
            raise InvalidInputError(f"views must name kinds from {GRANULARITIES}, got {views!r}")
        explore = check_flag("explore", explore)
        explore = cfg.rerank.explore if explore is None else explore
        exclude = () if exclude is None else check_ids("exclude_turns", exclude)
        asked = parse_timestamp(now)
        if asked is not None and asked.tzinfo is None:
            asked = asked.replace(tzinfo=timezone.utc)
        rid = uuid.uuid4().hex
        return RetrievalRequest(
            user_id, query, k, budget, mode, recall, views, explore, rid, frozenset(exclude),
            asked,
        )  # fmt: skip

    def run(self, request: RetrievalRequest, t_start: float) -> Retrieval:
        """Run the pipeline for a checked request.

        On a store that reads from several servers (PostgreSQL with read replicas), the
        diagnostics say which answered (`reads`: reads per server, the time waited for a
        replica to catch up, and why reads went to the primary).
        """
        with reads_of_call() as reads:
            state = self.state(request)
        state.timings["total"] = (time.perf_counter() - t_start) * 1000
        diagnostics = state.diagnostics()
        if reads.servers:
            diagnostics["reads"] = reads.summary()
        return Retrieval(
            request.user_id,
            request.query,
            state.hits,
            diagnostics,
            retrieval_id=request.retrieval_id,
            rerank=state.rerank,
        )

    def state(self, request: RetrievalRequest) -> RetrievalState:
        """Run the pipeline for a checked request and return its whole state.

        Tooling reads more of it than a `Retrieval` shows: fitting the ranker reads the feature
        rows of `state.features`.
        """
        t0 = time.perf_counter()
        with tracing.span("index"):
            stored = self.store.version(request.user_id) != 0
            index = self.indexes.get(request.user_id) if stored else None
        state = RetrievalState(request, index, request.query)  # type: ignore[arg-type]
        state.timings["index"] = (time.perf_counter() - t0) * 1000
        if index is not None and len(index) > 0:
            cfg = self.config
            passages = cfg.passages.enabled and request.views is None
            want = wanted(index, request.k, request.budget, passages)
            state.n = min(len(index), max(want, cfg.search.candidate_k, cfg.rerank.top_k))
            Pipeline(self.stages(request)).run(state)
        return state

    def _reflective(self, request: RetrievalRequest, t_start: float) -> Retrieval:
        """Self-reflection retrieval (conditional memory): re-query with the LLM's keywords."""

        def once(q: str) -> Retrieval:
            return self.run(
                RetrievalRequest(
                    request.user_id, q, request.k, request.budget, request.mode, request.recall,
                    request.views, request.explore, uuid.uuid4().hex, request.exclude,
                    request.now,
                ),
                time.perf_counter(),
            )  # fmt: skip

        out = reflective_retrieve(
            once,
            request.query,
            self.llm,
            rounds=self.config.conditional.self_reflection_rounds,
            k=request.k,
            budget_tokens=request.budget,
            user_id=request.user_id,
        )
        out.diagnostics["timings_ms"] = dict(out.diagnostics.get("timings_ms", {}))
        out.diagnostics["timings_ms"]["total"] = (time.perf_counter() - t_start) * 1000
        return out
