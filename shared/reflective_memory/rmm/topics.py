"""RMM prospective reflection: topic memories extracted per speaker, then Add or Merge.

Paper §5, Algorithm 1 (lines 8-13) and Appendix D.1. When a session ends:

1. **Extraction.** For each speaker, the LLM reads the numbered turns and returns topic summaries
   about that speaker with the turn numbers they come from (`{"summary", "reference"}`), or
   `NO_TRAIT` when there is nothing personal to keep.
2. **Update.** Each extracted topic is compared with the top-K most similar topic memories the
   same user already has; the LLM answers `Add()` (a new topic) or `Merge(index, merged_summary)`
   (the same aspect, updated). Topics are applied one by one, so a later topic of the same session
   can merge into one just added.

A topic memory's `text` is its summary followed by its source turns (what the LLM reads); its
`key` (what is indexed) is the summary. Provenance is kept in `turn_ids` (every source turn) and in
`metadata["rmm"]` (speaker, source sessions, former summaries).

Every LLM answer is parsed tolerantly and repaired where possible (code fences, prose around the
JSON, trailing commas, Python-style quoting, string or nested references, `Add`/`Merge` variants).
What cannot be used is skipped: extraction yields no topic, an unusable update decision falls back
to `Add()`. The session's turns and other memories are never touched by this module.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.errors import InvalidInputError, LLMError, LLMOutputError
from reflective_memory.llm import LLMClient, as_llm
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.types import Memory, Turn, Usage

__all__ = [
    "EXTRACTION_PROMPT",
    "UPDATE_PROMPT",
    "TopicDraft",
    "UpdateAction",
    "ReflectionReport",
    "TopicBank",
    "InMemoryTopicBank",
    "StoreTopicBank",
    "ProspectiveReflector",
    "build_extraction_prompt",
    "build_update_prompt",
    "parse_extraction",
    "parse_update",
    "topic_text",
    "new_topic_memory",
    "merge_topic_memory",
]

logger = logging.getLogger(__name__)

EXTRACTION_PROMPT = """Read a conversation and write down what it reveals about one speaker, \
{speaker}, as short topic summaries that will be remembered for future conversations.

Rules:
- One summary per distinct topic: {speaker}'s facts, experiences, plans, preferences, opinions,
  background, or (for an assistant) what it recommended or explained. A topic may span several
  turns.
- Write each summary as a full sentence that names {speaker}; keep names, numbers and dates.
- "reference" lists the numbers of the turns the summary comes from.
- Reply with JSON only, in this shape:
  {{"extracted_memories": [{{"summary": "...", "reference": [0, 2]}}]}}
- If the conversation says nothing worth remembering about {speaker}, reply exactly NO_TRAIT.

Example (speaker: user)
Turn 0 | user: I just got back from Lisbon, the trams there are so steep!
Turn 1 | assistant: Welcome back! Did you try pastéis de nata?
Turn 2 | user: Every morning. I'm allergic to nuts, so I was careful with the other pastries.
Turn 3 | assistant: Good call. Anything else planned this year?
Turn 4 | user: Maybe Porto in October with my sister.
Reply:
{{"extracted_memories": [
  {{"summary": "The user recently travelled to Lisbon and ate pastéis de nata every morning.",
    "reference": [0, 2]}},
  {{"summary": "The user is allergic to nuts.", "reference": [2]}},
  {{"summary": "The user may visit Porto in October with their sister.", "reference": [4]}}
]}}

Conversation{date}:
{turns}
Reply:"""

UPDATE_PROMPT = """You keep a list of topic summaries about one person. Decide how a new summary \
about the same person changes the list.

Actions (one per line, nothing else):
- Add() — the new summary is about an aspect none of the listed summaries covers.
- Merge(index, merged_summary) — the new summary is about the same aspect as the listed summary
  at that index (for example it updates, corrects or extends it); merged_summary is one sentence
  that combines both, keeping the newer information when they disagree.

