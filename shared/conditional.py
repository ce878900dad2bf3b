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
* **Offline path** (`heuristic_note`): sentence-level cues (first-person facts, preferences,
  plans, requirements, corrections) select the sentences to keep; the context is the question the
  user asked alongside and the assistant turn just before.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError, LLMError, LLMOutputError
from .llm import LLMClient
from .store import MemoryDraft
from .text import format_date
from .types import Memory, Turn, Usage

if TYPE_CHECKING:  # pragma: no cover
    from .engine import ReflectiveMemory

__all__ = [
    "NOTE_GRANULARITY",
    "NoteDecision",
    "heuristic_note",
    "heuristic_decisions",
    "LLMNoteMaker",
    "parse_note_output",
    "build_note_drafts",
    "store_session_notes",
    "fused_response_prompt",
    "parse_fused_response",
    "note_text",
    "note_key",
]

logger = logging.getLogger(__name__)

#: Granularity of conditional records.
NOTE_GRANULARITY = "note"

_USER_ROLES = frozenset({"user", "human"})


def _is_user(turn: Turn) -> bool:
    return turn.role.strip().lower() in _USER_ROLES


@dataclass
class NoteDecision:
    """The keep / skip decision for one user utterance, with its record when kept.

    Attributes:
        position: Position of the uttering turn in its session.
        keep: Whether the utterance is worth a memory.
        context: Why the user said it (empty when not kept).
        knowledge: The note to keep (empty when not kept).
        context_positions: Positions of the turns the context draws on.
        decided_by: `llm` or `heuristic`.
    """

    position: int
    keep: bool
    context: str = ""
    knowledge: str = ""
    context_positions: list[int] = field(default_factory=list)
    decided_by: str = "heuristic"


# -- offline heuristic ----------------------------------------------------------------------------

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|im|ive|my|me|mine|myself|we|we're|our|us)\b")
_QUESTION_START = re.compile(
    r"^(can|could|would|will|should|do|does|did|is|are|was|were|what|what's|how|why|when|"
    r"where|which|who|whom|any|anything|tell|give|show|list|explain|describe|write|help|"
    r"suggest|recommend|please)\b"
)
# Sentences that only ask for something (a request is not knowledge about the user).
_REQUEST = re.compile(
    r"\b(i'?m (looking|searching) for|i('d| would) (like|love) (to know|to learn|some|you)|"
    r"i (want|need) (to know|some|help|advice|ideas|suggestions|tips)|i was wondering|"
    r"can you|could you|would you|help me|tell me|give me|show me|let me know|i'?m curious)\b"
)
# Facts about the user: possessions, history, identity, plans, habits, tastes.
_PERSONAL = re.compile(
    r"\b(my \w+|i('ve| have) (been|got|had|just|recently|never|always|started|finished|"
    r"decided|tried|noticed|bought|made|a |an )|i (just|recently|finally|usually|often|always|"
    r"never|used to|still|currently)|i( am|'m) (a|an|the|from|in|at|on|allergic|vegan|"
    r"vegetarian|planning|thinking|trying|going|working|learning|training|currently|still|"
    r"married|single|retired|pregnant|\d)|i (work|worked|live|lived|moved|bought|got|went|"
    r"visited|started|finished|graduated|studied|joined|quit|adopted|own|have|had|was|"
    r"attended|completed|ran|spent|paid|received|met|lost|won|took|made|tried|saw|read|"
    r"watched|planted|upgraded|booked|ordered|cooked|baked|sold|signed|volunteered|"
    r"participated)|i (love|like|enjoy|prefer|hate|dislike|can't stand|"
    r"don't like|don't eat|don't drink)|i( am|'m) into|last (week|month|year|weekend|night)|"
    r"(yesterday|ago|this morning|recently)\b)"
)
# Instructions and feedback on the assistant's behaviour.
_REQUIREMENT = re.compile(
    r"\b(from now on|in the future|next time|going forward|always (use|give|include|answer|"
    r"reply|write|keep)|never (use|give|include|answer|say|mention)|please (always|never|don't|"
    r"do not|remember|keep|stop|avoid|use|make sure)|make sure (to|you)|remember (that|to|my)|"
    r"i want you to|i'd (rather|prefer) (you|if|that)|i prefer (you|when|if|that|answers|"
    r"responses|short|long|shorter|longer)|(don't|do not) (use|include|give|add|mention|"
    r"suggest|recommend)|stop (using|giving|adding|saying)|too (long|short|formal|informal|"
    r"technical|vague|verbose|wordy|complicated|generic)|that's (not|wrong|incorrect)|"
    r"that is (not|wrong|incorrect)|not what i (asked|meant|wanted)|i meant|you (forgot|"
    r"missed|misunderstood)|instead of|to correct myself|i misspoke|i made a mistake|i was wrong)\b"
)
_CLAUSE_SPLIT = re.compile(r",\s*|;\s*|\s+(?:and|but|so)\s+")
_GREETING = re.compile(
    r"^(hi|hello|hey|thanks|thank you|thx|ok|okay|cool|great|nice|sure|yes|no|bye|goodbye|"
    r"good (morning|afternoon|evening|night)|got it|sounds good|perfect|awesome|alright)\b"
)

