r"""Conditional memory: decide which user utterances deserve a memory, and write it with context.

Following the conditional-memory paper (§3.1, Appendix C.2), not every utterance is worth keeping:
requirements for the assistant, feedback on its earlier answers and personal knowledge are; plain
questions and greetings are not. A kept utterance becomes a *conditional record* of granularity
`note` with two parts:

* `context` — why the user said it, summarised from the related nearby turns;
* `knowledge` — the note worth keeping for later conversations.

Two paths build the records of one session:

* **LLM path** (`LLMNoteMaker`): the session's turns are numbered and sent in as few calls as the
  prompt size allows (one call per ~12,000 characters of conversation, usually one per session).
  The same call decides keep / skip for every user utterance *and* writes the context and
  knowledge of the kept ones, so the decision and the record cost one call together. Utterances
  the LLM leaves out, or answers about in a form that does not parse, get the offline decision;
  when a call fails outright, its whole chunk does. No user turn is ever left undecided.
* **Offline path** (`heuristic_note`, in `reflective_memory.conditional.memorize`): sentence-level
cues (first-person
  facts, preferences, plans, requirements, corrections) select the sentences to keep; the context
  is the question the user asked alongside and the assistant turn just before.

A note is stored as a `Memory` with

* `text` = `"[<session date>]\nContext: <context>\nKnowledge: <knowledge>"` (the date line only
  when the session has a timestamp and `date_prefix` is on) — what an LLM reads;
* `key` = `"<knowledge>\n<context>"` — what is embedded and indexed;
* `turn_ids` = the uttering turn first, then the context turns, in session order;
* `metadata` = `context`, `knowledge`, `source_turn_id`, `context_turn_ids`, `decided_by`
  (`llm` or `heuristic`), `positions` (`[p, p + 1]` of the uttering turn).

For apps that generate the assistant's reply themselves, `fused_response_prompt` and
`parse_fused_response` put the keep / skip judgement into the reply call, as the paper does;
pass the decisions to `build_note_drafts(decisions=...)` so that only records remain to write.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reflective_memory.conditional.memorize import (
    MAX_KNOWLEDGE_CHARS,
    NoteDecision,
    clip_text,
    fused_response_prompt,
    heuristic_decisions,
    heuristic_note,
    is_user_turn,
    parse_fused_response,
    parse_yes_no,
)
from reflective_memory.errors import InvalidInputError, LLMError, LLMOutputError
from reflective_memory.framing import frame_lines, speaker_label
from reflective_memory.llm import LLMClient
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.text import as_utc, format_date, one_line
from reflective_memory.types import Turn, Usage

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "NOTE_GRANULARITY",
    "NoteDecision",
    "heuristic_note",
    "heuristic_decisions",
    "LLMNoteMaker",
    "parse_note_output",
    "build_note_drafts",
    "fused_response_prompt",
    "parse_fused_response",
    "note_text",
    "note_key",
]

logger = logging.getLogger(__name__)

#: Granularity of conditional records.
NOTE_GRANULARITY = "note"

# -- LLM path -------------------------------------------------------------------------------------

_NOTE_PROMPT = """You help an AI assistant keep a long-term memory of its conversations with one \
user. Below is part of a conversation; every turn starts a line with its number in square \
brackets and its speaker; the further lines of a turn are indented and belong to it.

For EVERY user turn listed under "Decide for", judge whether it is worth remembering for future \
conversations with this user.
Worth remembering: a requirement or standing instruction for the assistant; feedback on or a \
correction of the assistant's earlier answers; knowledge about the user (facts, possessions, \
events, plans, habits, preferences); knowledge the assistant is unlikely to know otherwise.
Not worth remembering: a plain question or request that only needs an answer; greetings, thanks \
and other small talk; pasted text the user only wants processed.

