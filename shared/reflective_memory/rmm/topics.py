"""RMM prospective reflection: topic memories extracted per session, then Added or Merged."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.errors import InvalidInputError, LLMError, LLMOutputError
from reflective_memory.llm import LLMClient, as_llm
from reflective_memory.rmm.topic_prompts import (
    EXTRACTION_PROMPT,
    UPDATE_PROMPT,
    UpdateAction,
    build_extraction_prompt,
    build_update_prompt,
    parse_extraction,
    parse_update,
)
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.text import as_utc
from reflective_memory.types import Memory, Turn, Usage

__all__ = [
    "TopicDraft",
    "UpdateAction",
    "ReflectionReport",
    "TopicBank",
    "InMemoryTopicBank",
    "StoreTopicBank",
    "topic_text",
    "new_topic_memory",
    "merge_topic_memory",
    "ProspectiveReflector",
    "EXTRACTION_PROMPT",
    "UPDATE_PROMPT",
]

logger = logging.getLogger(__name__)


_SOURCE_MARK = "\nSource turns:\n"


# ------------------------------------------------------------------ data


@dataclass(frozen=True)
class TopicDraft:
    """A topic extracted from one session, before Add/Merge.

    Attributes:
        summary: The topic summary.
        speaker: Whose topic it is (a turn role).
        turn_positions: Positions (in the session) of its source turns, sorted.
    """

    summary: str
    speaker: str
    turn_positions: tuple[int, ...]


@dataclass
class ReflectionReport:
    """What prospective reflection did for one session.

    Attributes:
        extracted: Topics extracted (after validation).
        added: Ids of new topic memories.
        merged: Ids of topic memories updated by a merge.
        skipped: Extracted items dropped (no usable summary or references).
        unusable_outputs: LLM outputs that could not be parsed even after repair.
        llm_failures: LLM calls that raised.
        fallback_adds: Topics added because the update decision was unusable.
        usage: LLM usage of the whole reflection.
    """

    extracted: int = 0
    added: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    skipped: int = 0
    unusable_outputs: int = 0
    llm_failures: int = 0
    fallback_adds: int = 0
    usage: Usage = field(default_factory=Usage)

    def as_dict(self) -> dict[str, Any]:
        """Plain-dict form for diagnostics."""
        d = {k: v for k, v in self.__dict__.items() if k != "usage"}
        d["usage"] = self.usage.as_dict()
        return d


class TopicBank(Protocol):
    """Where topic memories live: the engine's store, or `InMemoryTopicBank`."""

    def similar_topics(self, user_id: str, text: str, k: int) -> list[Memory]:
        """The user's `k` topic memories most similar to `text`, best first."""
        ...

    def save_topic(self, memory: Memory) -> None:
        """Insert a new topic memory or replace the one with the same id (and reindex it)."""
        ...


class InMemoryTopicBank:
    """A `TopicBank` in a dict, searched by embedding cosine (tests and standalone use)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.memories: dict[str, Memory] = {}
        self._vecs: dict[str, np.ndarray] = {}

    def similar_topics(self, user_id: str, text: str, k: int) -> list[Memory]:
        """The user's `k` topics with the highest cosine between keys and `text`."""
        mine = [m for m in self.memories.values() if m.user_id == user_id]
        if not mine or k < 1:
            return []
        q = self.embedder.encode(text).reshape(-1)  # a topic against topics: documents both
        sims = np.array([float(self._vecs[m.id] @ q) for m in mine])
        return [mine[i] for i in np.argsort(-sims, kind="stable")[:k]]

    def save_topic(self, memory: Memory) -> None:
        """Store or replace `memory`, embedding its key."""
        self.memories[memory.id] = memory
        self._vecs[memory.id] = self.embedder.encode(memory.key).reshape(-1)


