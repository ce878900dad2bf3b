"""`ReflectiveMemory`: the orchestrator every adapter calls.

Write path: `add_turn` commits a turn at once; `end_session` turns a session into memory units
(turns, whole sessions or topical segments), embeds their keys and indexes them.
Read path: `retrieve` ranks a user's memories for a query (RF-Mem adaptive dense retrieval, fused
with BM25 by reciprocal rank) and cuts the ranking to `k` hits or a token budget.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from reflective_memory.config import MemoryConfig
from reflective_memory.denoise import Denoiser, make_denoiser
from reflective_memory.embed import Embedder, default_embedder
from reflective_memory.errors import (
    InvalidInputError,
    StoreClosedError,
)
from reflective_memory.llm import LLMClient, as_llm, count_tokens
from reflective_memory.ranking import pack_hits, rank_candidates
from reflective_memory.recall import RecallConfig
from reflective_memory.records import MemoryRecords
from reflective_memory.retrieval_steps import RetrievalSteps
from reflective_memory.rmm.episodes import RankedTexts
from reflective_memory.rmm.feedback import CallerReranker, FeedbackResult, RerankStage
from reflective_memory.rmm.personal import PersonalReranker
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.topics import ProspectiveReflector
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.sessions.building import SessionBuilding
from reflective_memory.storage.base import StateHolder
from reflective_memory.storage.factory import open_store
from reflective_memory.storage.index import IndexCache
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.storage.state import FileStateStore
from reflective_memory.text import parse_timestamp
from reflective_memory.types import GRANULARITIES, Memory, RerankRecord, Retrieval, Turn
from reflective_memory.validation import check_encodable, check_id, check_positive, check_role

__all__ = ["ReflectiveMemory"]

logger = logging.getLogger(__name__)


def _has_derived_files(directory: Path) -> bool:
    """Whether index or reranker files exist, i.e. a database was stored here before."""
    return any(
        any((directory / d).iterdir()) for d in ("index", "rerankers") if (directory / d).is_dir()
    )


def _comparable(a: datetime, b: datetime) -> bool:
    return (a.tzinfo is None) == (b.tzinfo is None)


def _count_words(text: str) -> int:
    return len(text.split())


class ReflectiveMemory(SessionBuilding, MemoryRecords, RetrievalSteps):
    """Long-term memory for many users, in one durable store.

    Args:
        path: `None` keeps everything in memory; a directory holds the SQLite database
            (`memory.sqlite3`) and the index cache files (`index/`). Reopening the directory
            restores everything.
        embedder: Any `Embedder`; defaults to the bundled offline all-MiniLM-L6-v2.
        llm: Optional LLM (a callable `prompt -> str` or an object with `complete`). Every
            LLM-backed step falls back to its offline counterpart without it.
        config: Settings; see `MemoryConfig`.
        segmenter: Cuts sessions into segments for the `segment` granularity (default: chosen by
            `config.segment.kind`; `auto` is the LLM segmenter when `llm` is given, else the offline
            embedding segmenter).
        denoiser: Denoises memory keys before indexing (SeCom compression): `"none"`,
            `"offline"`, `"llmlingua"` or any object with `denoise(texts)` (see
            `reflective_memory.denoise.Denoiser`). `None` uses `config.denoise.kind`. Only keys
            are denoised; the LLM always gets the raw text. After changing it,
            `redenoise(user_id)` re-keys a user's existing memories.
        store: Keep everything in a database server instead of `path`: a
            `postgresql://...` URI (a `reflective_memory.storage.postgres.PostgresStore` with its
            own pool) or a store object (closed with this memory). Many processes may share one
            database; see the README's "Scaling out".

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        ...     _ = mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        ...     _ = mem.end_session("ana", "s1")
        ...     mem.retrieve("ana", "What is my dog called?").hits[0].memory.turn_ids
        ('s1:0',)
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        llm: Any | None = None,
        config: MemoryConfig | None = None,
        segmenter: Segmenter | None = None,
        denoiser: Denoiser | str | None = None,
        store: Any | None = None,
    ) -> None:
        self.config = (config if config is not None else MemoryConfig()).validate()
        if store is not None and path is not None:
            raise InvalidInputError("give either path (embedded store) or store, not both")
        self.path = None if path is None else Path(path)
        if self.path is not None:
            if self.path.exists() and not self.path.is_dir():
                raise InvalidInputError(f"path {str(self.path)!r} exists and is not a directory")
            self.path.mkdir(parents=True, exist_ok=True)
        if store is not None:
            self.store: Any = open_store(store)
        else:
            self.store = SQLiteStore(
                None if self.path is None else self.path / "memory.sqlite3",
                must_exist=self.path is not None and _has_derived_files(self.path),
            )
        self.embedder: Embedder = embedder if embedder is not None else default_embedder()
        self.llm: LLMClient | None = as_llm(
            llm, timeout_s=self.config.llm.timeout_s, max_chars=self.config.llm.max_chars
        )
        self.segmenter: Segmenter = (
            segmenter
            if segmenter is not None
            else segmenter_from_config(self.config.segment, self.embedder, self.llm)
        )
        cfg = self.config
        self.denoiser: Denoiser | None = make_denoiser(
            cfg.denoise.kind if denoiser is None else denoiser,
            rate=cfg.denoise.rate,
            model=cfg.denoise.model,
            device=cfg.denoise.device,
        )
        self.indexes = IndexCache(
            self.store,
            self.embedder,
            None if self.path is None else self.path / "index",
            batch_size=self.config.units.embed_batch_size,
            ann=self.config.index.ann(),
            max_bytes=self.config.index.cache_bytes,
        )
        # RMM: prospective reflection needs an LLM and the option; the reranker stage is local.
        self.reflector: ProspectiveReflector | None = None
        if self.llm is not None and self.config.topics.enabled:
            self.reflector = ProspectiveReflector(
                self.llm,
                merge_k=self.config.topics.merge_k,
                speakers=self.config.topics.speakers,
                date_prefix=self.config.units.date_prefix,
            )
        self._count = count_tokens if cfg.passages.budget_unit == "tokens" else _count_words
        files = None if self.path is None else self.path / "rerankers"
        state = self.store.state if isinstance(self.store, StateHolder) else FileStateStore(files)
        self.rerank_stage = RerankStage(cfg.rerank, self.embedder, state, legacy=files)
        if self.path is not None:
            self._end_stale_sessions()

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the store; later calls raise `StoreClosedError`. Idempotent.

        Rerankers' buffered feedback episodes are saved first.
        """
        if not self.store.closed:
            try:
                self.rerank_stage.save_all()
            except Exception:  # never block closing the store of record
                logger.exception("saving buffered reranker feedback failed")
        self.store.close()

    def __enter__(self) -> ReflectiveMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if self.store.closed:
            raise StoreClosedError("this ReflectiveMemory is closed; open a new one")

    # -- write path -----------------------------------------------------------------------
    def _turn_record(
        self,
        user_id: Any,
        session_id: Any,
        role: Any,
        text: Any,
        timestamp: Any,
        turn_id: Any,
    ) -> dict[str, Any]:
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        check_role(role)
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        check_encodable("text", text)
        if not text.strip():
            raise InvalidInputError("text must not be empty or whitespace")
        if len(text) > self.config.sessions.max_text_chars:
            raise InvalidInputError(
                f"text has {len(text)} characters, more than max_text_chars="
                f"{self.config.sessions.max_text_chars}"
            )
        if turn_id is not None:
            check_id("turn_id", turn_id)
        return {
            "user_id": user_id,
            "session_id": session_id,
            "role": role,
            "text": text,
            "timestamp": parse_timestamp(timestamp),
            "turn_id": turn_id,
        }

    def add_turn(
        self,
        user_id: str,
        session_id: str,
        role: str,
        text: str,
        *,
        timestamp: datetime | str | float | None = None,
        turn_id: str | None = None,
    ) -> Turn:
        """Store one utterance durably (committed before this returns).

        Args:
            user_id: Owner of the conversation.
            session_id: The session; a new id opens a new session.
            role: `user`, `assistant`, `system` or any speaker label.
            text: The utterance (stored whole, however long).
            timestamp: When it was said (datetime, Unix seconds, or a date string).
            turn_id: Your own id for the turn, kept in every memory's provenance.

        Returns:
            The stored `Turn`.

        Raises:
            InvalidInputError: An argument is empty, of the wrong type, or a duplicate turn id.
        """
        return self.add_turns(
            [
                {
                    "user_id": user_id,
                    "session_id": session_id,
                    "role": role,
                    "text": text,
                    "timestamp": timestamp,
                    "turn_id": turn_id,
                }
            ]
        )[0]

    def add_turns(self, turns: Iterable[dict[str, Any]]) -> list[Turn]:
        """Store many turns in one transaction (all or none).

        Args:
            turns: Dicts with the keyword arguments of `add_turn` (`user_id`, `session_id`,
                `role`, `text`, optional `timestamp`, `turn_id`).

        Returns:
            The stored turns, in order.
        """
        self._open()
        if isinstance(turns, (str, bytes, dict)) or not isinstance(turns, Iterable):
            raise InvalidInputError(
                f"turns must be an iterable of dicts, got {type(turns).__name__}"
            )
        records = []
        for t in turns:
            if not isinstance(t, dict):
                raise InvalidInputError(f"each turn must be a dict, got {type(t).__name__}")
            unknown = set(t) - {"user_id", "session_id", "role", "text", "timestamp", "turn_id"}
            if unknown:
                raise InvalidInputError(f"unknown turn fields: {sorted(unknown)}")
            records.append(
                self._turn_record(
                    t.get("user_id"),
                    t.get("session_id"),
                    t.get("role"),
                    t.get("text"),
                    t.get("timestamp"),
                    t.get("turn_id"),
                )
            )
        stored = self.store.add_turns(records)
        self._index_turns(stored)
        self._auto_end(stored)
        return stored

    def _auto_end(self, stored: Sequence[Turn]) -> None:
        """End sessions that hit the turn cap or went idle (never fails the write)."""
        cfg = self.config
        if cfg.sessions.max_turns is None and cfg.sessions.idle_seconds is None:
            return
        done: set[tuple[str, str]] = set()
        for turn in stored:
            key = (turn.user_id, turn.session_id)
            try:
                if cfg.sessions.max_turns is not None and key not in done:
                    info = self.store.session(*key)
                    if info is not None and info.n_turns >= cfg.sessions.max_turns:
                        self.end_session(*key)
                        done.add(key)
                if cfg.sessions.idle_seconds is not None and turn.timestamp is not None:
                    for info in self.store.sessions(turn.user_id, status="open"):
                        other = (info.user_id, info.session_id)
                        last = info.last_time
                        if other == key or other in done or last is None:
                            continue
                        if not _comparable(last, turn.timestamp):
                            continue
                        idle = (turn.timestamp - last).total_seconds()
                        if idle > cfg.sessions.idle_seconds:
                            self.end_session(*other)
                            done.add(other)
            except Exception:  # the turns are committed; memory building can be retried
                logger.exception("automatic end of session failed for %s", key)

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
    ) -> Retrieval:
        """Rank a user's memories for a query and return what the reader should see.

        By default (`config.passages.enabled`) retrieval is small-to-big: every indexed key (turns,
        segments, topics, notes) is ranked, the ranking is resolved to turns (each unit votes
        for the turns it was built from; see `reflective_memory.passages`), and:

        * with `budget_tokens`, the best turns are packed into `passage` memories, one per
          session (date header once, the chosen turns in order, `…` between runs), until the
          budget is full; headers and role labels count against it, no turn appears twice;
        * with only `k`, the hits are the top `k` turns (each turn's stored `turn` memory).

        A passage is a `Memory` with `granularity="passage"`: its `turn_ids` are the turns it
        holds, `metadata["positions"]` their places in the session and `metadata["sources"]`
        the ids of the indexed units that voted for them. Passages are built per call and not
        stored (`get_memory` does not know their ids). With `config.passages.enabled=False` or
        `views`,
        the ranked units themselves are returned.

        Args:
            user_id: Whose memories to search (an unknown user gets an empty result).
            query: The query text.
            k: Number of hits (may be as large as the user's memory count). Defaults to
                `config.search.default_k` when `budget_tokens` is not given either.
            budget_tokens: Pack hits in rank order while their texts fit this many tokens
                (counted by `reflective_memory.llm.count_tokens`: one per word or punctuation
                mark); a hit that does not fit is skipped and smaller later hits may still fill
                the budget. With `k` too, at most `k` hits.
            mode: Override `config.search.mode` (`hybrid`, `dense` or `lexical`).
            recall: RF-Mem settings for this call: a `RecallConfig`, or a dict of fields that
                override `config.recall` (e.g. `{"mode": "familiarity"}` or `{"alpha": 0.3}`).
            views: Memory kinds to search (override `config.search.views`), e.g.
                `("note", "segment")`; one ranking across them shares `k` / the budget, and
                the hits are those units themselves (no passages).
            reflect: Override `config.conditional.self_reflection`: let the LLM judge the hits and
                retrieve
                again with its keywords (`diagnostics["reflection"]` shows every round).
            explore: Sample the reranked top-M with Gumbel noise (for learning from feedback);
                defaults to `config.rerank.explore`.

        Returns:
            The ranked `Retrieval`. Its diagnostics hold `mode`, the dense `path` taken
            (`familiarity` / `recollection`; `lexical` in lexical mode), the gate's
            `mean_score` and `entropy`, recollection `rounds` and `hits_per_round`, the full
            RF-Mem record under `recall`, candidate counts and timings in ms.
        """
        self._open()
        t_start = time.perf_counter()
        check_id("user_id", user_id)
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
        if not query.strip():
            raise InvalidInputError("query must not be empty or whitespace")
        check_encodable("query", query)
        k = check_positive("k", k)
        budget_tokens = check_positive("budget_tokens", budget_tokens)
        mode = self.config.search.mode if mode is None else mode
        if mode not in ("hybrid", "dense", "lexical"):
            raise InvalidInputError(f"mode must be hybrid, dense or lexical, got {mode!r}")
        if recall is None:
            rcfg = self.config.recall
        elif isinstance(recall, RecallConfig):
            rcfg = recall
        elif isinstance(recall, dict):
            rcfg = self.config.recall.replace(**recall)
        else:
            raise InvalidInputError(
                f"recall must be a RecallConfig, a dict or None, got {type(recall).__name__}"
            )
        if k is None and budget_tokens is None:
            k = self.config.search.default_k
        views = self.config.search.views if views is None else tuple(views)
        if views is not None and (not views or any(v not in GRANULARITIES for v in views)):
            raise InvalidInputError(f"views must name kinds from {GRANULARITIES}, got {views!r}")
        if self.config.conditional.self_reflection if reflect is None else reflect:
            kw = {"k": k, "budget_tokens": budget_tokens, "mode": mode, "views": views}
            kw["explore"] = explore
            kw["recall"] = rcfg
            return self._reflective_retrieve(user_id, query, kw, t_start)
        timings: dict[str, float] = {}
        diagnostics: dict[str, Any] = {
            "mode": mode,
            "path": "lexical" if mode == "lexical" else "empty",
            "timings_ms": timings,
        }
        if views is not None:
            diagnostics["views"] = list(views)
        rid = uuid.uuid4().hex
        if self.store.version(user_id) == 0:
            diagnostics["index_size"] = 0
            timings["total"] = (time.perf_counter() - t_start) * 1000
            return Retrieval(user_id, query, [], diagnostics, retrieval_id=rid)

        t0 = time.perf_counter()
        index = self.indexes.get(user_id)
        timings["index"] = (time.perf_counter() - t0) * 1000
        diagnostics["index_size"] = len(index)
        if len(index) == 0:
            timings["total"] = (time.perf_counter() - t_start) * 1000
            return Retrieval(user_id, query, [], diagnostics, retrieval_id=rid)

        speaker = None
        if self.config.passages.enabled and views is None:
            speaker, query_text = self._speaker_focus(user_id, index, query, diagnostics)
        else:
            query_text = query
        qvec = None
        if mode != "lexical":
            t0 = time.perf_counter()
            qvec = self.embedder.encode(query_text[: self.config.units.embed_max_chars])
            timings["embed"] = (time.perf_counter() - t0) * 1000

        want = self._wanted(index, k, budget_tokens)
        n = min(len(index), max(want, self.config.search.candidate_k, self.config.rerank.top_k))
        explore = self.config.rerank.explore if explore is None else bool(explore)
        if mode != "lexical":
            rcfg = self._calibrated(index, rcfg, diagnostics)
        record = None
        while True:
            order, scores = rank_candidates(
                index, query_text, qvec, n, mode, rcfg, self.config.search, timings, diagnostics
            )
            if self.config.rerank.enabled:
                t0 = time.perf_counter()
                if qvec is None:
                    qvec = self.embedder.encode(query_text[: self.config.units.embed_max_chars])
                order, scores, record = self.rerank_stage.apply(
                    user_id,
                    index,
                    qvec,
                    order,
                    scores,
                    explore=explore,
                    retrieval_id=rid,
                    query=query_text,
                    fetch=lambda ids: self.store.memories(user_id, ids),
                )
                if record is not None:
                    diagnostics["rerank"] = record.as_diagnostics()
                timings["rerank"] = (time.perf_counter() - t0) * 1000
            if self.config.passages.enabled and views is None:
                hits, filled = self._pack_passages(
                    user_id,
                    query,
                    index,
                    order,
                    scores,
                    k,
                    budget_tokens,
                    timings,
                    diagnostics,
                    speaker=speaker,
                )
            else:
                hits, filled = pack_hits(
                    lambda ids: self.store.memories(user_id, ids),
                    index,
                    order,
                    scores,
                    k,
                    budget_tokens,
                    timings,
                    views,
                    count=self._count,
                )
            if filled or n >= len(index):
                break
            n = min(len(index), n * 4)
        timings["total"] = (time.perf_counter() - t_start) * 1000
        return Retrieval(user_id, query, hits, diagnostics, retrieval_id=rid, rerank=record)

    # -- listing and deletion -------------------------------------------------------------
    async def aadd_turn(
        self, user_id: str, session_id: str, role: str, text: str, **kw: Any
    ) -> Turn:
        """Async twin of `add_turn`."""
        return await asyncio.to_thread(self.add_turn, user_id, session_id, role, text, **kw)

    async def aend_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Async twin of `end_session`."""
        return await asyncio.to_thread(self.end_session, user_id, session_id)

    async def aretrieve(self, user_id: str, query: str, **kw: Any) -> Retrieval:
        """Async twin of `retrieve`."""
        return await asyncio.to_thread(self.retrieve, user_id, query, **kw)

    # -- feedback (RMM) --------------------------------------------------------------------
    # Forwarding façade of `self.rerank_stage` (`reflective_memory.rmm.feedback.RerankStage`).
    def reranker(self, user_id: str) -> Reranker | PersonalReranker | None:
        """The reranker serving `user_id` (None with `config.rerank.enabled` off).

        With scope `user` a `PersonalReranker` (the prior shared by the users plus the user's
        offsets), `shared` the prior itself, `isolated` the user's own `Reranker`.
        """
        self._open()
        check_id("user_id", user_id)
        return self.rerank_stage.reranker(user_id) if self.config.rerank.enabled else None

    def rerank_texts(
        self,
        user_id: str,
        query: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str | None] | None = None,
        top_n: int | None = None,
        explore: bool = False,
        keep_order: bool = False,
        reranker: CallerReranker | None = None,
    ) -> RankedTexts:
        """Rerank texts from any retriever with the user's citation-trained reranker.

        The reranker `retrieve` applies orders the texts (by cosine with reranking off); give
        the result to `feedback` with the answer that cited them (`[i]` names
        `result.order[i]`) and the same reranker learns. See `RerankStage.rerank_texts` for
        the arguments.

        Example:
            >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
            >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
            >>> ranked = mem.rerank_texts("ana", "why do dogs bark", ["cats purr", "dogs bark"])
            >>> ranked.order
            (1, 0)
            >>> mem.feedback(ranked, "Dogs bark to warn. [0]").rewards
            {'1': 1.0, '0': -1.0}
        """
        self._open()
        return self.rerank_stage.rerank_texts(
            user_id,
            query,
            texts,
            ids=ids,
            top_n=top_n,
            explore=explore,
            keep_order=keep_order,
            reranker=reranker,
        )

    def feedback(
        self,
        shown: Retrieval | RankedTexts | RerankRecord,
        answer: str | None = None,
        *,
        cited: Sequence[int] | None = None,
        numbering: Mapping[int, int | None] | None = None,
    ) -> FeedbackResult:
        """Learn from which shown memories (or texts) an answer used.

        Citations (`[0]`, `[0, 2]`, `[NO_CITE]`, ...) refer to positions in `retrieval.hits`, as
        numbered by `reflective_memory.rmm.citations.build_answer_prompt(query, retrieval.hits)`,
        or to the texts `rerank_texts` showed, best first. Each shown item that came from the
        reranked candidates gets reward +1 if cited and -1 if not; the episode trains the
        reranker that ranked (one update per `config.rerank.batch_size` episodes), which is
        then saved with the store.

        Args:
            shown: The `Retrieval` the answer was generated from, or the `RankedTexts` (or its
                `RerankRecord`) of `rerank_texts`.
            answer: The LLM's answer text; if it has no citation marker and
                `config.rerank.attribution_fallback` is on, used items are inferred by
                embedding similarity (`config.rerank.attribution_threshold`) and the result is
                marked `inferred`.
            cited: The cited positions, given directly instead of an answer.
            numbering: What each citation number names, when the answer numbered something
                else than the shown list: number -> shown position (None: not shown). E.g.
                sources numbered from 1, several of them pieces of one shown text.

        Returns:
            A `FeedbackResult` saying what was learned, or why nothing was (`reason`: e.g.
            reranking is off, the answer cites nothing readable, the memories changed). Only
            the answer is read: an answer that echoes the prompt's instructions or its memory
            blocks back (`reflective_memory.rmm.citations.echoes_instructions`) teaches
            nothing.

        Raises:
            InvalidInputError: Neither `answer` nor `cited` given, a cited position names
                nothing, or `shown` is none of the types above.
        """
        self._open()
        return self.rerank_stage.feedback(
            shown, answer, cited, self.indexes.get, numbering=numbering
        )

    async def afeedback(
        self,
        shown: Retrieval | RankedTexts | RerankRecord,
        answer: str | None = None,
        *,
        cited: Sequence[int] | None = None,
        numbering: Mapping[int, int | None] | None = None,
    ) -> FeedbackResult:
        """Async twin of `feedback`."""
        return await asyncio.to_thread(
            self.feedback, shown, answer, cited=cited, numbering=numbering
        )
