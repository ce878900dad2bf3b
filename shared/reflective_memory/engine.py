"""`ReflectiveMemory`: the orchestrator every adapter calls.

Write path: `add_turn` commits a turn at once; `end_session` turns a session into memory units
(turns, whole sessions or topical segments), embeds their keys and indexes them.
Read path: `retrieve` ranks a user's memories for a query (RF-Mem adaptive dense retrieval, fused
with BM25 by reciprocal rank) and cuts the ranking to `k` hits or a token budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.conditional.notes import NOTE_GRANULARITY, build_note_drafts
from reflective_memory.conditional.reflection import reflective_retrieve
from reflective_memory.config import MemoryConfig
from reflective_memory.denoise import Denoiser, denoiser_name, make_denoiser
from reflective_memory.embed import Embedder, default_embedder
from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    StoreClosedError,
    UnknownMemoryError,
    UnknownSessionError,
)
from reflective_memory.llm import LLMClient, as_llm
from reflective_memory.ranking import FusionWeights, pack_hits, rank_candidates
from reflective_memory.recall import RecallConfig
from reflective_memory.rmm.feedback import FeedbackResult, RerankStage
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, StoreTopicBank
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.storage.index import IndexCache
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.text import parse_timestamp
from reflective_memory.types import GRANULARITIES, Memory, Retrieval, Turn, Usage
from reflective_memory.units import BASE_UNITS, build_units, denoise_drafts, raw_key, source_turns
from reflective_memory.validation import check_id, check_positive

__all__ = ["ReflectiveMemory"]

logger = logging.getLogger(__name__)


def _comparable(a: datetime, b: datetime) -> bool:
    return (a.tzinfo is None) == (b.tzinfo is None)


class ReflectiveMemory:
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
            `config.segmenter`; `auto` is the LLM segmenter when `llm` is given, else the offline
            embedding segmenter).
        denoiser: Denoises memory keys before indexing (SeCom compression): `"none"`,
            `"offline"`, `"llmlingua"` or any object with `denoise(texts)` (see
            `reflective_memory.denoise.Denoiser`). `None` uses `config.denoiser`. Only keys are denoised;
            the LLM always gets the raw text. After changing it, `redenoise(user_id)` re-keys
            a user's existing memories.

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
    ) -> None:
        self.config = (config if config is not None else MemoryConfig()).validate()
        self.path = None if path is None else Path(path)
        if self.path is not None:
            if self.path.exists() and not self.path.is_dir():
                raise InvalidInputError(f"path {str(self.path)!r} exists and is not a directory")
            self.path.mkdir(parents=True, exist_ok=True)
        self.store = SQLiteStore(None if self.path is None else self.path / "memory.sqlite3")
        self.embedder: Embedder = embedder if embedder is not None else default_embedder()
        self.llm: LLMClient | None = as_llm(llm)
        self.segmenter: Segmenter = (
            segmenter
            if segmenter is not None
            else segmenter_from_config(self.config, self.embedder, self.llm)
        )
        cfg = self.config
        self.denoiser: Denoiser | None = make_denoiser(
            cfg.denoiser if denoiser is None else denoiser,
            rate=cfg.denoise_rate,
            model=cfg.denoiser_model,
            device=cfg.denoiser_device,
        )
        self.indexes = IndexCache(
            self.store,
            self.embedder,
            None if self.path is None else self.path / "index",
            batch_size=self.config.embed_batch_size,
            ann=self.config.ann_settings(),
        )
        # RMM: prospective reflection needs an LLM and the option; the reranker stage is local.
        self.reflector: ProspectiveReflector | None = None
        if self.llm is not None and self.config.prospective_reflection:
            self.reflector = ProspectiveReflector(
                self.llm,
                merge_k=self.config.topic_merge_k,
                speakers=self.config.topic_speakers,
                date_prefix=self.config.date_prefix,
            )
        self._fusion = FusionWeights(cfg.dense_weight, cfg.lexical_weight, cfg.rrf_k)
        self.rerank_stage = RerankStage(
            self.config, self.embedder, None if self.path is None else self.path / "rerankers"
        )

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
        check_id("role", role)
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInputError("text must not be empty or whitespace")
        if len(text) > self.config.max_text_chars:
            raise InvalidInputError(
                f"text has {len(text)} characters, more than max_text_chars="
                f"{self.config.max_text_chars}"
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
        self._auto_end(stored)
        return stored

    def _auto_end(self, stored: Sequence[Turn]) -> None:
        """End sessions that hit the turn cap or went idle (never fails the write)."""
        cfg = self.config
        if cfg.max_session_turns is None and cfg.session_idle_seconds is None:
            return
        done: set[tuple[str, str]] = set()
        for turn in stored:
            key = (turn.user_id, turn.session_id)
            try:
                if cfg.max_session_turns is not None and key not in done:
                    info = self.store.session(*key)
                    if info is not None and info.n_turns >= cfg.max_session_turns:
                        self.end_session(*key)
                        done.add(key)
                if cfg.session_idle_seconds is not None and turn.timestamp is not None:
                    for info in self.store.sessions(turn.user_id, status="open"):
                        other = (info.user_id, info.session_id)
                        last = info.last_time
                        if other == key or other in done or last is None:
                            continue
                        if not _comparable(last, turn.timestamp):
                            continue
                        idle = (turn.timestamp - last).total_seconds()
                        if idle > cfg.session_idle_seconds:
                            self.end_session(*other)
                            done.add(other)
            except Exception:  # the turns are committed; memory building can be retried
                logger.exception("automatic end of session failed for %s", key)

    def end_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Turn a session's turns into memories and index them.

        Ending a session again (for instance after more turns arrived) rebuilds its units.

        Args:
            user_id: Owner.
            session_id: The session.

        Returns:
            The memories built from the session.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        if self.store.session(user_id, session_id) is None:
            raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
        turns = self.store.turns(user_id, session_id)
        drafts = build_units(
            turns, self.config.granularities, self.segmenter, date_prefix=self.config.date_prefix
        )
        self.denoise_keys(user_id, drafts)
        vectors = self._embed_keys([d.key for d in drafts])
        memories = self.store.replace_session_memories(
            user_id, session_id, BASE_UNITS, drafts, vectors, self.embedder.name
        )
        if self.config.conditional_memory:
            memories = memories + self._store_notes(user_id, session_id, turns)
        if self.reflector is not None:
            memories = memories + self._reflect(user_id, session_id, turns)
        logger.info(
            "session %s of user %s: %d turns -> %d memories",
            session_id,
            user_id,
            len(turns),
            len(memories),
        )
        return memories

    def _store_notes(self, user_id: str, session_id: str, turns: Sequence[Turn]) -> list[Memory]:
        """Build, embed and store a session's conditional-memory notes, replacing any it had."""
        usage = Usage()
        drafts, diag = build_note_drafts(
            turns,
            self.llm,
            date_prefix=self.config.date_prefix,
            max_prompt_chars=self.config.note_prompt_chars,
            usage=usage,
        )
        vectors = self._embed_keys([d.key for d in drafts])
        stored = self.store.replace_session_memories(
            user_id, session_id, (NOTE_GRANULARITY,), drafts, vectors, self.embedder.name
        )
        logger.info(
            "session %s of user %s: %d user turns -> %d notes (%d llm calls, %d failed)",
            session_id,
            user_id,
            diag["user_turns"],
            len(stored),
            diag["calls"],
            diag["failed_calls"],
        )
        return stored

    def _reflective_retrieve(
        self, user_id: str, query: str, retrieve_kwargs: dict[str, Any], t_start: float
    ) -> Retrieval:
        """Self-reflection retrieval (conditional memory): re-query with the LLM's keywords."""
        out = reflective_retrieve(
            lambda q: self.retrieve(user_id, q, reflect=False, **retrieve_kwargs),
            query,
            self.llm,
            rounds=self.config.self_reflection_rounds,
            k=retrieve_kwargs.get("k"),
            budget_tokens=retrieve_kwargs.get("budget_tokens"),
            user_id=user_id,
        )
        out.diagnostics["timings_ms"] = dict(out.diagnostics.get("timings_ms", {}))
        out.diagnostics["timings_ms"]["total"] = (time.perf_counter() - t_start) * 1000
        return out

    def _reflect(self, user_id: str, session_id: str, turns: Sequence[Turn]) -> list[Memory]:
        """RMM prospective reflection of a finished session; never fails `end_session`.

        Returns the topic memories added or updated. The report (counts and LLM usage) is kept
        in the store under `rmm.reflection/<user>/<session>`.
        """
        assert self.reflector is not None
        bank = StoreTopicBank(self.store, self.indexes, self._embed_keys, self.embedder.name)
        try:
            report = self.reflector.reflect(user_id, session_id, turns, bank)
        except Exception:  # session units are committed; topics can be rebuilt later
            logger.exception("prospective reflection failed for session %s", session_id)
            report = ReflectionReport()
        try:
            self.store.set_value(f"rmm.reflection/{user_id}/{session_id}", report.as_dict())
        except Exception:
            logger.exception("could not record the reflection report")
        return list(bank.saved)

    def reflection_report(self, user_id: str, session_id: str) -> dict[str, Any] | None:
        """The last prospective-reflection report of a session (counts and LLM usage)."""
        self._open()
        return self.store.get_value(f"rmm.reflection/{user_id}/{session_id}")

    def _embed_keys(self, keys: list[str]) -> np.ndarray:
        cut = [k[: self.config.embed_max_chars] for k in keys]
        if not cut:
            return np.zeros((0, self.embedder.dim), np.float32)
        bs = max(self.config.embed_batch_size, 1) * 16
        parts = [self.embedder.encode(cut[i : i + bs]) for i in range(0, len(cut), bs)]
        return np.vstack(parts).astype(np.float32)

    # -- key denoising (SeCom compression) -------------------------------------------------
    def build_units(self, turns: Sequence[Turn]) -> list[MemoryDraft]:
        """Memory units of one session for every configured granularity (not yet stored)."""
        return build_units(
            turns, self.config.granularities, self.segmenter, date_prefix=self.config.date_prefix
        )

    def denoise_keys(self, user_id: str, drafts: Sequence[MemoryDraft]) -> None:
        """Replace each draft's key by its denoised form, in place (texts stay raw)."""
        denoise_drafts(
            self.denoiser, drafts, lambda: [t.text for t in self.store.turns(user_id)], user_id
        )

    def redenoise(self, user_id: str, *, only_stale: bool = False) -> int:
        """Re-key and re-embed a user's turn, session and segment units with the current denoiser.

        Call this after changing the denoiser (or to refresh keys with statistics of the
        user's whole history): each key is rebuilt from the stored raw turns, denoised, embedded
        and written back in one transaction; ids, texts, times and provenance are unchanged.
        Memories of other kinds (e.g. summaries) keep their keys.

        Args:
            user_id: Whose memories to re-key.
            only_stale: Only memories whose recorded `key_denoiser` differs from the current one.

        Returns:
            The number of memories re-keyed.
        """
        self._open()
        check_id("user_id", user_id)
        current = denoiser_name(self.denoiser)
        by_session: dict[str, list[Memory]] = {}
        for mem in self.store.memories(user_id):
            if mem.granularity not in BASE_UNITS:
                continue
            if only_stale and mem.metadata.get("key_denoiser", "none") == current:
                continue
            by_session.setdefault(mem.session_id, []).append(mem)
        todo: list[Memory] = []
        sources: list[str] = []
        for session_id, mems in by_session.items():
            turns = self.store.turns(user_id, session_id)
            for mem in mems:
                src = source_turns(mem, turns)
                if src is None:
                    logger.warning("cannot rebuild the key of memory %s; left as is", mem.id)
                    continue
                todo.append(mem)
                sources.append(raw_key(src))
        if not todo:
            return 0
        drafts = [
            MemoryDraft(
                session_id=m.session_id,
                granularity=m.granularity,
                text=m.text,
                key=src,
                turn_ids=m.turn_ids,
                start_time=m.start_time,
                end_time=m.end_time,
                metadata=dict(m.metadata),
                id=m.id,
            )
            for m, src in zip(todo, sources, strict=True)
        ]
        self.denoise_keys(user_id, drafts)
        vectors = self._embed_keys([d.key for d in drafts])
        self.store.upsert_memories(user_id, drafts, vectors, self.embedder.name)
        self.indexes.invalidate(user_id)
        logger.info("re-keyed %d memories of user %s with %s", len(drafts), user_id, current)
        return len(drafts)

    # -- read path ------------------------------------------------------------------------
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
        """Rank a user's memories for a query.

        Args:
            user_id: Whose memories to search (an unknown user gets an empty result).
            query: The query text.
            k: Number of hits (may be as large as the user's memory count). Defaults to
                `config.default_k` when `budget_tokens` is not given either.
            budget_tokens: Pack hits in rank order while their texts fit this many tokens
                (counted by `reflective_memory.llm.count_tokens`: one per word or punctuation mark); a
                hit that does not fit is skipped and smaller later hits may still fill the
                budget. With `k` too, at most `k` hits.
            mode: Override `config.retrieval_mode` (`hybrid`, `dense` or `lexical`).
            recall: RF-Mem settings for this call: a `RecallConfig`, or a dict of fields that
                override `config.recall` (e.g. `{"mode": "familiarity"}` or `{"alpha": 0.3}`).
            views: Memory kinds to search (override `config.retrieval_views`), e.g.
                `("note", "segment")`; one ranking across them shares `k` / the budget.
            reflect: Override `config.self_reflection`: let the LLM judge the hits and retrieve
                again with its keywords (`diagnostics["reflection"]` shows every round).
            explore: Sample the reranked top-M with Gumbel noise (for learning from feedback);
                defaults to `config.rerank_explore`.

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
        k = check_positive("k", k)
        budget_tokens = check_positive("budget_tokens", budget_tokens)
        mode = self.config.retrieval_mode if mode is None else mode
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
            k = self.config.default_k
        views = self.config.retrieval_views if views is None else tuple(views)
        if views is not None and (not views or any(v not in GRANULARITIES for v in views)):
            raise InvalidInputError(f"views must name kinds from {GRANULARITIES}, got {views!r}")
        if self.config.self_reflection if reflect is None else reflect:
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

        qvec = None
        if mode != "lexical":
            t0 = time.perf_counter()
            qvec = self.embedder.encode(query[: self.config.embed_max_chars])
            timings["embed"] = (time.perf_counter() - t0) * 1000

        want = k if k is not None else max(1, budget_tokens // 50)  # type: ignore[operator]
        n = min(len(index), max(want, self.config.candidate_k, self.config.rerank_top_k))
        explore = self.config.rerank_explore if explore is None else bool(explore)
        while True:
            order, scores = rank_candidates(
                index, query, qvec, n, mode, rcfg, self._fusion, timings, diagnostics
            )
            if self.config.rerank:
                t0 = time.perf_counter()
                if qvec is None:
                    qvec = self.embedder.encode(query[: self.config.embed_max_chars])
                order, scores = self.rerank_stage.apply(
                    user_id,
                    index,
                    qvec,
                    order,
                    scores,
                    explore=explore,
                    retrieval_id=rid,
                    diagnostics=diagnostics,
                    query=query,
                    fetch=lambda ids: self.store.memories(user_id, ids),
                )
                timings["rerank"] = (time.perf_counter() - t0) * 1000
            hits, filled = pack_hits(
                lambda ids: self.store.memories(user_id, ids),
                index,
                order,
                scores,
                k,
                budget_tokens,
                timings,
                views,
            )
            if filled or n >= len(index):
                break
            n = min(len(index), n * 4)
        timings["total"] = (time.perf_counter() - t_start) * 1000
        return Retrieval(user_id, query, hits, diagnostics, retrieval_id=rid)

    # -- feedback (RMM retrospective reflection) -------------------------------------------
    def feedback(
        self,
        retrieval: Retrieval,
        answer: str | None = None,
        *,
        cited: Sequence[int] | None = None,
    ) -> FeedbackResult:
        """Learn from which retrieved memories an answer used.

        Citations (`[0]`, `[0, 2]`, `[NO_CITE]`, ...) refer to positions in `retrieval.hits`, as
        numbered by `reflective_memory.rmm.citations.build_answer_prompt(query, retrieval.hits)`. Each hit that
        came from the reranked candidates gets reward +1 if cited and -1 if not; the episode
        trains the reranker serving the retrieval's user (one update per `rerank_batch_size`
        episodes), which is then saved under the store directory.

        Args:
            retrieval: The `Retrieval` the answer was generated from.
            answer: The LLM's answer text; if it has no citation marker and
                `config.attribution_fallback` is on, used memories are inferred by embedding
                similarity (`config.attribution_threshold`) and the result is marked `inferred`.
            cited: The cited hit positions, given directly instead of an answer.

        Returns:
            A `FeedbackResult` saying what was learned (or why nothing was).

        Raises:
            InvalidInputError: Neither `answer` nor `cited` given, or a cited position is no hit.
            ConfigError: The reranker is disabled (`config.rerank` is False).
        """
        self._open()
        if not self.config.rerank:
            raise ConfigError("feedback trains the reranker; enable config.rerank")
        return self.rerank_stage.feedback(retrieval, answer, cited, self.indexes.get)

    async def afeedback(
        self,
        retrieval: Retrieval,
        answer: str | None = None,
        *,
        cited: Sequence[int] | None = None,
    ) -> FeedbackResult:
        """Async twin of `feedback`."""
        return await asyncio.to_thread(self.feedback, retrieval, answer, cited=cited)

    # -- listing and deletion -------------------------------------------------------------
    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns of a user, or of one session, in order (unknown ids give `[]`)."""
        self._open()
        check_id("user_id", user_id)
        if session_id is not None:
            check_id("session_id", session_id)
        return self.store.turns(user_id, session_id)

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """A user's memories (all of them, or the given ids in that order)."""
        self._open()
        check_id("user_id", user_id)
        return self.store.memories(user_id, ids)

    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the user's sessions that have turns not yet turned into memories."""
        self._open()
        check_id("user_id", user_id)
        return [s.session_id for s in self.store.sessions(user_id, status="open")]

    def delete_user(self, user_id: str) -> int:
        """Delete every turn and memory of a user; return the number of turns deleted."""
        self._open()
        check_id("user_id", user_id)
        n = self.store.delete_user(user_id)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget(user_id)
        return n

    def delete_session(self, user_id: str, session_id: str) -> int:
        """Delete a session's turns and memories; return the number of turns deleted.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        n = self.store.delete_session(user_id, session_id)
        self.indexes.invalidate(user_id)
        return n

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """Delete some turns of a session (all of them when `turn_ids` is None).

        The session's memories stay as they are until the session is ended again, which
        rebuilds them from the turns that remain. Unknown turn ids are ignored.

        Returns:
            The deleted turns, in order.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        if turn_ids is not None:
            if isinstance(turn_ids, str):
                raise InvalidInputError("turn_ids must be a list of turn ids, not a str")
            turn_ids = [check_id("turn_id", t) for t in turn_ids]
        return self.store.delete_turns(user_id, session_id, turn_ids)

    def put_memory(
        self,
        user_id: str,
        text: str,
        *,
        memory_id: str | None = None,
        key: str | None = None,
        granularity: str = "item",
        session_id: str = "",
        turn_ids: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
    ) -> Memory:
        """Store (or replace, by id) one memory written directly rather than built from turns.

        Framework stores (a LangGraph `BaseStore`, say) keep their items this way. The memory is
        indexed like any other and found by `retrieve`.

        Args:
            user_id: Owner.
            text: What an LLM should read.
            memory_id: Replace the memory with this id if it exists (else a new id is made).
            key: Text to index (default: `text`).
            granularity: Unit kind; `item` unless it is a `topic` or `note` written elsewhere.
            session_id: Session it came from, if any.
            turn_ids: Source turn ids, if any.
            metadata: JSON-serialisable extra fields.

        Returns:
            The stored memory.
        """
        self._open()
        check_id("user_id", user_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("text must be a non-empty str")
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise InvalidInputError("key must be None or a non-empty str")
        if granularity not in GRANULARITIES:
            raise InvalidInputError(f"granularity must be one of {GRANULARITIES}")
        if memory_id is not None:
            check_id("memory_id", memory_id)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise InvalidInputError("metadata must be a dict")
            try:
                json.dumps(metadata)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(f"metadata is not JSON-serialisable: {exc}") from exc
        key = text if key is None else key
        draft = MemoryDraft(
            session_id=session_id,
            granularity=granularity,
            text=text,
            key=key,
            turn_ids=tuple(turn_ids),
            metadata=dict(metadata) if metadata is not None else {},
            id=memory_id,
        )
        (stored,) = self.store.upsert_memories(
            user_id, [draft], self._embed_keys([key]), self.embedder.name
        )
        return stored

    def get_memory(self, user_id: str, memory_id: str) -> Memory:
        """One memory of a user by id.

        Raises:
            UnknownMemoryError: The user has no memory with that id.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("memory_id", memory_id)
        found = self.store.memories(user_id, [memory_id])
        if not found:
            raise UnknownMemoryError(f"user {user_id!r} has no memory {memory_id!r}")
        return found[0]

    def delete_memory(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory of a user; return whether it existed."""
        self._open()
        check_id("user_id", user_id)
        check_id("memory_id", memory_id)
        return self.store.delete_memories(user_id, [memory_id]) > 0

    def users(self) -> list[str]:
        """Every user with stored turns or memories."""
        self._open()
        return self.store.users()

    def stats(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions (open ones too) and memories by granularity."""
        self._open()
        check_id("user_id", user_id)
        return self.store.count(user_id)

    # -- async twins ----------------------------------------------------------------------
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