class StoreTopicBank:
    """The engine's `TopicBank`, over its store and index cache.

    Topics are searched in the user's dense index, overlaid with the topics saved since the bank
    was made (so one session's topics see each other without an index rebuild per topic). They
    are written to the store at once, or, with `staged=True`, kept until the caller stores
    `staged_drafts()` in the same transaction as the session's other memories.

    Args:
        store: The engine's store (`upsert_memories`, `memories`).
        indexes: The engine's `IndexCache`.
        embed: Embeds a list of keys into `(n, dim)` normalised vectors.
        model: The embedder name recorded with the vectors.
        staged: Keep saved topics in memory instead of writing them.
    """

    def __init__(
        self,
        store: Any,
        indexes: Any,
        embed: Callable[[list[str]], np.ndarray],
        model: str,
        *,
        staged: bool = False,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.embed = embed
        self.model = model
        self.staged = staged
        self._overlay: dict[str, tuple[Memory, np.ndarray]] = {}
        self._snapshots: dict[str, Any] = {}
        self._drafts: dict[str, MemoryDraft] = {}
        self.saved: list[Memory] = []

    def similar_topics(self, user_id: str, text: str, k: int) -> list[Memory]:
        """The user's `k` topic memories with keys most similar to `text`."""
        q = np.asarray(self.embed([text]), dtype=np.float32).reshape(-1)
        scored: dict[str, tuple[float, Memory | None]] = {}
        if user_id not in self._snapshots:
            self._snapshots[user_id] = self.indexes.get(user_id)
        index = self._snapshots[user_id]
        topic_pos = [p for p, mid in enumerate(index.ids) if mid.startswith("topic-")]
        if topic_pos:
            sims = index.dense.vectors[topic_pos] @ q
            for p, s in zip(topic_pos, sims.tolist(), strict=True):
                scored[index.ids[p]] = (float(s), None)
        for mid, (mem, vec) in self._overlay.items():
            if mem.user_id == user_id:
                scored[mid] = (float(vec @ q), mem)
        best = sorted(scored, key=lambda m: -scored[m][0])[: max(k, 0)]
        need = [m for m in best if scored[m][1] is None]
        fetched = {m.id: m for m in self.store.memories(user_id, need)} if need else {}
        out = []
        for mid in best:
            mem = scored[mid][1] or fetched.get(mid)
            if mem is not None and mem.granularity == "topic" and mem.user_id == user_id:
                out.append(mem)
        return out

    def save_topic(self, memory: Memory) -> None:
        """Write the topic to the store (insert or replace by id) with its key embedding."""
        vec = np.asarray(self.embed([memory.key]), dtype=np.float32)
        draft = MemoryDraft(
            session_id=memory.session_id,
            granularity="topic",
            text=memory.text,
            key=memory.key,
            turn_ids=memory.turn_ids,
            start_time=memory.start_time,
            end_time=memory.end_time,
            metadata=memory.metadata,
            id=memory.id,
        )
        if self.staged:
            stored = memory
            self._drafts.pop(memory.id, None)
            self._drafts[memory.id] = draft
        else:
            (stored,) = self.store.upsert_memories(memory.user_id, [draft], vec, self.model)
        self._overlay[stored.id] = (stored, vec.reshape(-1))
        self.saved = [m for m in self.saved if m.id != stored.id] + [stored]

    def staged_drafts(self) -> list[MemoryDraft]:
        """Topics saved in staged mode, as drafts with fixed ids, in save order."""
        return list(self._drafts.values())


# ---------------------------------------------------------- topic memories


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _newest(draft: TopicDraft, turns: Sequence[Turn]) -> datetime | None:
    stamps = [turns[p].timestamp for p in draft.turn_positions]
    known = [t for t in stamps if t is not None]
    return max(known, key=as_utc) if known else None


def _turn_line(t: Turn) -> str:
    stamp = f"[{t.timestamp:%Y-%m-%d}] " if t.timestamp is not None else ""
    return f"{stamp}{t.role}: {t.text}"


def topic_text(
    summary: str,
    source_lines: Sequence[str],
    date: datetime | None = None,
    earlier: Sequence[str] = (),
) -> str:
    """A topic memory's text: dated summary, what it said before (newest first), its sources.

    A merged topic reads `[as of <newest date>] <summary>` and keeps its former summaries,
    each with its own date, so "what is true now" comes first and the history stays.
    """
    head = f"[as of {date:%Y-%m-%d}] {summary}" if date is not None and earlier else None
    if head is None:
        head = f"[{date:%Y-%m-%d}] {summary}" if date is not None else summary
    if earlier:
        head += "\nEarlier: " + "; ".join(reversed(earlier))
    return head + _SOURCE_MARK + "\n".join(source_lines)


def dated_summary(memory: Memory) -> str:
    """A topic's summary with the date it is true as of (its newest source), for the LLM."""
    summary = str(memory.metadata.get("rmm", {}).get("summary", memory.key))
    when = memory.end_time or memory.start_time
    return f"[{when:%Y-%m-%d}] {summary}" if when is not None else summary


def _source_lines(memory: Memory) -> list[str]:
    rmm = memory.metadata.get("rmm", {})
    if isinstance(rmm.get("source_lines"), list):
        return [str(x) for x in rmm["source_lines"]]
    text = memory.text
    return text.split(_SOURCE_MARK, 1)[1].splitlines() if _SOURCE_MARK in text else [text]


def new_topic_memory(
    user_id: str,
    session_id: str,
    draft: TopicDraft,
    turns: Sequence[Turn],
    *,
    now: datetime | None = None,
    date_prefix: bool = True,
) -> Memory:
    """Build a new topic memory from a draft and the session's turns (indexed by position)."""
    now = _now() if now is None else now
    src = [turns[p] for p in draft.turn_positions]
    stamps = [t.timestamp for t in src if t.timestamp is not None]
    lines = [_turn_line(t) for t in src]
    date = min(stamps, key=as_utc) if stamps and date_prefix else None
    return Memory(
        id=f"topic-{uuid.uuid4().hex}",
        user_id=user_id,
        session_id=session_id,
        granularity="topic",
        text=topic_text(draft.summary, lines, date),
        key=draft.summary,
        turn_ids=tuple(t.turn_id for t in src),
        created_at=now,
        updated_at=now,
        start_time=min(stamps, key=as_utc) if stamps else None,
        end_time=max(stamps, key=as_utc) if stamps else None,
        metadata={
            "rmm": {
                "summary": draft.summary,
                "speaker": draft.speaker,
                "sessions": [session_id],
                "previous_summaries": [],
                "source_lines": lines,
            }
        },
    )


def merge_topic_memory(
    existing: Memory,
    draft: TopicDraft,
    merged_summary: str,
    session_id: str,
    turns: Sequence[Turn],
    *,
    now: datetime | None = None,
    date_prefix: bool = True,
) -> Memory:
    """Merge a draft into an existing topic memory, keeping all provenance.

    The result keeps the existing id and `created_at`; `turn_ids` is the union of both sources;
    the former summary is appended to `metadata["rmm"]["previous_summaries"]`.
    """
    now = _now() if now is None else now
    src = [turns[p] for p in draft.turn_positions]
    old_ids = list(existing.turn_ids)
    known = set(old_ids)
    new_src = [t for t in src if t.turn_id not in known]
    lines = _source_lines(existing) + [_turn_line(t) for t in new_src]
    stamps = [t.timestamp for t in src if t.timestamp is not None]
    stamps += [x for x in (existing.start_time, existing.end_time) if x is not None]
    rmm = dict(existing.metadata.get("rmm", {}))
    sessions = list(rmm.get("sessions", [existing.session_id]))
    if session_id not in sessions:
        sessions.append(session_id)
    old_summary = rmm.get("summary", existing.key)
    old_when = existing.end_time or existing.start_time
    earlier = [
        *rmm.get("earlier", []),
        f"[{old_when:%Y-%m-%d}] {old_summary}" if old_when is not None else str(old_summary),
    ]
    rmm.update(
        earlier=earlier,
        summary=merged_summary,
        sessions=sessions,
        previous_summaries=[*rmm.get("previous_summaries", []), old_summary],
        source_lines=lines,
        speaker=rmm.get("speaker", draft.speaker),
    )
    date = max(stamps, key=as_utc) if stamps and date_prefix else None
    return replace(
        existing,
        session_id=session_id,
        text=topic_text(merged_summary, lines, date, earlier if date_prefix else ()),
        key=merged_summary,
        turn_ids=tuple(old_ids + [t.turn_id for t in new_src]),
        updated_at=now,
        start_time=min(stamps, key=as_utc) if stamps else None,
        end_time=max(stamps, key=as_utc) if stamps else None,
        metadata={**existing.metadata, "rmm": rmm},
    )


# -------------------------------------------------------------- reflector


class ProspectiveReflector:
    """Runs RMM prospective reflection for finished sessions.

    Args:
        llm: Any LLM accepted by `reflective_memory.llm.as_llm`.
        merge_k: Similar existing topics shown to the Add/Merge decision (top-K).
        speakers: Roles to extract topics for (None: every role in the session except
            `system`, in order of appearance).
        window_turns: Sessions longer than this are extracted window by window.
        max_turn_chars: Each turn is cut to this many characters in the extraction prompt (the
            stored memory keeps the whole turn).
        date_prefix: Start topic texts with the date of their first source turn.
    """

    def __init__(
        self,
        llm: Any,
        *,
        merge_k: int = 5,
        speakers: Sequence[str] | None = None,
        window_turns: int = 40,
        max_turn_chars: int = 1500,
        date_prefix: bool = True,
    ) -> None:
        client = as_llm(llm)
        if client is None:
            raise InvalidInputError("prospective reflection needs an llm")
        for name, val in (
            ("merge_k", merge_k),
            ("window_turns", window_turns),
            ("max_turn_chars", max_turn_chars),
        ):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {val!r}")
        self.llm: LLMClient = client
        self.merge_k = merge_k
        self.speakers = None if speakers is None else tuple(speakers)
        self.window_turns = window_turns
        self.max_turn_chars = max_turn_chars
        self.date_prefix = date_prefix

    def _speakers(self, turns: Sequence[Turn]) -> list[str]:
        if self.speakers is not None:
            return list(self.speakers)
        roles: list[str] = []
        for t in turns:
            if t.role != "system" and t.role not in roles:
                roles.append(t.role)
        return roles

    def extract(
        self, turns: Sequence[Turn], report: ReflectionReport | None = None
    ) -> list[TopicDraft]:
        """Extract topic drafts from a session's turns (one LLM call per speaker and window).

        Failed calls and unusable replies are counted in `report` and skipped.
        """
        report = ReflectionReport() if report is None else report
        drafts: list[TopicDraft] = []
        for speaker in self._speakers(turns):
            if not any(t.role == speaker for t in turns):
                continue
            for start in range(0, len(turns), self.window_turns):
                window = turns[start : start + self.window_turns]
                if not any(t.role == speaker for t in window):
                    continue
                prompt = build_extraction_prompt(
                    window, speaker, offset=start, max_turn_chars=self.max_turn_chars
                )
                try:
                    reply = self.llm.complete(prompt, usage=report.usage)
                except LLMError:
                    report.llm_failures += 1
                    continue
                try:
                    items, skipped = parse_extraction(reply, len(window), offset=start)
                except LLMOutputError as exc:
                    logger.warning("topic extraction for %s skipped: %s", speaker, exc)
                    report.unusable_outputs += 1
                    report.usage.failures += 1
                    continue
                report.skipped += skipped
                drafts.extend(TopicDraft(s, speaker, refs) for s, refs in items)
        report.extracted += len(drafts)
        return drafts

    def decide(
        self,
        draft: TopicDraft,
        history: Sequence[Memory],
        report: ReflectionReport | None = None,
        when: datetime | None = None,
    ) -> list[UpdateAction]:
        """Ask Add or Merge for one draft against similar existing topics.

        Every summary the LLM sees carries the date it is true as of (the draft's: `when`, its
        session's newest turn), so a merge can keep the newest value.

        With no history the answer is `Add()` without an LLM call; an LLM failure or an unusable
        reply also gives `Add()` (counted as a fallback), so no extracted topic is lost.
        """
        report = ReflectionReport() if report is None else report
        if not history:
            return [UpdateAction("add")]
        summaries = [dated_summary(m) for m in history]
        new = f"[{when:%Y-%m-%d}] {draft.summary}" if when is not None else draft.summary
        try:
            reply = self.llm.complete(build_update_prompt(new, summaries), usage=report.usage)
        except LLMError:
            report.llm_failures += 1
            report.fallback_adds += 1
            return [UpdateAction("add")]
        try:
            actions, _ = parse_update(reply, len(history))
        except LLMOutputError as exc:
            logger.warning("topic update decision unusable, adding instead: %s", exc)
            report.unusable_outputs += 1
            report.usage.failures += 1
            report.fallback_adds += 1
            return [UpdateAction("add")]
        return actions

    def reflect(
        self,
        user_id: str,
        session_id: str,
        turns: Sequence[Turn],
        bank: TopicBank,
        *,
        now: Callable[[], datetime] | None = None,
    ) -> ReflectionReport:
        """Extract topics from a finished session and apply Add/Merge into `bank`.

        Args:
            user_id: Owner; only this user's topics are searched and changed.
            session_id: The finished session.
            turns: Its turns, in order (positions are list indices).
            bank: Where topics are searched and saved.
            now: Clock (for tests).

        Returns:
            A `ReflectionReport`.
        """
        if not isinstance(user_id, str) or not user_id:
            raise InvalidInputError("user_id must be a non-empty string")
        clock = _now if now is None else now
        report = ReflectionReport()
        turns = list(turns)
        if not turns:
            return report
        for draft in self.extract(turns, report):
            history = [
                m
                for m in bank.similar_topics(user_id, draft.summary, self.merge_k)
                if m.user_id == user_id and m.granularity == "topic"
            ]
            actions = self.decide(draft, history, report, _newest(draft, turns))
            for act in actions:
                if act.kind == "merge" and act.index is not None and act.merged_summary:
                    merged = merge_topic_memory(
                        history[act.index],
                        draft,
                        act.merged_summary,
                        session_id,
                        turns,
                        now=clock(),
                        date_prefix=self.date_prefix,
                    )
                    bank.save_topic(merged)
                    history[act.index] = merged
                    report.merged.append(merged.id)
                else:
                    mem = new_topic_memory(
                        user_id, session_id, draft, turns, now=clock(), date_prefix=self.date_prefix
                    )
                    bank.save_topic(mem)
                    report.added.append(mem.id)
        return report