Example
Listed summaries: ["The user runs three times a week.", "The user works as a nurse."]
New summary: "The user started running five times a week to train for a marathon."
Reply:
Merge(0, The user runs five times a week and is training for a marathon.)

Listed summaries: {history}
New summary: {new}
Reply:"""

_NO_TRAIT_RE = re.compile(r"^\W*no[\s_-]*traits?\W*$", re.I)
_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_TRAILING_COMMA_RE = re.compile(r",\s*([\]}])")
_INT_RE = re.compile(r"-?\d+")
_ADD_RE = re.compile(r"^\W*add\s*(?:\(\s*\)|\b)", re.I)
_MERGE_RE = re.compile(
    r"merge\s*\(\s*(?:index\s*[=:]\s*)?\[?\s*(-?\d+)\s*\]?\s*,\s*(?:merged_summary\s*[=:]\s*)?(.*?)\)?\s*$",
    re.I | re.S,
)
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


@dataclass(frozen=True)
class UpdateAction:
    """One parsed update action: `add`, or `merge` into `index` with `merged_summary`."""

    kind: str
    index: int | None = None
    merged_summary: str | None = None


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
        q = self.embedder.encode(text).reshape(-1)
        sims = np.array([float(self._vecs[m.id] @ q) for m in mine])
        return [mine[i] for i in np.argsort(-sims, kind="stable")[:k]]

    def save_topic(self, memory: Memory) -> None:
        """Store or replace `memory`, embedding its key."""
        self.memories[memory.id] = memory
        self._vecs[memory.id] = self.embedder.encode(memory.key).reshape(-1)


class StoreTopicBank:
    """The engine's `TopicBank`, over its store and index cache.

    Topics are written to the store at once (durable) and searched in the user's dense index,
    overlaid with the topics saved since the bank was made (so one session's topics see each
    other without an index rebuild per topic).

    Args:
        store: The engine's store (`upsert_memories`, `memories`).
        indexes: The engine's `IndexCache`.
        embed: Embeds a list of keys into `(n, dim)` normalised vectors.
        model: The embedder name recorded with the vectors.
    """

    def __init__(
        self,
        store: Any,
        indexes: Any,
        embed: Callable[[list[str]], np.ndarray],
        model: str,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.embed = embed
        self.model = model
        self._overlay: dict[str, tuple[Memory, np.ndarray]] = {}
        self._snapshots: dict[str, Any] = {}
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
        (stored,) = self.store.upsert_memories(memory.user_id, [draft], vec, self.model)
        self._overlay[stored.id] = (stored, vec.reshape(-1))
        self.saved = [m for m in self.saved if m.id != stored.id] + [stored]


# ---------------------------------------------------------------- prompts


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def build_extraction_prompt(
    turns: Sequence[Turn],
    speaker: str,
    *,
    offset: int = 0,
    max_turn_chars: int = 1500,
) -> str:
    """The extraction prompt for one speaker over (a window of) a session.

    Args:
        turns: The turns to show, numbered from `offset`.
        speaker: The role whose topics are wanted.
        offset: Number of the first turn (its position in the session).
        max_turn_chars: Each turn is cut to this many characters in the prompt.
    """
    lines = [
        f"Turn {offset + i} | {t.role}: {_clip(t.text, max_turn_chars)}"
        for i, t in enumerate(turns)
    ]
    stamps = [t.timestamp for t in turns if t.timestamp is not None]
    date = f" (on {stamps[0]:%Y-%m-%d})" if stamps else ""
    return EXTRACTION_PROMPT.format(speaker=speaker, date=date, turns="\n".join(lines))


def build_update_prompt(new_summary: str, history: Sequence[str]) -> str:
    """The Add/Merge prompt: `history` is numbered by list position (0-based)."""
    return UPDATE_PROMPT.format(
        history=json.dumps(list(history), ensure_ascii=False),
        new=json.dumps(new_summary, ensure_ascii=False),
    )


# ---------------------------------------------------------------- parsers


def _json_candidates(text: str) -> list[str]:
    """Substrings of `text` that may hold the JSON payload, most likely first."""
    out = [m.group(1) for m in _FENCE_RE.finditer(text)]
    out.append(text)
    for open_c, close_c in (("{", "}"), ("[", "]")):
        start, end = text.find(open_c), text.rfind(close_c)
        if 0 <= start < end:
            out.append(text[start : end + 1])
    return out


def _loads_lenient(s: str) -> Any:
    s = s.strip()
    for attempt in (s, _TRAILING_COMMA_RE.sub(r"\1", s)):
        try:
            return json.loads(attempt)
        except ValueError:
            pass
        try:
            return ast.literal_eval(attempt)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
    raise ValueError("not JSON")


def _refs(value: Any) -> list[int]:
    """Turn numbers from `[0, 2]`, `["3"]`, `"[1], [2]"`, `[[4]]`, `"Turn 5"`, `6`."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, float) and value.is_integer():
        return [int(value)]
    if isinstance(value, str):
        return [int(x) for x in _INT_RE.findall(value)]
    if isinstance(value, (list, tuple)):
        out: list[int] = []
        for v in value:
            out.extend(_refs(v))
        return out
    return []


