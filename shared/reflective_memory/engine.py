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
from dataclasses import replace
from datetime import datetime, timezone
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
    SessionChangedError,
    StoreClosedError,
    UnknownMemoryError,
    UnknownSessionError,
)
from reflective_memory.llm import LLMClient, as_llm, count_tokens
from reflective_memory.passages import (
    PassageSettings,
    apply_recency,
    collect_votes,
    pack_passages,
    present_tense,
)
from reflective_memory.ranking import FusionWeights, pack_hits, rank_candidates
from reflective_memory.recall import RecallConfig, calibrate_gate
from reflective_memory.rmm.feedback import FeedbackResult, RerankStage
from reflective_memory.rmm.stored_rerank import StoredRerankStage
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, StoreTopicBank
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.storage.base import MemoryDraft, session_fence
from reflective_memory.storage.factory import open_store
from reflective_memory.storage.index import IndexCache
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.text import parse_timestamp
from reflective_memory.types import GRANULARITIES, Hit, Memory, Retrieval, Turn, Usage
from reflective_memory.units import (
    BASE_UNITS,
    build_units,
    denoise_drafts,
    raw_key,
    source_turns,
    turn_unit_id,
    unit_draft,
)
from reflective_memory.validation import check_encodable, check_id, check_positive, check_role

__all__ = ["ReflectiveMemory"]

logger = logging.getLogger(__name__)

#: Builds of one `end_session` call before it gives up on a session that keeps changing.
_BUILD_ATTEMPTS = 3


def _has_derived_files(directory: Path) -> bool:
    """Whether index or reranker files exist, i.e. a database was stored here before."""
    return any(
        any((directory / d).iterdir()) for d in ("index", "rerankers") if (directory / d).is_dir()
    )


def _comparable(a: datetime, b: datetime) -> bool:
    return (a.tzinfo is None) == (b.tzinfo is None)


def _default_gate(rcfg: RecallConfig) -> bool:
    """RF-Mem gating with the thresholds left at their defaults (explicit ones are kept)."""
    base = RecallConfig()
    return rcfg.mode == "rfmem" and (rcfg.theta_high, rcfg.theta_low, rcfg.tau) == (
        base.theta_high,
        base.theta_low,
        base.tau,
    )


def _count_words(text: str) -> int:
    return len(text.split())