For a turn worth remembering, also write:
- "context": one or two sentences on why the user said it, drawn from the turn and the related \
earlier turns (say so plainly if nothing earlier is related);
- "knowledge": a self-contained note, in the third person ("The user ..."), with every concrete \
detail (names, numbers, dates) a future assistant would need;
- "related": the numbers of the earlier turns the context draws on (may be empty).

Answer with one JSON object per line, one line per listed user turn, and nothing else:
{{"turn": 4, "keep": false}}
{{"turn": 6, "keep": true, "context": "...", "knowledge": "...", "related": [5]}}

Conversation{date}:
{conversation}

Decide for turns: {targets}
"""

#: Characters of one turn shown to the note-making LLM (user / other roles).
USER_TURN_CHARS = 1500
OTHER_TURN_CHARS = 500


def _shown(turn: Turn) -> str:
    limit = USER_TURN_CHARS if is_user_turn(turn) else OTHER_TURN_CHARS
    return clip_text(turn.text, limit)


_JSON_OBJ = re.compile(r"\{[^{}]*\}", re.DOTALL)


def _loads_lenient(chunk: str) -> dict[str, Any] | None:
    for candidate in (chunk, re.sub(r",\s*}", "}", chunk)):
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        return obj if isinstance(obj, dict) else None
    # single-quoted pseudo-JSON
    try:
        obj = json.loads(re.sub(r"(?<![A-Za-z])'|'(?![A-Za-z])", '"', chunk))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _as_text(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    text = one_line(value)
    return "" if text.lower() in {"nan", "none", "n/a", "null", "-"} else text


_ASCII_INT = re.compile(r"[0-9]{1,9}")


def _ascii_int(value: Any) -> int | None:
    """An ASCII decimal string as int (`"²"` or `"٣"` are no turn numbers), else None."""
    if isinstance(value, str) and _ASCII_INT.fullmatch(value.strip()):
        return int(value.strip())
    return None


def parse_note_output(
    output: str, targets: Mapping[int, int], n_turns: int
) -> dict[int, NoteDecision]:
    """Parse the note-making LLM's answer into decisions, keeping only the valid ones.

    Args:
        output: The LLM's text.
        targets: Shown turn number -> position in the session, for the user turns asked about.
        n_turns: Turns in the session (to validate `related` numbers, which are shown numbers
            `1..n_turns`).

    Returns:
        Position -> decision for every target the answer settles; targets it leaves out, or
        answers about in an unusable way, are missing (the caller falls back for them).

    Raises:
        LLMOutputError: Not one usable decision could be read.
    """
    found: dict[int, NoteDecision] = {}
    for chunk in _JSON_OBJ.findall(output or ""):
        obj = _loads_lenient(chunk)
        if obj is None:
            continue
        number = obj.get("turn", obj.get("id", obj.get("u")))
        if isinstance(number, str):
            number = _ascii_int(number.strip().strip("[]"))
        if not isinstance(number, int) or isinstance(number, bool) or number not in targets:
            continue
        position = targets[number]
        if position in found:  # the first answer about a turn wins
            continue
        keep = parse_yes_no(obj.get("keep", obj.get("remember")))
        if keep is None:
            continue
        if not keep:
            found[position] = NoteDecision(position, False, decided_by="llm")
            continue
        knowledge = _as_text(obj.get("knowledge", obj.get("note")))
        if not knowledge:  # a keep without a note is unusable; the caller falls back
            continue
        related_raw = obj.get("related", [])
        related_raw = related_raw if isinstance(related_raw, list) else [related_raw]
        numbers = [
            r if isinstance(r, int) and not isinstance(r, bool) else _ascii_int(r)
            for r in related_raw
        ]
        related = sorted(
            {r - 1 for r in numbers if r is not None and 1 <= r <= n_turns and r - 1 != position}
        )
        found[position] = NoteDecision(
            position, True, _as_text(obj.get("context")), knowledge, related, "llm"
        )
    if not found:
        raise LLMOutputError("no usable decision in the note-making output")
    return found


class LLMNoteMaker:
    """Decides and writes conditional records of a session with as few LLM calls as possible.

    Args:
        llm: The LLM client.
        max_prompt_chars: Conversation characters per call; a longer session is split into
            chunks, each repeating `overlap_turns` earlier turns as context.
        overlap_turns: Earlier turns shown before a chunk (for context only).
    """

    def __init__(
        self, llm: LLMClient, *, max_prompt_chars: int = 12_000, overlap_turns: int = 2
    ) -> None:
        if max_prompt_chars < 500:
            raise InvalidInputError("max_prompt_chars must be at least 500")
        if overlap_turns < 0:
            raise InvalidInputError("overlap_turns must be >= 0")
        self.llm = llm
        self.max_prompt_chars = max_prompt_chars
        self.overlap_turns = overlap_turns

    def chunks(self, turns: Sequence[Turn]) -> list[tuple[int, int]]:
        """Half-open position ranges, one per call, each holding at least one user turn."""
        spans: list[tuple[int, int]] = []
        start, size = 0, 0
        for i, t in enumerate(turns):
            cost = len(_shown(t)) + 16
            if i > start and size + cost > self.max_prompt_chars:
                spans.append((start, i))
                start, size = i, 0
            size += cost
        if start < len(turns):
            spans.append((start, len(turns)))
        return [(a, b) for a, b in spans if any(is_user_turn(t) for t in turns[a:b])]

    def prompt(self, turns: Sequence[Turn], start: int, end: int) -> tuple[str, dict[int, int]]:
        """The prompt for the chunk `[start, end)` and its shown-number -> position targets."""
        first = max(0, start - self.overlap_turns)
        lines = [
            f"[{i + 1}] {speaker_label(turns[i].role)}: {frame_lines(_shown(turns[i]))}"
            for i in range(first, end)
        ]
        targets = {i + 1: i for i in range(start, end) if is_user_turn(turns[i])}
        date = format_date(turns[0].timestamp)
        text = _NOTE_PROMPT.format(
            date=f" (on {date})" if date else "",
            conversation="\n".join(lines),
            targets=", ".join(str(n) for n in targets),
        )
        return text, targets

    def decide(
        self, turns: Sequence[Turn], usage: Usage | None = None
    ) -> tuple[dict[int, NoteDecision], dict[str, Any]]:
        """LLM decisions for the user turns of a session.

        Returns:
            Position -> decision for every user turn the LLM settled, and diagnostics (`calls`,
            `failed_calls`, `settled`, `unsettled`).
        """
        decided: dict[int, NoteDecision] = {}
        diag: dict[str, Any] = {"calls": 0, "failed_calls": 0}
        for start, end in self.chunks(turns):
            prompt, targets = self.prompt(turns, start, end)
            diag["calls"] += 1
            try:
                out = self.llm.complete(prompt, usage=usage)
                decided.update(parse_note_output(out, targets, len(turns)))
            except LLMOutputError as exc:
                diag["failed_calls"] += 1
                if usage is not None:
                    usage.failures += 1
                logger.warning("note-making output unusable for turns %d-%d: %s", start, end, exc)
            except LLMError as exc:
                diag["failed_calls"] += 1
                logger.warning("note-making call failed for turns %d-%d: %s", start, end, exc)
        diag["settled"] = len(decided)
        return decided, diag


# -- records --------------------------------------------------------------------------------------


def note_text(context: str, knowledge: str, date: str = "") -> str:
    """A note's text as an LLM reads it (date line first when given)."""
    body = f"Context: {context}\nKnowledge: {knowledge}"
    return f"[{date}]\n{body}" if date else body