def _items(payload: Any) -> list[Any] | None:
    if isinstance(payload, list):
        return payload
    if isinstance(payload, dict):
        for key in ("extracted_memories", "memories", "topics", "extracted", "summaries"):
            if isinstance(payload.get(key), list):
                return payload[key]
        if "summary" in payload:
            return [payload]
        lists = [v for v in payload.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
    return None


_ITEM_RE = re.compile(
    r'["\']summary["\']\s*:\s*(["\'])(.*?)(?<!\\)\1\s*,\s*["\']references?["\']\s*:\s*(\[[^\]]*\]|\d+)',
    re.S,
)


def parse_extraction(
    text: str, n_turns: int, *, offset: int = 0
) -> tuple[list[tuple[str, tuple[int, ...]]], int]:
    """Parse an extraction reply.

    Args:
        text: The LLM's reply.
        n_turns: Turns shown; valid references are `offset .. offset + n_turns - 1`.
        offset: Number of the first turn shown.

    Returns:
        `(items, skipped)`: `(summary, sorted unique turn positions)` pairs, and how many items
        were dropped for lacking a summary or any valid reference. `NO_TRAIT` gives `([], 0)`.

    Raises:
        LLMOutputError: Nothing usable could be read, even after repair.
    """
    if not isinstance(text, str):
        raise LLMOutputError("extraction output is not text")
    stripped = text.strip()
    if _NO_TRAIT_RE.match(stripped) or (
        "{" not in stripped and re.search(r"\bno[\s_-]*traits?\b", stripped, re.I)
    ):
        return [], 0
    raw_items: list[Any] | None = None
    for cand in _json_candidates(stripped):
        try:
            raw_items = _items(_loads_lenient(cand))
        except ValueError:
            continue
        if raw_items is not None:
            break
    if raw_items is None:
        # Last resort: pick summary/reference pairs out of broken JSON.
        raw_items = [
            {"summary": m.group(2), "reference": m.group(3)} for m in _ITEM_RE.finditer(text)
        ]
        if not raw_items:
            raise LLMOutputError(f"extraction output does not parse: {stripped[:200]!r}")
    items: list[tuple[str, tuple[int, ...]]] = []
    skipped = 0
    lo, hi = offset, offset + n_turns
    for it in raw_items:
        if not isinstance(it, dict):
            skipped += 1
            continue
        summary = it.get("summary", it.get("memory", it.get("text")))
        ref_val = next(
            (it[k] for k in ("reference", "references", "refs", "turns", "turn_ids") if k in it),
            None,
        )
        refs = sorted({r for r in _refs(ref_val) if lo <= r < hi})
        if not isinstance(summary, str) or not summary.strip() or not refs:
            skipped += 1
            continue
        items.append((" ".join(summary.split()), tuple(refs)))
    return items, skipped


def parse_update(text: str, n_history: int) -> tuple[list[UpdateAction], int]:
    """Parse an Add/Merge reply.

    Args:
        text: The LLM's reply.
        n_history: Length of the listed summaries (valid merge indices `0..n_history-1`).

    Returns:
        `(actions, ignored)`: valid actions (merges first, at most one per index; `Add` only when
        there is no valid merge), and how many actions were invalid (bad index, empty summary).

    Raises:
        LLMOutputError: No action could be read.
    """
    if not isinstance(text, str):
        raise LLMOutputError("update output is not text")
    body = "\n".join(m.group(1) for m in _FENCE_RE.finditer(text)) or text
    merges: dict[int, UpdateAction] = {}
    add = False
    ignored = 0
    seen_any = False
    # Each action starts at "Add" or "Merge"; a merged summary may span lines or hold parentheses.
    starts = [m.start() for m in re.finditer(r"\b(?:add|merge)\s*\(|^\W*add\b", body, re.I | re.M)]
    for a, b in zip(starts, [*starts[1:], len(body)][: len(starts)], strict=True):
        chunk = body[a:b].strip()
        if re.match(r"merge", chunk, re.I):
            seen_any = True
            m = _MERGE_RE.search(chunk)
            if m is None:
                ignored += 1
                continue
            idx = int(m.group(1))
            merged = m.group(2).strip().strip("\"'").strip()
            if not 0 <= idx < n_history or not merged or idx in merges:
                ignored += 1
                continue
            merges[idx] = UpdateAction("merge", idx, " ".join(merged.split()))
        elif _ADD_RE.match(chunk):
            seen_any = True
            add = True
    if not seen_any:
        raise LLMOutputError(f"update output names no action: {text.strip()[:200]!r}")
    if merges:
        return [merges[i] for i in sorted(merges)], ignored
    if add:
        return [UpdateAction("add")], ignored
    raise LLMOutputError(f"update output has no valid action: {text.strip()[:200]!r}")


# ---------------------------------------------------------- topic memories


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _turn_line(t: Turn) -> str:
    stamp = f"[{t.timestamp:%Y-%m-%d}] " if t.timestamp is not None else ""
    return f"{stamp}{t.role}: {t.text}"


def topic_text(summary: str, source_lines: Sequence[str], date: datetime | None = None) -> str:
    """A topic memory's text: dated summary, then its source turns."""
    head = f"[{date:%Y-%m-%d}] {summary}" if date is not None else summary
    return head + _SOURCE_MARK + "\n".join(source_lines)


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
    date = min(stamps) if stamps and date_prefix else None
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
        start_time=min(stamps) if stamps else None,
        end_time=max(stamps) if stamps else None,
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
    rmm.update(
        summary=merged_summary,
        sessions=sessions,
        previous_summaries=[*rmm.get("previous_summaries", []), old_summary],
        source_lines=lines,
        speaker=rmm.get("speaker", draft.speaker),
    )
    date = min(stamps) if stamps and date_prefix else None
    return replace(
        existing,
        session_id=session_id,
        text=topic_text(merged_summary, lines, date),
        key=merged_summary,
        turn_ids=tuple(old_ids + [t.turn_id for t in new_src]),
        updated_at=now,
        start_time=min(stamps) if stamps else None,
        end_time=max(stamps) if stamps else None,
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
        self, draft: TopicDraft, history: Sequence[Memory], report: ReflectionReport | None = None
    ) -> list[UpdateAction]:
        """Ask Add or Merge for one draft against similar existing topics.

        With no history the answer is `Add()` without an LLM call; an LLM failure or an unusable
        reply also gives `Add()` (counted as a fallback), so no extracted topic is lost.
        """
        report = ReflectionReport() if report is None else report
        if not history:
            return [UpdateAction("add")]
        summaries = [m.metadata.get("rmm", {}).get("summary", m.key) for m in history]
        try:
            reply = self.llm.complete(
                build_update_prompt(draft.summary, summaries), usage=report.usage
            )
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
            actions = self.decide(draft, history, report)
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