#: Longest sentence the heuristic considers (longer ones are pasted material, not chat).
MAX_SENTENCE_CHARS = 400
#: Sentences scanned per utterance (pasted documents are not scanned to the end).
MAX_SENTENCES = 40
#: Longest knowledge text the heuristic writes.
MAX_KNOWLEDGE_CHARS = 400
_CONTEXT_CHARS = 200


def _sentences(text: str) -> list[str]:
    out = [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]
    return out[:MAX_SENTENCES]


def _is_question(sentence: str) -> bool:
    low = sentence.lower().lstrip("\"'([ ")
    return sentence.rstrip().endswith("?") or bool(_QUESTION_START.match(low))


def _sentence_signal(sentence: str) -> str | None:
    """Classify one sentence: `requirement`, `personal` or None (not worth keeping)."""
    if len(sentence) > MAX_SENTENCE_CHARS or len(sentence.split()) < 3:
        return None
    low = sentence.lower().replace("\u2019", "'")
    if _REQUIREMENT.search(low):
        return "requirement"
    if not _FIRST_PERSON.search(low):
        return None
    if _is_question(sentence):  # a question may still carry a fact in a side clause
        clauses = _CLAUSE_SPLIT.split(low)
        facts = [c for c in clauses if not _is_question(c) and not _REQUEST.search(c)]
        return "personal" if any(_PERSONAL.search(c) for c in facts) else None
    if _REQUEST.search(low) and not _PERSONAL.search(_REQUEST.sub(" ", low)):
        return None
    if _PERSONAL.search(low):
        return "personal"
    return None


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " ..."


def heuristic_note(turns: Sequence[Turn], position: int) -> NoteDecision:
    """Offline keep / skip decision and record for the user utterance at `position`.

    Keeps the utterance when at least one of its sentences states something about the user
    (a fact, possession, plan, habit or taste in the first person, not phrased as a question or
    a bare request) or tells the assistant how to behave (a requirement or a correction). The
    knowledge is those sentences; the context is the question asked alongside, if any, and the
    start of the assistant turn just before.

    Args:
        turns: The session's turns, in order.
        position: Index into `turns` of a user utterance.

    Returns:
        The decision (`decided_by="heuristic"`).

    Raises:
        InvalidInputError: `position` is out of range.

    Example:
        >>> from shared.types import Turn
        >>> t = [Turn("u", "s", "user", "I just adopted a beagle named Max. Any food tips?",
        ...           "s:0", 0)]
        >>> d = heuristic_note(t, 0)
        >>> d.keep, d.knowledge
        (True, 'The user said: I just adopted a beagle named Max.')
    """
    if not 0 <= position < len(turns):
        raise InvalidInputError(f"position {position} is outside the session (0..{len(turns)})")
    turn = turns[position]
    text = turn.text.strip()
    if _GREETING.match(text.lower()) and len(text.split()) <= 6:
        return NoteDecision(position, False)
    kept: list[str] = []
    asked: list[str] = []
    for sentence in _sentences(text):
        signal = _sentence_signal(sentence)
        if signal is not None:
            kept.append(sentence)
        elif _is_question(sentence) and len(sentence) <= MAX_SENTENCE_CHARS:
            asked.append(sentence)
    if not kept:
        return NoteDecision(position, False)
    knowledge = _clip("The user said: " + " ".join(kept), MAX_KNOWLEDGE_CHARS)
    parts: list[str] = []
    context_positions: list[int] = []
    if asked:
        parts.append("The user was asking: " + _clip(asked[0], _CONTEXT_CHARS))
    prev = position - 1
    if prev >= 0 and not _is_user(turns[prev]):
        first = _sentences(turns[prev].text)
        if first:
            parts.append(f"Replying to the {turns[prev].role}: " + _clip(first[0], _CONTEXT_CHARS))
            context_positions.append(prev)
    if not parts:
        parts.append("Said without a preceding question.")
    return NoteDecision(position, True, " ".join(parts), knowledge, context_positions, "heuristic")


def heuristic_decisions(turns: Sequence[Turn]) -> list[NoteDecision]:
    """Offline decisions for every user utterance of a session, in order."""
    return [heuristic_note(turns, i) for i, t in enumerate(turns) if _is_user(t)]


# -- LLM path -------------------------------------------------------------------------------------

