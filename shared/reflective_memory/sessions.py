"""Session building for the engine: a finished session becomes memories (fenced, atomic)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from reflective_memory.conditional.notes import NOTE_GRANULARITY, build_note_drafts
from reflective_memory.conditional.reflection import reflective_retrieve
from reflective_memory.denoise import denoiser_name
from reflective_memory.errors import (
    SessionChangedError,
    UnknownSessionError,
)
from reflective_memory.rmm.topics import ReflectionReport, StoreTopicBank
from reflective_memory.storage.base import MemoryDraft, session_fence
from reflective_memory.types import Memory, Retrieval, Turn, Usage
from reflective_memory.units import BASE_UNITS, build_units, denoise_drafts, raw_key, source_turns
from reflective_memory.validation import check_id

logger = logging.getLogger(__name__)

#: Builds of one `end_session` call before it gives up on a session that keeps changing.
_BUILD_ATTEMPTS = 3


__all__ = ["SessionBuilding"]


class SessionBuilding:
    """`ReflectiveMemory`'s write side after the turns: end, build, denoise and re-key sessions.

    A mixin over the engine's components (`store`, `indexes`, `embedder`, `llm`, `config`,
    `segmenter`, `denoiser`, `reflector`); it never imports the engine.
    """

    store: Any
    indexes: Any
    embedder: Any
    llm: Any
    config: Any
    segmenter: Any
    denoiser: Any
    reflector: Any
    rerank_stage: Any

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
        drafts = build_units(
            turns, self.config.granularities, self.segmenter, date_prefix=self.config.date_prefix
        )
        self.denoise_keys(user_id, drafts)
        kinds: tuple[str, ...] = BASE_UNITS
        if self.config.conditional_memory:
            drafts = drafts + self._note_drafts(user_id, session_id, turns)
            kinds = (*BASE_UNITS, NOTE_GRANULARITY)
        report = None
        if self.reflector is not None:
            topics, report = self._reflect(user_id, session_id, turns)
            drafts = drafts + topics
        vectors = self._embed_keys([d.key for d in drafts])
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
        self.denoise_keys(user_id, drafts, strict=True)
        vectors = self._embed_keys([d.key for d in drafts])
        self.store.upsert_memories(user_id, drafts, vectors, self.embedder.name)
        self.indexes.invalidate(user_id)
        logger.info("re-keyed %d memories of user %s with %s", len(drafts), user_id, current)
        return len(drafts)

    # -- read path ------------------------------------------------------------------------