def _age_seconds(then: datetime | None) -> float | None:
    """Seconds from `then` to now (naive times are read as UTC), or None."""
    if then is None:
        return None
    now = datetime.now(timezone.utc)
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return (now - then).total_seconds()


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
            `reflective_memory.denoise.Denoiser`). `None` uses `config.denoiser`. Only keys are
            denoised;
            the LLM always gets the raw text. After changing it, `redenoise(user_id)` re-keys
            a user's existing memories.
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
            llm, timeout_s=self.config.llm_timeout_s, max_chars=self.config.llm_max_chars
        )
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
            max_bytes=self.config.index_cache_bytes,
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
        self._passage_settings = PassageSettings(
            rrf_k=cfg.rrf_k,
            context_weight=cfg.context_weight,
            neighbour_weight=cfg.neighbour_weight,
            neighbour_span=cfg.neighbour_span,
            recency_weight=cfg.recency_weight,
            date_header=cfg.date_prefix,
        )
        self._count = count_tokens if cfg.budget_unit == "tokens" else _count_words
        if hasattr(self.store, "update_blob"):  # rerankers live in the database
            self.rerank_stage: RerankStage = StoredRerankStage(
                self.config, self.embedder, self.store
            )
        else:
            self.rerank_stage = RerankStage(
                self.config, self.embedder, None if self.path is None else self.path / "rerankers"
            )
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

    def _index_turns(self, stored: Sequence[Turn]) -> None:
        """Index newly stored turns as `turn` units so the next `retrieve` finds them.

        The turns are already committed; if embedding fails the units are stored with a
        placeholder vector marked `pending`, which the index build embeds again (so the turn
        is still found by BM25 at once and by dense search as soon as the embedder works).
        """
        if not stored or "turn" not in self.config.granularities:
            return
        by_user: dict[str, list[MemoryDraft]] = {}
        texts: dict[str, list[str]] = {}
        for t in stored:
            texts.setdefault(t.user_id, []).append(t.text)
            info = self.store.session(t.user_id, t.session_id) if t.position else None
            first = info.first_time if info is not None else t.timestamp
            draft = unit_draft(
                "turn",
                [t],
                first,
                date_prefix=self.config.date_prefix,
                speaker_keys=self.config.speaker_keys,
            )
            draft.id = turn_unit_id(t.user_id, t.session_id, t.turn_id)
            draft.metadata = {**(draft.metadata or {}), "key_denoiser": "none"}
            by_user.setdefault(t.user_id, []).append(draft)
        for user_id, drafts in by_user.items():
            model = self.embedder.name
            try:
                vectors = self._embed_keys(texts[user_id])
            except Exception:  # the turns are committed; the index build embeds them later
                logger.exception("embedding new turns of user %s failed; indexed later", user_id)
                vectors = np.zeros((len(drafts), self.embedder.dim), np.float32)
                model = "pending"
            self.store.upsert_memories(user_id, drafts, vectors, model)

    def _end_stale_sessions(self) -> None:
        """On reopening a store, end open sessions idle longer than `session_idle_seconds`.

        A session's last activity is its last turn's timestamp (its creation time when its
        turns carry none). Failures are logged; the turns stay committed and indexed.
        """
        idle = self.config.session_idle_seconds
        if idle is None:
            return
        for user_id in self.store.users():
            for info in self.store.sessions(user_id, status="open"):
                age = _age_seconds(info.last_time or info.created_at)
                if age is None or age <= idle:
                    continue
                try:
                    self.end_session(user_id, info.session_id)
                except Exception:
                    logger.exception(
                        "ending stale session %s of user %s failed", info.session_id, user_id
                    )

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

        Ending a session again (for instance after more turns arrived) rebuilds its units. On a
        store shared by several processes (one with `session_build`), one process builds and
        the others wait and get the memories it built.

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
        guard = getattr(self.store, "session_build", None)
        if guard is None:
            return self._end_session(user_id, session_id)
        with guard(user_id, session_id) as built:
            if built is not None:
                return list(built)
            return self._end_session(user_id, session_id)

    def _end_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Build a session's memories (see `end_session`).

        The build is atomic and fenced: units, notes and topics are stored in one transaction
        that also marks the session ended, and only if its turns did not change while they were
        built (a turn added meanwhile triggers a rebuild that includes it). A crash at any point
        leaves either the previous memories or the new ones.

        Args:
            user_id: Owner.
            session_id: The session.

        Returns:
            The memories built from the session.

        Raises:
            UnknownSessionError: The user has no such session.
            SessionChangedError: Turns kept arriving or being deleted through every rebuild
                attempt; the session stays open and nothing is lost.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        for attempt in range(1, _BUILD_ATTEMPTS + 1):
            if self.store.session(user_id, session_id) is None:
                raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
            try:
                return self._build_session(user_id, session_id)
            except SessionChangedError:
                if attempt == _BUILD_ATTEMPTS:
                    raise
                logger.info("session %s of user %s changed while built; again", session_id, user_id)
        raise AssertionError("unreachable")  # pragma: no cover

    def _build_session(self, user_id: str, session_id: str) -> list[Memory]:
        """One build of a session, stored in one transaction fenced on the turns it read.

        Units, notes and topics are computed first (LLM calls included), then stored together
        with the session marked ended; if a turn was added or deleted meanwhile the store
        raises `SessionChangedError` and nothing is written (the session stays open).
        """
        turns = self.store.turns(user_id, session_id)
        fence = session_fence(turns)
        turn_vecs = self._turn_vectors(user_id, session_id, turns)
        drafts = build_units(
            turns,
            self.config.granularities,
            self.segmenter,
            date_prefix=self.config.date_prefix,
            turn_vectors=turn_vecs,
            speaker_keys=self.config.speaker_keys,
        )
        for d in drafts:
            if d.granularity == "turn" and len(d.turn_ids) == 1:
                d.id = turn_unit_id(user_id, session_id, d.turn_ids[0])
        self.denoise_keys(user_id, drafts)
        kinds: tuple[str, ...] = BASE_UNITS
        if self.config.conditional_memory:
            drafts = drafts + self._note_drafts(user_id, session_id, turns)
            kinds = (*BASE_UNITS, NOTE_GRANULARITY)
        report = None
        if self.reflector is not None:
            topics, report = self._reflect(user_id, session_id, turns)
            drafts = drafts + topics
        vectors = self._unit_vectors(drafts, turns, turn_vecs)
        memories = self.store.replace_session_memories(
            user_id, session_id, kinds, drafts, vectors, self.embedder.name, fence=fence
        )
        if report is not None:
            try:
                self.store.set_value(f"rmm.reflection/{user_id}/{session_id}", report.as_dict())
            except Exception:
                logger.exception("could not record the reflection report")
        logger.info(
            "session %s of user %s: %d turns -> %d memories",
            session_id,
            user_id,
            len(turns),
            len(memories),
        )
        return memories

    def _note_drafts(
        self, user_id: str, session_id: str, turns: Sequence[Turn]
    ) -> list[MemoryDraft]:
        """A session's conditional-memory note drafts (stored with the session's units)."""
        usage = Usage()
        drafts, diag = build_note_drafts(
            turns,
            self.llm,
            date_prefix=self.config.date_prefix,
            max_prompt_chars=self.config.note_prompt_chars,
            usage=usage,
        )
        logger.info(
            "session %s of user %s: %d user turns -> %d notes (%d llm calls, %d failed)",
            session_id,
            user_id,
            diag["user_turns"],
            len(drafts),
            diag["calls"],
            diag["failed_calls"],
        )
        return drafts

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

    def _reflect(
        self, user_id: str, session_id: str, turns: Sequence[Turn]
    ) -> tuple[list[MemoryDraft], ReflectionReport]:
        """RMM prospective reflection of a finished session; never fails `end_session`.

        Returns the topic drafts to add or replace (stored with the session's units) and the
        report (counts and LLM usage), kept in the store under `rmm.reflection/<user>/<session>`.
        """
        assert self.reflector is not None
        bank = StoreTopicBank(
            self.store, self.indexes, self._embed_keys, self.embedder.name, staged=True
        )
        try:
            report = self.reflector.reflect(user_id, session_id, turns, bank)
        except Exception:  # the session's units are still stored; topics come with a rebuild
            logger.exception("prospective reflection failed for session %s", session_id)
            return [], ReflectionReport()
        return bank.staged_drafts(), report

    def reflection_report(self, user_id: str, session_id: str) -> dict[str, Any] | None:
        """The last prospective-reflection report of a session (counts and LLM usage)."""
        self._open()
        return self.store.get_value(f"rmm.reflection/{user_id}/{session_id}")

    def _turn_vectors(
        self, user_id: str, session_id: str, turns: Sequence[Turn]
    ) -> np.ndarray | None:
        """Stored vectors of a session's raw turn keys (embedding the ones missing), or None.

        The turn units indexed by `add_turn` already hold them, so ending a session embeds
        nothing twice.
        """
        if not turns:
            return None
        ids = [turn_unit_id(user_id, session_id, t.turn_id) for t in turns]
        found = {m.id: m for m in self.store.memories(user_id, ids)}
        stored = self.store.vectors(user_id, ids, self.embedder.name)
        out = np.zeros((len(turns), self.embedder.dim), np.float32)
        speakers = self.config.speaker_keys
        missing = []
        for i, (mid, t) in enumerate(zip(ids, turns, strict=True)):
            mem = found.get(mid)
            vec = stored.get(mid)
            if mem is not None and vec is not None and mem.key == raw_key([t], speakers):
                out[i] = vec
            else:
                missing.append(i)
        if missing:
            out[missing] = self._embed_keys([turns[i].text for i in missing])
        return out

    def _unit_vectors(
        self, drafts: Sequence[MemoryDraft], turns: Sequence[Turn], turn_vecs: np.ndarray | None
    ) -> np.ndarray:
        """Vectors of a session's unit keys.

        Raw turn keys reuse their turn's vector; multi-turn units with raw keys get the
        normalised mean of their turns' vectors when `segment_vectors="mean"`; other keys
        (denoised, or `segment_vectors="embed"`) are embedded.
        """
        out = np.zeros((len(drafts), self.embedder.dim), np.float32)
        todo: list[int] = []
        pos = {t.turn_id: i for i, t in enumerate(turns)}
        for i, d in enumerate(drafts):
            idx = [pos[tid] for tid in d.turn_ids if tid in pos]
            raw = raw_key([turns[j] for j in idx], self.config.speaker_keys) if idx else None
            if turn_vecs is None or not idx or d.key != raw:
                todo.append(i)
            elif len(idx) == 1:
                out[i] = turn_vecs[idx[0]]
            elif self.config.segment_vectors == "mean":
                v = turn_vecs[idx].mean(axis=0)
                out[i] = v / max(float(np.linalg.norm(v)), 1e-12)
            else:
                todo.append(i)
        if todo:
            out[todo] = self._embed_keys([drafts[i].key for i in todo])
        return out

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

    def denoise_keys(
        self, user_id: str, drafts: Sequence[MemoryDraft], *, strict: bool = False
    ) -> None:
        """Replace each draft's key by its denoised form, in place (texts stay raw).

        With `strict`, a failing denoiser raises instead of leaving the raw keys.
        """
        denoise_drafts(
            self.denoiser,
            drafts,
            lambda: [t.text for t in self.store.turns(user_id)],
            user_id,
            strict=strict,
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

        Raises:
            ReflectiveMemoryError: The denoiser failed (e.g. `ModelLoadError`: its model is not
                on disk); nothing was changed.
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
                sources.append(raw_key(src, self.config.speaker_keys))
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
        self.denoise_keys(user_id, drafts, strict=True)
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
        """Rank a user's memories for a query and return what the reader should see.

        By default (`config.passages`) retrieval is small-to-big: every indexed key (turns,
        segments, topics, notes) is ranked, the ranking is resolved to turns (each unit votes
        for the turns it was built from; see `reflective_memory.passages`), and:

        * with `budget_tokens`, the best turns are packed into `passage` memories, one per
          session (date header once, the chosen turns in order, `…` between runs), until the
          budget is full; headers and role labels count against it, no turn appears twice;
        * with only `k`, the hits are the top `k` turns (each turn's stored `turn` memory).

        A passage is a `Memory` with `granularity="passage"`: its `turn_ids` are the turns it
        holds, `metadata["positions"]` their places in the session and `metadata["sources"]`
        the ids of the indexed units that voted for them. Passages are built per call and not
        stored (`get_memory` does not know their ids). With `config.passages=False` or `views`,
        the ranked units themselves are returned.

        Args:
            user_id: Whose memories to search (an unknown user gets an empty result).
            query: The query text.
            k: Number of hits (may be as large as the user's memory count). Defaults to
                `config.default_k` when `budget_tokens` is not given either.
            budget_tokens: Pack hits in rank order while their texts fit this many tokens
                (counted by `reflective_memory.llm.count_tokens`: one per word or punctuation
                mark); a
                hit that does not fit is skipped and smaller later hits may still fill the
                budget. With `k` too, at most `k` hits.
            mode: Override `config.retrieval_mode` (`hybrid`, `dense` or `lexical`).
            recall: RF-Mem settings for this call: a `RecallConfig`, or a dict of fields that
                override `config.recall` (e.g. `{"mode": "familiarity"}` or `{"alpha": 0.3}`).
            views: Memory kinds to search (override `config.retrieval_views`), e.g.
                `("note", "segment")`; one ranking across them shares `k` / the budget, and
                the hits are those units themselves (no passages).
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
        check_encodable("query", query)
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

        if k is not None:
            want = k
        elif self.config.passages:  # enough turns to fill the budget, by the mean key length
            mean = index.extras.get("mean_key_words")
            if mean is None:
                mean = index.extras["mean_key_words"] = max(
                    4.0, float(np.mean([len(x.split()) for x in index.keys]))
                )
            want = int(2 * budget_tokens / mean)  # type: ignore[operator]
        else:
            want = max(1, budget_tokens // 50)  # type: ignore[operator]
        n = min(len(index), max(want, self.config.candidate_k, self.config.rerank_top_k))
        explore = self.config.rerank_explore if explore is None else bool(explore)
        if self.config.recall_calibrate and mode != "lexical" and _default_gate(rcfg):
            rcfg = self._calibrated(index, rcfg, diagnostics)
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
                )
                timings["rerank"] = (time.perf_counter() - t0) * 1000
            if self.config.passages and views is None:
                hits, filled = self._pack_passages(
                    user_id, query, index, order, k, budget_tokens, views, timings, diagnostics
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
        return Retrieval(user_id, query, hits, diagnostics, retrieval_id=rid)

    def _calibrated(
        self, index: Any, rcfg: RecallConfig, diagnostics: dict[str, Any]
    ) -> RecallConfig:
        """RF-Mem thresholds calibrated on the user's own index (cached per index version).

        Stored key vectors serve as pseudo-queries (`reflective_memory.recall.calibrate_gate`),
        so the gate needs no hand-set thresholds for a new embedder or a new user.
        """
        key = ("gate", rcfg.probe_k, rcfg.lam)
        cal = index.extras.get(key)
        if cal is None:
            try:
                cal = calibrate_gate(index.dense, probe_k=rcfg.probe_k, lam=rcfg.lam)
            except Exception:  # too small an index to calibrate: keep the configured gate
                logger.debug("RF-Mem gate not calibrated for a %d-memory index", len(index))
                cal = False
            index.extras[key] = cal
        if cal is False:
            return rcfg
        diagnostics["gate_calibration"] = {
            "theta_high": cal.theta_high,
            "theta_low": cal.theta_low,
            "tau": cal.tau,
        }
        return cal.apply(rcfg)

    def _unit_table(self, user_id: str, index: Any) -> list[Memory | None]:
        """Each index position's memory without its text (cached per index version)."""
        table = index.extras.get("units")
        if table is None:
            light = {
                m.id: replace(m, text="", key="") for m in self.store.memories(user_id)
            }
            table = [light.get(i) for i in index.ids]
            index.extras["units"] = table
        return table

    def _segment_bounds(self, user_id: str, index: Any) -> dict[str, list[tuple[int, int]]]:
        """Topical segments of the user's sessions as turn-position spans (cached per index)."""
        cached = index.extras.get("segment_bounds")
        if cached is None:
            cached = {}
            for mem in self._unit_table(user_id, index):
                if mem is None:
                    continue
                pos = mem.metadata.get("positions") if mem.granularity == "segment" else None
                if isinstance(pos, (list, tuple)) and len(pos) == 2:
                    cached.setdefault(mem.session_id, []).append((int(pos[0]), int(pos[1])))
            index.extras["segment_bounds"] = cached
        return cached

    def _pack_passages(
        self,
        user_id: str,
        query: str,
        index: Any,
        order: list[int],
        k: int | None,
        budget: int | None,
        views: Sequence[str] | None,
        timings: dict[str, float],
        diagnostics: dict[str, Any],
    ) -> tuple[list[Hit], bool]:
        """Small-to-big: resolve ranked units to turns and pack them into passages."""
        t0 = time.perf_counter()
        units = self._unit_table(user_id, index)
        ranked = [units[p] for p in order if units[p] is not None]
        if views is not None:
            ranked = [m for m in ranked if m.granularity in views]
        loose = [m.id for m in ranked if not m.turn_ids]
        if loose:  # memories without turns are read whole
            full = {m.id: m for m in self.store.memories(user_id, loose)}
            ranked = [full.get(m.id, m) if not m.turn_ids else m for m in ranked]
        cache: dict[str, list[Turn]] = index.extras.setdefault("session_turns", {})

        def session_turns(sid: str) -> list[Turn]:
            got = cache.get(sid)
            if got is None:
                got = cache[sid] = self.store.turns(user_id, sid)
            return got

        spans = self._segment_bounds(user_id, index) if self.config.neighbour_weight > 0 else {}

        def bounds(sid: str, p: int) -> tuple[int, int]:
            for a, b in spans.get(sid, ()):
                if a <= p < b:
                    return a, b
            return 0, len(session_turns(sid))

        settings = self._passage_settings
        votes = collect_votes(ranked, session_turns, bounds, settings)
        recency = False
        if settings.recency_weight > 0 and present_tense(query):
            recency = apply_recency(
                votes, session_turns, settings.recency_weight, settings.recency_pool
            )
        hits, used, filled = pack_passages(
            user_id,
            votes,
            session_turns,
            self._count,
            k=k,
            budget=budget,
            date_header=settings.date_header,
        )
        if budget is None:  # one turn per hit: hand back the turn's stored unit when it has one
            want = [
                turn_unit_id(user_id, h.memory.session_id, h.memory.turn_ids[0])
                for h in hits
                if h.memory.granularity == "passage"
            ]
            stored = {m.id: m for m in self.store.memories(user_id, want)} if want else {}
            hits = [
                replace(h, memory=stored.get(
                    turn_unit_id(user_id, h.memory.session_id, h.memory.turn_ids[0]), h.memory
                ))
                if h.memory.granularity == "passage"
                else h
                for h in hits
            ]
        diagnostics["passages"] = {
            "units_ranked": len(ranked),
            "turns_voted": len(votes.turn),
            "turns_packed": sum(len(h.memory.turn_ids) for h in hits),
            "tokens_used": used,
            "present_tense": recency,
        }
        timings["passages"] = (time.perf_counter() - t0) * 1000
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
        numbered by `reflective_memory.rmm.citations.build_answer_prompt(query, retrieval.hits)`.
        Each hit that
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
            A `FeedbackResult` saying what was learned (or why nothing was). Only the answer is
            read: an answer that echoes the prompt's instructions or its memory blocks back
            (`reflective_memory.rmm.citations.echoes_instructions`) teaches nothing.

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
        """Erase a user: turns, memories, caches, reranker data and the id itself.

        Nothing of the user remains in any file of the store when this returns (README,
        "Deleting data"). Returns the number of turns deleted.
        """
        self._open()
        check_id("user_id", user_id)
        n = self.store.delete_user(user_id)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget(user_id)
        return n

    def delete_session(self, user_id: str, session_id: str) -> int:
        """Erase a session's turns and every memory derived from it; return the turns deleted.

        Topic memories that merged the session in are derived from it and go too.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        n = self.store.delete_session(user_id, session_id)
        self.indexes.invalidate(user_id)
        self.rerank_stage.forget_retrievals(user_id)
        return n

    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """Delete some turns of a session (all of them when `turn_ids` is None).

        Every memory holding a deleted turn's text is erased with it (units, notes, topics); the
        session is reopened while turns remain, and ending it again rebuilds its memories from
        them. Unknown turn ids are ignored.

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
        gone = self.store.delete_turns(user_id, session_id, turn_ids)
        if gone:
            self.indexes.invalidate(user_id)
            self.rerank_stage.forget_retrievals(user_id)
        return gone

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
        check_encodable("text", text)
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise InvalidInputError("key must be None or a non-empty str")
        if key is not None:
            check_encodable("key", key)
        if not isinstance(session_id, str):
            raise InvalidInputError(f"session_id must be a str, got {type(session_id).__name__}")
        if isinstance(turn_ids, str) or not isinstance(turn_ids, Sequence):
            raise InvalidInputError("turn_ids must be a sequence of turn ids")
        turn_ids = [check_id("turn_id", t) for t in turn_ids]
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
