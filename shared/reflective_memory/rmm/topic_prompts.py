"""RMM prospective reflection prompts and their lenient parsers (extraction, Add/Merge)."""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reflective_memory.errors import LLMOutputError
from reflective_memory.framing import speaker_label
from reflective_memory.text import one_line
from reflective_memory.types import Turn

__all__ = [
    "UpdateAction",
    "build_extraction_prompt",
    "build_update_prompt",
    "parse_extraction",
    "parse_update",
    "EXTRACTION_PROMPT",
    "UPDATE_PROMPT",
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

Each summary starts with the date it was last true as of, in brackets; the new summary is the
newest.

Actions (one per line, nothing else):
- Add() — the new summary is about an aspect none of the listed summaries covers.
- Merge(index, merged_summary) — the new summary is about the same aspect as the listed summary
  at that index (for example it updates, corrects or extends it); merged_summary is one sentence
  (without a date) that combines both, keeping the newer information when they disagree.

Example
Listed summaries: ["[2024-03-02] The user runs three times a week.", "[2024-01-10] The user \
works as a nurse."]
New summary: "[2024-06-15] The user started running five times a week to train for a marathon."
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


# ---------------------------------------------------------------- prompts


@dataclass(frozen=True)
class UpdateAction:
    """One parsed update action: `add`, or `merge` into `index` with `merged_summary`."""

    kind: str
    index: int | None = None
    merged_summary: str | None = None


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
    # `_clip` puts each text on one line; labels are cleaned, so every "Turn N |" line is real.
    lines = [
        f"Turn {offset + i} | {speaker_label(t.role)}: {_clip(t.text, max_turn_chars)}"
        for i, t in enumerate(turns)
    ]
    stamps = [t.timestamp for t in turns if t.timestamp is not None]
    date = f" (on {stamps[0]:%Y-%m-%d})" if stamps else ""
    return EXTRACTION_PROMPT.format(
        speaker=speaker_label(speaker), date=date, turns="\n".join(lines)
    )


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
        items.append((one_line(summary), tuple(refs)))
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
            merges[idx] = UpdateAction("merge", idx, one_line(merged))
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