_NOTE_PROMPT = """You help an AI assistant keep a long-term memory of its conversations with one \
user. Below is part of a conversation; every turn has a number in square brackets.

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
    limit = USER_TURN_CHARS if _is_user(turn) else OTHER_TURN_CHARS
    return _clip(turn.text, limit)


_JSON_OBJ = re.compile(r"\{[^{}]*\}", re.DOTALL)
_TRUE = {"true", "yes", "y", "1", "keep", "remember"}
_FALSE = {"false", "no", "n", "0", "skip", "none"}


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


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    return None


def _as_text(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    text = " ".join(value.split())
    return "" if text.lower() in {"nan", "none", "n/a", "null", "-"} else text


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
        if isinstance(number, str) and number.strip().strip("[]").isdigit():
            number = int(number.strip().strip("[]"))
        if not isinstance(number, int) or isinstance(number, bool) or number not in targets:
            continue
        position = targets[number]
        if position in found:  # the first answer about a turn wins
            continue
        keep = _as_bool(obj.get("keep", obj.get("remember")))
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
        related = sorted(
            {
                int(r) - 1
                for r in related_raw
                if isinstance(r, (int, str))
                and not isinstance(r, bool)
                and str(r).strip().isdigit()
                and 1 <= int(r) <= n_turns
                and int(r) - 1 != position
            }
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
        return [(a, b) for a, b in spans if any(_is_user(t) for t in turns[a:b])]

    def prompt(self, turns: Sequence[Turn], start: int, end: int) -> tuple[str, dict[int, int]]:
        """The prompt for the chunk `[start, end)` and its shown-number -> position targets."""
        first = max(0, start - self.overlap_turns)
        lines = [f"[{i + 1}] {turns[i].role}: {_shown(turns[i])}" for i in range(first, end)]
        targets = {i + 1: i for i in range(start, end) if _is_user(turns[i])}
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
    user_positions = [i for i, t in enumerate(turns) if _is_user(t)]
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
                    i, True, "Kept on request.", _clip(turns[i].text, MAX_KNOWLEDGE_CHARS)
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
    times = [t.timestamp for t in [turn, *ctx_turns] if t.timestamp is not None]
    return MemoryDraft(
        session_id=turn.session_id,
        granularity=NOTE_GRANULARITY,
        text=note_text(d.context, d.knowledge, date),
        key=note_key(d.context, d.knowledge),
        turn_ids=(turn.turn_id, *(t.turn_id for t in ctx_turns)),
        start_time=min(times) if times else None,
        end_time=max(times) if times else None,
        metadata={
            "context": d.context,
            "knowledge": d.knowledge,
            "source_turn_id": turn.turn_id,
            "context_turn_ids": [t.turn_id for t in ctx_turns],
            "decided_by": d.decided_by,
            "positions": [turn.position, turn.position + 1],
        },
    )


def store_session_notes(
    engine: ReflectiveMemory, user_id: str, session_id: str, turns: Sequence[Turn]
) -> list[Memory]:
    """Build, embed and store a session's notes, replacing any it had (used by `end_session`).

    Args:
        engine: The memory engine (its LLM, embedder, store and config are used).
        user_id: Owner.
        session_id: The session.
        turns: The session's turns, in order.

    Returns:
        The stored notes.
    """
    usage = Usage()
    drafts, diag = build_note_drafts(
        turns,
        engine.llm,
        date_prefix=engine.config.date_prefix,
        max_prompt_chars=engine.config.note_prompt_chars,
        usage=usage,
    )
    vectors = engine._embed_keys([d.key for d in drafts])
    stored = engine.store.replace_session_memories(
        user_id, session_id, (NOTE_GRANULARITY,), drafts, vectors, engine.embedder.name
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


# -- decision fused with the reply ----------------------------------------------------------------

_FUSED_PROMPT = """{instructions}

Relevant memories of earlier conversations:
{memories}

User: {user_input}

Do two things.
1. Reply to the user. Start the reply with "<Reply>:".
2. Then, on a new line starting with "<Remember>:", answer only "yes" or "no": should the user's \
message be remembered for later conversations? Say yes for a requirement or instruction to the \
assistant, feedback on its earlier answers, or knowledge about the user; say no for a plain \
question or request and for greetings or small talk.
"""

_REPLY_RE = re.compile(r"<\s*reply\s*>\s*:?", re.IGNORECASE)
_REMEMBER_RE = re.compile(r"<\s*(remember|decision)\s*>\s*:?\s*([A-Za-z]*)", re.IGNORECASE)


def fused_response_prompt(
    user_input: str,
    memories: Sequence[str] = (),
    instructions: str = "You are a helpful assistant.",
) -> str:
    """A reply prompt that also asks whether the user's message should be remembered.

    Args:
        user_input: The user's message.
        memories: Retrieved memory texts to show.
        instructions: The assistant's system instructions.

    Returns:
        The prompt; parse the answer with `parse_fused_response`.
    """
    shown = "\n".join(f"- {m}" for m in memories) if memories else "(none)"
    return _FUSED_PROMPT.format(instructions=instructions, memories=shown, user_input=user_input)


def parse_fused_response(output: str) -> tuple[str, bool | None]:
    r"""Split a fused answer into the reply shown to the user and the hidden decision.

    Returns:
        The reply (the whole output when it has no markers) and the decision (`None` when it
        is missing or unreadable; the caller then leaves the decision to `build_note_drafts`).

    Example:
        >>> parse_fused_response("<Reply>: Noted, no cilantro.\n<Remember>: yes")
        ('Noted, no cilantro.', True)
    """
    text = output or ""
    m = _REMEMBER_RE.search(text)
    decision = _as_bool(m.group(2)) if m else None
    reply = text[: m.start()] if m else text
    r = _REPLY_RE.search(reply)
    if r is not None:
        reply = reply[r.end() :]
    return reply.strip(), decision