def note_key(context: str, knowledge: str) -> str:
    """A note's indexed key: the knowledge first, then its context."""
    return f"{knowledge}\n{context}".strip()


def build_note_drafts(
    turns: Sequence[Turn],
    llm: LLMClient | None = None,
    *,
    decisions: Mapping[str, bool] | None = None,
    date_prefix: bool = True,
    max_prompt_chars: int = 12_000,
    usage: Usage | None = None,
) -> tuple[list[MemoryDraft], dict[str, Any]]:
    """Conditional records of one session, ready to store.

    Every user utterance gets a decision: from the LLM when one is given and its answer about
    that utterance is usable, otherwise from `heuristic_note`.

    Args:
        turns: The session's turns, in order.
        llm: Optional LLM; `None` uses the offline heuristic for every utterance.
        decisions: Keep / skip decisions already made (turn id -> bool), e.g. by
            `parse_fused_response` during reply generation. Turns decided `False` are skipped
            without asking the LLM; turns decided `True` still get their record written by it
            (or offline).
        date_prefix: Start each note's text with the session date when known.
        max_prompt_chars: Conversation characters per note-making call.
        usage: Collects the LLM usage.

    Returns:
        The note drafts, and diagnostics (`user_turns`, `kept`, `by_llm`, `by_heuristic`,
        `calls`, `failed_calls`).
    """
    user_positions = [i for i, t in enumerate(turns) if is_user_turn(t)]
    diag: dict[str, Any] = {"user_turns": len(user_positions), "calls": 0, "failed_calls": 0}
    given = dict(decisions) if decisions is not None else {}
    skipped = {i for i in user_positions if given.get(turns[i].turn_id) is False}
    llm_decided: dict[int, NoteDecision] = {}
    if llm is not None and len(skipped) < len(user_positions):
        maker = LLMNoteMaker(llm, max_prompt_chars=max_prompt_chars)
        llm_decided, call_diag = maker.decide(turns, usage)
        diag["calls"] = call_diag["calls"]
        diag["failed_calls"] = call_diag["failed_calls"]
    final: list[NoteDecision] = []
    for i in user_positions:
        if i in skipped:
            final.append(NoteDecision(i, False, decided_by="given"))
            continue
        d = llm_decided.get(i)
        forced = given.get(turns[i].turn_id) is True
        if d is None or (forced and not d.keep):
            d = heuristic_note(turns, i)
            if forced and not d.keep:  # kept by the caller's decision: keep the utterance itself
                d = NoteDecision(
                    i, True, "Kept on request.", clip_text(turns[i].text, MAX_KNOWLEDGE_CHARS)
                )
        if not d.context:
            d.context = heuristic_note(turns, i).context or "No earlier turn is related."
        final.append(d)
    date = format_date(turns[0].timestamp) if (turns and date_prefix) else ""
    drafts = [_draft(turns, d, date) for d in final if d.keep]
    diag["kept"] = len(drafts)
    diag["by_llm"] = sum(1 for d in final if d.decided_by == "llm")
    diag["by_heuristic"] = sum(1 for d in final if d.decided_by == "heuristic")
    return drafts, diag


def _draft(turns: Sequence[Turn], d: NoteDecision, date: str) -> MemoryDraft:
    turn = turns[d.position]
    ctx_turns = [turns[p] for p in d.context_positions if 0 <= p < len(turns)]
    times = sorted((t.timestamp for t in [turn, *ctx_turns] if t.timestamp is not None), key=as_utc)
    return MemoryDraft(
        session_id=turn.session_id,
        granularity=NOTE_GRANULARITY,
        text=note_text(d.context, d.knowledge, date),
        key=note_key(d.context, d.knowledge),
        turn_ids=(turn.turn_id, *(t.turn_id for t in ctx_turns)),
        start_time=times[0] if times else None,
        end_time=times[-1] if times else None,
        metadata={
            "context": d.context,
            "knowledge": d.knowledge,
            "source_turn_id": turn.turn_id,
            "context_turn_ids": [t.turn_id for t in ctx_turns],
            "decided_by": d.decided_by,
            "positions": [turn.position, turn.position + 1],
        },
    )
