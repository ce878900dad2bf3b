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
from reflective_memory.denoise import Denoiser, denoiser_name, fitted_on, make_denoiser
from reflective_memory.embed import Embedder, default_embedder
from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    ModelLoadError,
    StoreClosedError,
    UnknownMemoryError,
    UnknownSessionError,
)
from reflective_memory.llm import LLMClient, as_llm, count_tokens
from reflective_memory.recall import RecallConfig
from reflective_memory.recall import recall as rf_recall
from reflective_memory.rmm.feedback import FeedbackResult, RerankStage
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, StoreTopicBank
from reflective_memory.segment.base import Segmenter, check_spans
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.storage.index import IndexCache, UserIndex
from reflective_memory.storage.sqlite import MemoryDraft, SQLiteStore
from reflective_memory.text import format_date, parse_timestamp
from reflective_memory.types import GRANULARITIES, Hit, Memory, Retrieval, Turn, Usage

__all__ = ["ReflectiveMemory"]

logger = logging.getLogger(__name__)

_BASE_UNITS = ("turn", "session", "segment")
_MAX_ID_CHARS = 512


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    if len(value) > _MAX_ID_CHARS:
        raise InvalidInputError(f"{name} is longer than {_MAX_ID_CHARS} characters")
    return value


def _check_positive(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def _comparable(a: datetime, b: datetime) -> bool:
    return (a.tzinfo is None) == (b.tzinfo is None)


def _raw_key(turns: Sequence[Turn]) -> str:
    """The undenoised key of a unit: its turns' texts, one per line."""
    return "\n".join(t.text for t in turns)


def _source_turns(mem: Memory, turns: Sequence[Turn]) -> list[Turn] | None:
    """The session turns a memory was built from (by stored positions, else by turn ids)."""
    pos = mem.metadata.get("positions")
    if (
        isinstance(pos, (list, tuple))
        and len(pos) == 2
        and all(isinstance(p, int) for p in pos)
        and 0 <= pos[0] < pos[1] <= len(turns)
    ):
        span = list(turns[pos[0] : pos[1]])
        if tuple(t.turn_id for t in span) == tuple(mem.turn_ids):
            return span
    by_id = {t.turn_id: t for t in turns}
    if mem.turn_ids and all(tid in by_id for tid in mem.turn_ids):
        return [by_id[tid] for tid in mem.turn_ids]
    return None


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
        _check_id("user_id", user_id)
        _check_id("session_id", session_id)
        _check_id("role", role)
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
            _check_id("turn_id", turn_id)
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
        _check_id("user_id", user_id)
        _check_id("session_id", session_id)
        if self.store.session(user_id, session_id) is None:
            raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
        turns = self.store.turns(user_id, session_id)
        drafts = self.build_units(turns)
        self.denoise_keys(user_id, drafts)
        vectors = self._embed_keys([d.key for d in drafts])
        memories = self.store.replace_session_memories(
            user_id, session_id, _BASE_UNITS, drafts, vectors, self.embedder.name
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

    def build_units(self, turns: Sequence[Turn]) -> list[MemoryDraft]:
        """Memory units of one session for every configured granularity (not yet stored).

        Args:
            turns: The session's turns, in order.

        Returns:
            Drafts whose `text` is the raw turns (with the session date first when known) and
            whose `key` is the text that gets indexed.
        """
        if not turns:
            return []
        drafts: list[MemoryDraft] = []
        for granularity in self.config.granularities:
            if granularity == "turn":
                spans = [(i, i + 1) for i in range(len(turns))]
            elif granularity == "session":
                spans = [(0, len(turns))]
            else:
                spans = check_spans(self.segmenter.segment(turns), len(turns))
            for start, end in spans:
                drafts.append(self._draft(granularity, turns[start:end], turns[0].timestamp))
        return drafts

    def _draft(
        self, granularity: str, turns: Sequence[Turn], session_time: datetime | None
    ) -> MemoryDraft:
        body = "\n".join(f"{t.role}: {t.text}" for t in turns)
        date = format_date(session_time) if self.config.date_prefix else ""
        text = f"[{date}]\n{body}" if date else body
        key = _raw_key(turns)
        times = [t.timestamp for t in turns if t.timestamp is not None]
        return MemoryDraft(
            session_id=turns[0].session_id,
            granularity=granularity,
            text=text,
            key=key,
            turn_ids=tuple(t.turn_id for t in turns),
            start_time=times[0] if times else None,
            end_time=times[-1] if times else None,
            metadata={"positions": [turns[0].position, turns[-1].position + 1]},
        )

    # -- key denoising (SeCom compression) -------------------------------------------------
    def denoise_keys(self, user_id: str, drafts: Sequence[MemoryDraft]) -> None:
        """Replace each draft's key by its denoised form, in place (texts stay raw).

        The denoiser is fitted (on a copy) to all stored turns of `user_id`, so corpus
        statistics are the user's own. Each draft's metadata records the denoiser under
        `key_denoiser`. If the denoiser fails, the raw keys are kept (and recorded as `none`);
        a blank denoised key is replaced by the raw one.

        Args:
            user_id: Owner of the drafts.
            drafts: Memory drafts of that user.
        """
        if not drafts:
            return
        keys = self._denoised([d.key for d in drafts], user_id)
        name = denoiser_name(self.denoiser) if keys is not None else "none"
        for i, draft in enumerate(drafts):
            meta = dict(draft.metadata) if draft.metadata is not None else {}
            meta["key_denoiser"] = name
            draft.metadata = meta
            if keys is not None and keys[i].strip():
                draft.key = keys[i]

    def _denoised(self, sources: list[str], user_id: str) -> list[str] | None:
        """Denoised keys, or `None` when no denoiser is set or it failed."""
        if self.denoiser is None:
            return None
        try:
            fitted = self.denoiser
            if callable(getattr(fitted, "fit", None)):
                fitted = fitted_on(fitted, [t.text for t in self.store.turns(user_id)])
            keys = fitted.denoise(list(sources))
            if not isinstance(keys, list) or len(keys) != len(sources):
                raise TypeError(f"denoise returned {type(keys).__name__} for {len(sources)} texts")
            if not all(isinstance(k, str) for k in keys):
                raise TypeError("denoise returned a non-str key")
        except Exception as exc:  # keys fall back to raw text; nothing is lost
            logger.log(
                logging.ERROR if isinstance(exc, ModelLoadError) else logging.WARNING,
                "denoiser %s failed for user %s; indexing raw keys (redenoise later): %s",
                denoiser_name(self.denoiser),
                user_id,
                exc,
                exc_info=True,
            )
            return None
        return keys

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
        _check_id("user_id", user_id)
        current = denoiser_name(self.denoiser)
        by_session: dict[str, list[Memory]] = {}
        for mem in self.store.memories(user_id):
            if mem.granularity not in _BASE_UNITS:
                continue
            if only_stale and mem.metadata.get("key_denoiser", "none") == current:
                continue
            by_session.setdefault(mem.session_id, []).append(mem)
        todo: list[Memory] = []
        sources: list[str] = []
        for session_id, mems in by_session.items():
            turns = self.store.turns(user_id, session_id)
            for mem in mems:
                src = _source_turns(mem, turns)
                if src is None:
                    logger.warning("cannot rebuild the key of memory %s; left as is", mem.id)
                    continue
                todo.append(mem)
                sources.append(_raw_key(src))
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
        _check_id("user_id", user_id)
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
        if not query.strip():
            raise InvalidInputError("query must not be empty or whitespace")
        k = _check_positive("k", k)
        budget_tokens = _check_positive("budget_tokens", budget_tokens)
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
            order, scores = self._rank(index, query, qvec, n, mode, timings, diagnostics, rcfg)
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
                )
                timings["rerank"] = (time.perf_counter() - t0) * 1000
            hits, filled = self._cut(
                user_id, index, order, scores, k, budget_tokens, timings, views
            )
            if filled or n >= len(index):
                break
            n = min(len(index), n * 4)
        timings["total"] = (time.perf_counter() - t_start) * 1000
        return Retrieval(user_id, query, hits, diagnostics, retrieval_id=rid)

    def _rank(
        self,
        index: UserIndex,
        query: str,
        qvec: np.ndarray | None,
        n: int,
        mode: str,
        timings: dict[str, float],
        diagnostics: dict[str, Any],
        rcfg: RecallConfig,
    ) -> tuple[list[int], list[dict[str, float]]]:
        """Rank positions of `index`: dense (RF-Mem), lexical, or their reciprocal-rank fusion."""
        cfg = self.config
        dense_pos: np.ndarray = np.zeros(0, np.int64)
        dense_sc: np.ndarray = np.zeros(0, np.float32)
        lex_pos: np.ndarray = np.zeros(0, np.int64)
        lex_sc: np.ndarray = np.zeros(0, np.float32)
        if mode != "lexical":
            t0 = time.perf_counter()
            res = rf_recall(index.dense, qvec, n, rcfg)  # type: ignore[arg-type]
            dense_pos, dense_sc = res.positions, res.cosine
            rd = res.diagnostics()
            diagnostics["recall"] = rd
            diagnostics["ann"] = index.dense.kind
            for key in ("path", "mean_score", "entropy", "rounds", "hits_per_round"):
                diagnostics[key] = rd[key]
            timings["dense"] = (time.perf_counter() - t0) * 1000
        if mode != "dense":
            t0 = time.perf_counter()
            lex_sc, lex_pos = index.lexical.search(query, n)
            timings["lexical"] = (time.perf_counter() - t0) * 1000
        diagnostics["candidates"] = {"dense": int(len(dense_pos)), "lexical": int(len(lex_pos))}
        if mode == "dense":
            return dense_pos.tolist(), [{"dense": float(x)} for x in dense_sc]
        if mode == "lexical":
            return lex_pos.tolist(), [{"lexical": float(x)} for x in lex_sc]
        t0 = time.perf_counter()
        fused: dict[int, dict[str, float]] = {}
        for weight, name, pos, sc in (
            (cfg.dense_weight, "dense", dense_pos, dense_sc),
            (cfg.lexical_weight, "lexical", lex_pos, lex_sc),
        ):
            for rank, (p, s) in enumerate(zip(pos.tolist(), sc.tolist(), strict=True)):
                entry = fused.setdefault(p, {"fused": 0.0})
                entry[name] = float(s)
                entry["fused"] += weight / (cfg.rrf_k + rank + 1)
        order = sorted(fused, key=lambda p: (-fused[p]["fused"], -fused[p].get("dense", -1.0)))
        diagnostics["candidates"]["fused"] = len(order)
        timings["fuse"] = (time.perf_counter() - t0) * 1000
        return order, [fused[p] for p in order]

    def _cut(
        self,
        user_id: str,
        index: UserIndex,
        order: list[int],
        scores: list[dict[str, float]],
        k: int | None,
        budget: int | None,
        timings: dict[str, float],
        views: Sequence[str] | None = None,
    ) -> tuple[list[Hit], bool]:
        """Fetch memories in rank order until `k` hits or the budget is full.

        Returns the hits and whether the cut was reached (False: ran out of candidates).
        """
        t0 = time.perf_counter()
        hits: list[Hit] = []
        used = 0
        filled = False
        step = 64
        for s in range(0, len(order), step):
            chunk = order[s : s + step]
            mems = {m.id: m for m in self.store.memories(user_id, [index.ids[p] for p in chunk])}
            for j, p in enumerate(chunk):
                mem = mems.get(index.ids[p])
                if mem is None:  # deleted after the index was taken
                    continue
                if views is not None and mem.granularity not in views:
                    continue
                sc = scores[s + j]
                if budget is not None:
                    cost = count_tokens(mem.text)
                    if used + cost > budget:
                        if budget - used < 10:
                            filled = True
                            break
                        continue
                    used += cost
                main = sc.get("fused", sc.get("dense", sc.get("lexical", 0.0)))
                hits.append(Hit(mem, float(main), len(hits), dict(sc)))
                if k is not None and len(hits) >= k:
                    filled = True
                    break
            if filled:
                break
        timings["fetch"] = (time.perf_counter() - t0) * 1000
        return hits, filled

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
        _check_id("user_id", user_id)
        if session_id is not None:
            _check_id("session_id", session_id)
        return self.store.turns(user_id, session_id)

    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """A user's memories (all of them, or the given ids in that order)."""
        self._open()
        _check_id("user_id", user_id)
        return self.store.memories(user_id, ids)

    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the user's sessions that have turns not yet turned into memories."""
        self._open()
        _check_id("user_id", user_id)
        return [s.session_id for s in self.store.sessions(user_id, status="open")]

    def delete_user(self, user_id: str) -> int:
        """Delete every turn and memory of a user; return the number of turns deleted."""
        self._open()
        _check_id("user_id", user_id)
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
        _check_id("user_id", user_id)
        _check_id("session_id", session_id)
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
        _check_id("user_id", user_id)
        _check_id("session_id", session_id)
        if turn_ids is not None:
            if isinstance(turn_ids, str):
                raise InvalidInputError("turn_ids must be a list of turn ids, not a str")
            turn_ids = [_check_id("turn_id", t) for t in turn_ids]
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
        _check_id("user_id", user_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("text must be a non-empty str")
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise InvalidInputError("key must be None or a non-empty str")
        if granularity not in GRANULARITIES:
            raise InvalidInputError(f"granularity must be one of {GRANULARITIES}")
        if memory_id is not None:
            _check_id("memory_id", memory_id)
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
        _check_id("user_id", user_id)
        _check_id("memory_id", memory_id)
        found = self.store.memories(user_id, [memory_id])
        if not found:
            raise UnknownMemoryError(f"user {user_id!r} has no memory {memory_id!r}")
        return found[0]

    def delete_memory(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory of a user; return whether it existed."""
        self._open()
        _check_id("user_id", user_id)
        _check_id("memory_id", memory_id)
        return self.store.delete_memories(user_id, [memory_id]) > 0

    def users(self) -> list[str]:
        """Every user with stored turns or memories."""
        self._open()
        return self.store.users()

    def stats(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions (open ones too) and memories by granularity."""
        self._open()
        _check_id("user_id", user_id)
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
