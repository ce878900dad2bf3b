"""The write side: turns are stored and indexed at once; finished sessions become memories."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory import tracing
from reflective_memory.conditional.notes import NOTE_GRANULARITY, build_note_drafts
from reflective_memory.denoise.base import Denoiser, denoiser_name
from reflective_memory.embed import in_model_thread
from reflective_memory.errors import (
    EmbeddingError,
    InvalidInputError,
    ReflectiveMemoryError,
    SessionChangedError,
    UnknownSessionError,
)
from reflective_memory.llm import LLMClient
from reflective_memory.retrieval.speakers import utterance
from reflective_memory.retrieval.units import (
    BASE_UNITS,
    CONVERSATION_STARTS,
    build_units,
    denoise_drafts,
    raw_key,
    source_turns,
    turn_unit_id,
    unit_draft,
)
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, StoreTopicBank
from reflective_memory.segment.base import Segmenter
from reflective_memory.sessions.clock import ConversationClock, replay_window
from reflective_memory.sessions.recovery import LostTurns
from reflective_memory.sessions.starts import load_starts
from reflective_memory.storage.base import (
    MemoryDraft,
    MemoryStore,
    SessionBuildLock,
    require_open,
    session_fence,
)
from reflective_memory.storage.bridge import await_io, bridged
from reflective_memory.storage.index import IndexCache
from reflective_memory.text import as_utc, parse_timestamp
from reflective_memory.types import Memory, Turn, Usage
from reflective_memory.validation import (
    canonical_role,
    check_flag,
    check_id,
    check_role,
    check_text,
)

if TYPE_CHECKING:
    from reflective_memory.config import MemoryConfig
    from reflective_memory.embed import Embedder

logger = logging.getLogger(__name__)

#: Builds of one `end_session` call before it gives up on a session that keeps changing.
_BUILD_ATTEMPTS = 3


__all__ = ["SessionWriter"]


def _crossed(n_turns: int, added: int, cap: int) -> bool:
    """Whether a session of `n_turns` reached a multiple of `cap` with its last `added` turns.

    A session over the cap that goes on is ended again at every further `cap` turns, not at
    every turn.

    Example:
        >>> _crossed(500, 1, 500), _crossed(501, 1, 500), _crossed(1003, 5, 500)
        (True, False, True)
    """
    return n_turns // cap > (n_turns - added) // cap


def received_time() -> datetime:
    """The wall clock, in UTC: what a live turn without its own time is stamped with."""
    return datetime.now(timezone.utc)


def _draft_turn(record: dict[str, Any]) -> Turn:
    """A checked turn record as a `Turn` not stored yet (for its dense text)."""
    return Turn(
        record["user_id"],
        record["session_id"],
        record["role"],
        record["text"],
        record["turn_id"] or "",
        0,
        record["timestamp"],
    )


def _age_seconds(then: datetime | None) -> float | None:
    """Seconds from `then` to now (naive times are read as UTC), or None."""
    if then is None:
        return None
    return (received_time() - as_utc(then)).total_seconds()


class SessionWriter:
    """The write side of a memory: turns in, finished sessions out as memories.

    Stores and indexes turns at once (`add_turns`), ends sessions on request, on a turn cap
    or when idle, builds their units (segments, notes, topics) atomically, and re-keys them
    when the denoiser changes. A collaborator of `ReflectiveMemory`; it never imports it.

    Args:
        config: The memory's settings.
        store: The store of record.
        indexes: The users' index caches.
        embedder: Embeds unit keys.
        llm: The LLM for notes, if any.
        segmenter: Cuts sessions into segments.
        denoiser: Denoises keys (`None`: raw keys).
        reflector: RMM prospective reflection (`None`: off).
    """

    def __init__(
        self,
        config: MemoryConfig,
        store: MemoryStore,
        indexes: IndexCache,
        embedder: Embedder,
        llm: LLMClient | None,
        segmenter: Segmenter,
        denoiser: Denoiser | None,
        reflector: ProspectiveReflector | None,
    ) -> None:
        self.config, self.store, self.indexes, self.embedder = config, store, indexes, embedder
        self.llm, self.segmenter, self.denoiser, self.reflector = (
            llm,
            segmenter,
            denoiser,
            reflector,
        )
        self.starts = load_starts(config.sessions.conversation_starts)
        self._guard = threading.Lock()
        self._in_flight: Counter[tuple[str, str]] = Counter()
        #: Indexes turns a crash left without their `turn` unit (see `sessions.recovery`).
        self.lost_turns = LostTurns(
            store,
            self._index_turns,
            enabled="turn" in config.units.granularities,
            busy=self.writing_now,
        )

    def _open(self) -> None:
        require_open(self.store)

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
        role = check_role(role)  # `user` / `assistant` for their aliases
        check_text("text", text)
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
            "timestamp": parse_timestamp(timestamp),  # None: `ConversationClock` stamps it
            "turn_id": turn_id,
        }

    def _clock(self) -> ConversationClock:
        """The clock that times turns given without a time, for one write at the wall clock."""
        return ConversationClock(self.store, replay_window(self.config.sessions), received_time())

    def turn_time(self, user_id: Any, session_id: Any, timestamp: Any = None) -> datetime:
        """The time a turn of this session added now is stored at (`ReflectiveMemory.turn_time`)."""
        self._open()
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        given = parse_timestamp(timestamp)
        return self._clock().time_for(user_id, session_id) if given is None else given

    def add_turns(self, turns: Iterable[dict[str, Any]]) -> list[Turn]:
        """Store many turns in one transaction (all or none); see `ReflectiveMemory.add_turns`."""
        with tracing.span("add_turns") as span:
            stored = self._add_turns(turns)
            tracing.describe(span, tracing.turns_attributes, stored)
        return stored

    def check_turns(self, turns: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The turns as `add_turns` would store them (roles canonical, times parsed), checked.

        Nothing is written: a caller that stores many batches (an ingest) checks them all
        first, so a bad turn late in its input stores nothing at all.

        Raises:
            InvalidInputError: A turn is not a dict, has unknown fields, or a bad value.
        """
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
        return records

    def _add_turns(self, turns: Iterable[dict[str, Any]]) -> list[Turn]:
        self._open()
        records = self.check_turns(turns)
        if any(r["timestamp"] is None for r in records):
            self._clock().stamp(records)
        fresh = self._new_sessions(records)
        vectors = self._turn_keys_embedded(records)  # a refused turn is never stored
        with self._writing({(r["user_id"], r["session_id"]) for r in records}):
            try:
                stored = self.store.add_turns(records)
            except InvalidInputError:
                resent = self._resent(records)
                if not resent:
                    raise
                return self._add_after_resend(records, resent, fresh, vectors)
            self._index_turns(stored, vectors)
        self.lost_turns.once(t.user_id for t in stored)
        self._auto_end(stored, fresh)
        return stored

    @contextmanager
    def _writing(self, sessions: set[tuple[str, str]]) -> Iterator[None]:
        """Mark sessions as written by this process (committed turns not yet indexed)."""
        with self._guard:
            self._in_flight.update(sessions)
        try:
            yield
        finally:
            with self._guard:
                self._in_flight.subtract(sessions)
                self._in_flight += Counter()  # drop the zeros

    def writing_now(self) -> set[tuple[str, str]]:
        """The `(user_id, session_id)` pairs this process is storing turns of right now.

        Their turns may be committed and not yet indexed for a moment: `LostTurns` leaves them
        to their writer instead of reporting them lost.
        """
        with self._guard:
            return set(self._in_flight)

    def _turn_keys_embedded(self, records: Sequence[dict[str, Any]]) -> np.ndarray | None:
        """The dense vectors of new turns' keys, made before anything is stored.

        None when turns get no `turn` unit.

        Raises:
            EmbeddingError: The embedder raised on a turn (named by its place in the batch);
                nothing has been stored.
        """
        if not records or "turn" not in self.config.units.granularities:
            return None
        texts = [self._dense_text(_draft_turn(r)) for r in records]
        try:
            return self.embed_keys(texts)
        except EmbeddingError as exc:
            bad = 0
            if len(texts) > 1:  # whose text is it: one by one, only when the batch failed
                bad = next((i for i, t in enumerate(texts) if not self._embeds(t)), 0)
            r = records[bad]
            raise EmbeddingError(
                f"the embedder could not embed turn {bad} of the batch (user {r['user_id']!r}, "
                f"session {r['session_id']!r}): {exc.__cause__ or exc}; nothing was stored"
            ) from exc.__cause__

    def _embeds(self, text: str) -> bool:
        """Whether the embedder takes `text` alone."""
        try:
            self.embed_keys([text])
        except EmbeddingError:
            return False
        return True

    def _new_sessions(self, records: Sequence[dict[str, Any]]) -> set[tuple[str, str]]:
        """The `(user_id, session_id)` pairs of a batch that the store does not hold yet."""
        keys = {(r["user_id"], r["session_id"]) for r in records}
        return {key for key in keys if self.store.session(*key) is None}

    def _resent(self, records: Sequence[dict[str, Any]]) -> dict[int, Turn]:
        """Records that re-send a stored turn (same ids, role and text), by their position.

        A client that did not hear back (a crash, a timeout) sends the turn again: that is
        not a new turn, and not an error.
        """
        out: dict[int, Turn] = {}
        sessions: dict[tuple[str, str], dict[str, Turn]] = {}
        for i, r in enumerate(records):
            if r["turn_id"] is None:
                continue
            key = (r["user_id"], r["session_id"])
            if key not in sessions:
                sessions[key] = {t.turn_id: t for t in self.store.turns(*key)}
            got = sessions[key].get(r["turn_id"])
            if got is None or got.text != r["text"]:
                continue
            if canonical_role(got.role) == r["role"]:  # an older version stored aliases as given
                out[i] = got
        return out

    def _add_after_resend(
        self,
        records: Sequence[dict[str, Any]],
        resent: dict[int, Turn],
        fresh: set[tuple[str, str]],
        vectors: np.ndarray | None,
    ) -> list[Turn]:
        """Store the new records of a batch that re-sends stored turns; index what is missing.

        A re-sent turn whose `turn` unit is missing (the process died between committing the
        turn and indexing it) is indexed now, so the retry leaves it searchable.
        """
        fresh = [r for i, r in enumerate(records) if i not in resent]
        stored = iter(self.store.add_turns(fresh) if fresh else [])
        out = [resent[i] if i in resent else next(stored) for i in range(len(records))]
        todo = [
            i
            for i, t in enumerate(out)
            if i not in resent
            or not self.store.memories(
                t.user_id, [turn_unit_id(t.user_id, t.session_id, t.turn_id)]
            )
        ]
        self._index_turns([out[i] for i in todo], None if vectors is None else vectors[todo])
        self._auto_end([t for i, t in enumerate(out) if i not in resent], fresh)
        return out

    def _auto_end(self, stored: Sequence[Turn], fresh: set[tuple[str, str]]) -> None:
        """End the sessions the rules of `SessionConfig` end (never fails the write).

        A session that hit the turn cap ends; a user's other open sessions end when this write
        opened a new session of theirs (the conversation moved on) or when their last turn is
        older than the idle time at this write's turn.
        """
        cfg = self.config.sessions
        done: set[tuple[str, str]] = set()
        written = Counter((t.user_id, t.session_id) for t in stored)
        latest = {(t.user_id, t.session_id): t for t in stored}  # a session's last turn here
        for key, turn in latest.items():
            try:
                if cfg.max_turns is not None and key not in done:
                    info = self.store.session(*key)
                    if info is not None and _crossed(info.n_turns, written[key], cfg.max_turns):
                        self.end_session(*key)
                        done.add(key)
                moved_on = cfg.end_on_new_session and key in fresh
                if not moved_on and cfg.idle_seconds is None:
                    continue
                for info in self.store.sessions(turn.user_id, status="open"):
                    other = (info.user_id, info.session_id)
                    if other in written or other in done:
                        continue
                    if moved_on or self._idle(info.last_time, turn.timestamp):
                        self.end_session(*other)
                        done.add(other)
            except ReflectiveMemoryError as exc:  # e.g. the server restarting: one line
                logger.warning(
                    "automatic end of sessions at a turn of session %r of user %r failed "
                    "(%s: %s); the turns are stored, the sessions end at a later write or "
                    "end_session",
                    key[1],
                    key[0],
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                )
            except Exception:  # a bug: its traceback; the turns are committed all the same
                logger.exception("automatic end of session failed for %s", key)

    def _idle(self, last: datetime | None, now: datetime | None) -> bool:
        """Whether a session last active at `last` is idle at `now` (`idle_seconds`)."""
        idle = self.config.sessions.idle_seconds
        if idle is None or last is None or now is None:
            return False
        return (as_utc(now) - as_utc(last)).total_seconds() > idle

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
        with tracing.span("end_session", user_id=user_id, session_id=session_id) as span:
            built = None
            if not isinstance(self.store, SessionBuildLock):
                memories = self._end_session(user_id, session_id)
            else:
                with self.store.session_build(user_id, session_id) as built:
                    memories = self._end_session(user_id, session_id) if built is None else built
            here = type(self.segmenter).__name__ if built is None else None
            tracing.describe(span, tracing.session_attributes, memories, here)
        return list(memories)

    def _end_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Build a session's memories for `end_session` (ids already checked).

        The build is atomic and fenced: units, notes and topics are stored in one transaction
        that also marks the session ended, and only if its turns did not change while they were
        built (a turn added meanwhile triggers a rebuild that includes it). A crash at any point
        leaves either the previous memories or the new ones.

        Raises:
            UnknownSessionError: The user has no such session.
            SessionChangedError: Turns kept arriving or being deleted through every rebuild
                attempt; the session stays open and nothing is lost.
        """
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
            self.config.units.granularities,
            self.segmenter,
            date_prefix=self.config.units.date_prefix,
            turn_vectors=turn_vecs,
            speaker_keys=self.config.units.speaker_keys,
        )
        for d in drafts:
            if d.granularity == "turn" and len(d.turn_ids) == 1:
                d.id = turn_unit_id(user_id, session_id, d.turn_ids[0])
        self._mark_starts(turns, turn_vecs, drafts)
        self.denoise_keys(user_id, drafts)
        kinds: tuple[str, ...] = BASE_UNITS
        if self.config.conditional.notes:
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

    def _mark_starts(
        self, turns: Sequence[Turn], vectors: np.ndarray | None, drafts: Sequence[MemoryDraft]
    ) -> None:
        """Record where conversations start in a session whose log gave no times.

        The detector (`sessions.starts`) reads only such sessions. The positions go into the
        metadata of the drafts built from the session's first turn (`CONVERSATION_STARTS`), so
        they are stored, replaced and deleted with its memories.
        """
        if self.starts is None or len(turns) < self.starts.min_turns:
            return  # no query for when the session was stored: too short to read
        info = self.store.session(turns[0].user_id, turns[0].session_id)
        found = self.starts.find(turns, vectors, None if info is None else info.created_at)
        if not found:
            return
        first = turns[0].turn_id
        for d in drafts:
            if first in d.turn_ids:
                d.metadata = {**(d.metadata or {}), CONVERSATION_STARTS: found}

    def _index_turns(self, stored: Sequence[Turn], vectors: np.ndarray | None = None) -> None:
        """Index stored turns as `turn` units so the next `retrieve` finds them.

        `vectors` are their keys' vectors, made before the turns were committed
        (`add_turns`). Without them (turns a stopped process left unindexed) they are embedded
        here; if that fails the units are stored with a placeholder vector marked `pending`,
        which the index build embeds again (so the turn is still found by BM25 at once and by
        dense search as soon as the embedder works).
        """
        if not stored or "turn" not in self.config.units.granularities:
            return
        by_user: dict[str, list[MemoryDraft]] = {}
        texts: dict[str, list[str]] = {}
        for t in stored:
            texts.setdefault(t.user_id, []).append(self._dense_text(t))
            info = self.store.session(t.user_id, t.session_id) if t.position else None
            first = info.first_time if info is not None else t.timestamp
            draft = unit_draft(
                "turn",
                [t],
                first,
                date_prefix=self.config.units.date_prefix,
                speaker_keys=self.config.units.speaker_keys,
            )
            draft.id = turn_unit_id(t.user_id, t.session_id, t.turn_id)
            draft.metadata = {**(draft.metadata or {}), "key_denoiser": "none"}
            by_user.setdefault(t.user_id, []).append(draft)
        rows: dict[str, list[int]] = {}
        for i, t in enumerate(stored):
            rows.setdefault(t.user_id, []).append(i)
        for user_id, drafts in by_user.items():
            model = self.embedder.name
            if vectors is not None:
                made = vectors[rows[user_id]]
            else:
                try:
                    made = self.embed_keys(texts[user_id])
                except Exception:  # the turns are committed; the index build embeds them later
                    logger.exception("embedding turns of user %s failed; indexed later", user_id)
                    made = np.zeros((len(drafts), self.embedder.dim), np.float32)
                    model = "pending"
            self.store.upsert_memories(user_id, drafts, made, model)

    def end_stale_sessions(self) -> None:
        """On reopening a store, end open sessions idle longer than `session_idle_seconds`.

        A session's last activity is its last turn's timestamp (its creation time when its
        turns carry none). Failures are logged; the turns stay committed and indexed.
        """
        idle = self.config.sessions.idle_seconds
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
        speakers = self.config.units.speaker_keys
        missing = []
        for i, (mid, t) in enumerate(zip(ids, turns, strict=True)):
            mem = found.get(mid)
            vec = stored.get(mid)
            if vec is not None and vec.shape != (self.embedder.dim,):
                vec = None  # a damaged vector (an edited import): made again, never broadcast
            if mem is not None and vec is not None and mem.key == raw_key([t], speakers):
                out[i] = vec
            else:
                missing.append(i)
        if missing:
            out[missing] = self.embed_keys([self._dense_text(turns[i]) for i in missing])
        return out

    def _unit_vectors(
        self,
        drafts: Sequence[MemoryDraft | Memory],
        turns: Sequence[Turn],
        turn_vecs: np.ndarray | None,
    ) -> np.ndarray:
        """Vectors of a session's unit keys (of drafts, or of stored memories).

        Raw turn keys reuse their turn's vector; multi-turn units with raw keys get the
        normalised mean of their turns' vectors when `segment_vectors="mean"`; other keys
        (denoised, or `segment_vectors="embed"`) are embedded.
        """
        out = np.zeros((len(drafts), self.embedder.dim), np.float32)
        todo: list[int] = []
        pos = {t.turn_id: i for i, t in enumerate(turns)}
        for i, d in enumerate(drafts):
            idx = [pos[tid] for tid in d.turn_ids if tid in pos]
            raw = raw_key([turns[j] for j in idx], self.config.units.speaker_keys) if idx else None
            if turn_vecs is None or not idx or d.key != raw:
                todo.append(i)
            elif len(idx) == 1:
                out[i] = turn_vecs[idx[0]]
            elif self.config.units.segment_vectors == "mean":
                v = turn_vecs[idx].mean(axis=0)
                out[i] = v / max(float(np.linalg.norm(v)), 1e-12)
            else:
                todo.append(i)
        if todo:
            out[todo] = self.embed_keys([drafts[i].key for i in todo])
        return out

    def _note_drafts(
        self, user_id: str, session_id: str, turns: Sequence[Turn]
    ) -> list[MemoryDraft]:
        """A session's conditional-memory note drafts (stored with the session's units)."""
        usage = Usage()
        drafts, diag = build_note_drafts(
            turns,
            self.llm,
            date_prefix=self.config.units.date_prefix,
            max_prompt_chars=self.config.conditional.note_prompt_chars,
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

    def _reflect(
        self, user_id: str, session_id: str, turns: Sequence[Turn]
    ) -> tuple[list[MemoryDraft], ReflectionReport]:
        """RMM prospective reflection of a finished session; never fails `end_session`.

        Returns the topic drafts to add or replace (stored with the session's units) and the
        report (counts and LLM usage), kept in the store under `rmm.reflection/<user>/<session>`.
        """
        assert self.reflector is not None
        bank = StoreTopicBank(
            self.store, self.indexes, self.embed_keys, self.embedder.name, staged=True
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
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        return self.store.get_value(f"rmm.reflection/{user_id}/{session_id}")

    def _dense_text(self, turn: Turn) -> str:
        """The text a turn's dense vector is made from.

        With `units.speaker_keys`, the utterance alone: a chat-role turn's `Name: ` label goes
        to the keyword key only.
        """
        return utterance(turn) if self.config.units.speaker_keys else turn.text

    def embed_keys(self, keys: list[str]) -> np.ndarray:
        """Document vectors of key texts, cut to `units.embed_max_chars`, in large batches.

        Inside a native async call (bridged, PostgreSQL) the model runs in a worker thread,
        so the event loop serves other coroutines meanwhile.

        Raises:
            EmbeddingError: The embedder raised (its error is the cause).
        """
        cut = [k[: self.config.units.embed_max_chars] for k in keys]
        if not cut:
            return np.zeros((0, self.embedder.dim), np.float32)
        try:
            if bridged():
                return await_io(in_model_thread(self._embed_batches, cut))
            return self._embed_batches(cut)
        except ReflectiveMemoryError:
            raise
        except Exception as exc:  # the embedder's own error (a remote API refusing a text)
            raise EmbeddingError(
                f"the embedder raised on {len(cut)} key texts: {type(exc).__name__}: {exc}"
            ) from exc

    def _embed_batches(self, cut: list[str]) -> np.ndarray:
        bs = max(self.config.units.embed_batch_size, 1) * 16
        parts = [self.embedder.encode(cut[i : i + bs]) for i in range(0, len(cut), bs)]
        return np.vstack(parts).astype(np.float32)

    # -- key denoising (SeCom compression) -------------------------------------------------
    def build_units(self, turns: Sequence[Turn]) -> list[MemoryDraft]:
        """Memory units of one session for every configured granularity (not yet stored)."""
        return build_units(
            turns,
            self.config.units.granularities,
            self.segmenter,
            date_prefix=self.config.units.date_prefix,
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
        only_stale = bool(check_flag("only_stale", only_stale))
        current = denoiser_name(self.denoiser)
        drafts = self._rekey_drafts(user_id, only_stale, current)
        if not drafts:
            return 0
        self.denoise_keys(user_id, drafts, strict=True)
        by_session: dict[str, list[int]] = {}
        for i, d in enumerate(drafts):
            by_session.setdefault(d.session_id, []).append(i)
        vectors = np.zeros((len(drafts), self.embedder.dim), np.float32)
        for session_id, idx in by_session.items():
            vectors[idx] = self._session_vectors(user_id, session_id, [drafts[i] for i in idx])
        self.store.upsert_memories(user_id, drafts, vectors, self.embedder.name)
        self.indexes.invalidate(user_id)
        logger.info("re-keyed %d memories of user %s with %s", len(drafts), user_id, current)
        return len(drafts)

    def stored_vectors(self, user_id: str, ids: list[str], keys: list[str]) -> np.ndarray:
        """Vectors for stored memories, made as writing makes them (`storage.base.MemoryVectors`).

        A memory whose key the embedder refuses (one a former version stored, or an old key
        a new embedder will not take) gets a zero vector, logged: it stays found by its words
        and never breaks a read. When the embedder refuses every key, it is the embedder that
        fails: `EmbeddingError` is raised and nothing is kept, so a later build tries again.

        The index build asks for the memories it finds without an embedding of the current
        embedder (one failed when the turn was added, or the embedder changed): a turn's is
        made from what was said (without a chat-role turn's `Name: ` label), a unit with a
        raw key the mean of its turns' (`units.segment_vectors`); any other key (denoised,
        written by an app, of a memory whose turns are gone) is embedded as it is.
        """
        try:
            return self._stored_vectors(user_id, ids, keys)
        except EmbeddingError:
            if len(ids) == 1:
                raise
        out = np.zeros((len(ids), self.embedder.dim), np.float32)
        refused: list[str] = []
        for i, (mid, key) in enumerate(zip(ids, keys, strict=True)):
            try:
                out[i] = self._stored_vectors(user_id, [mid], [key])[0]
            except EmbeddingError:
                refused.append(mid)
        if len(refused) == len(ids):
            raise EmbeddingError(f"the embedder refused every one of {len(ids)} memory keys")
        logger.warning(
            "the embedder refused %d memory keys of a user; they are found by their words only",
            len(refused),
        )
        return out

    def _stored_vectors(self, user_id: str, ids: list[str], keys: list[str]) -> np.ndarray:
        found = {m.id: m for m in self.store.memories(user_id, ids)}
        out = np.zeros((len(ids), self.embedder.dim), np.float32)
        by_session: dict[str, list[int]] = {}
        rest: list[int] = []
        for i, mid in enumerate(ids):
            mem = found.get(mid)
            if mem is not None and mem.turn_ids and mem.session_id and mem.key == keys[i]:
                by_session.setdefault(mem.session_id, []).append(i)
            else:
                rest.append(i)
        for session_id, idx in by_session.items():
            out[idx] = self._session_vectors(user_id, session_id, [found[ids[i]] for i in idx])
        if rest:
            out[rest] = self.embed_keys([keys[i] for i in rest])
        return out

    def _session_vectors(
        self, user_id: str, session_id: str, units: Sequence[MemoryDraft | Memory]
    ) -> np.ndarray:
        """Vectors of units of one session, from their stored turns (see `_unit_vectors`).

        Only the turns the units hold are read for vectors (a turn of the session no unit
        here holds is not embedded for them).
        """
        held = {tid for u in units for tid in u.turn_ids}
        turns = [t for t in self.store.turns(user_id, session_id) if t.turn_id in held]
        return self._unit_vectors(units, turns, self._turn_vectors(user_id, session_id, turns))

    def _rekey_drafts(self, user_id: str, only_stale: bool, current: str) -> list[MemoryDraft]:
        """Drafts of the user's turn, session and segment units to re-key (see `redenoise`).

        Each draft keeps its memory's id, text, times and provenance; its key is the raw key
        rebuilt from the stored turns (not yet denoised). A memory whose turns cannot be found
        is left as is (logged). With `only_stale`, memories keyed by `current` are skipped.
        """
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
                sources.append(raw_key(src, self.config.units.speaker_keys))
        return [
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

    # -- read path ------------------------------------------------------------------------
