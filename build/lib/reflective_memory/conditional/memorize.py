r"""Memorize decisions: which user utterances deserve a conditional memory.

Two ways to decide, both used by `reflective_memory.conditional.notes`:

* `heuristic_note` — the offline judgement: sentence-level cues (first-person facts, possessions,
  plans, habits and tastes; requirements and corrections addressed to the assistant) select the
  sentences worth keeping; plain questions, bare requests, greetings and pasted material are not
  kept. The record's context is the question asked alongside and the assistant turn just before.
* `fused_response_prompt` / `parse_fused_response` — the paper's fused call: the app's reply
  prompt also asks for a hidden yes / no judgement, so the decision costs no extra call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reflective_memory.errors import InvalidInputError
from reflective_memory.types import Turn

__all__ = [
    "NoteDecision",
    "heuristic_note",
    "heuristic_decisions",
    "fused_response_prompt",
    "parse_fused_response",
    "is_user_turn",
    "parse_yes_no",
    "clip_text",
    "MAX_KNOWLEDGE_CHARS",
]

_USER_ROLES = frozenset({"user", "human"})


def is_user_turn(turn: Turn) -> bool:
    """Whether a turn was said by the user (role `user` or `human`, any case)."""
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


def clip_text(text: str, limit: int) -> str:
    """Collapse whitespace and cut at a word boundary to at most `limit` chars (plus " ...")."""
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
        >>> from reflective_memory.types import Turn
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
    knowledge = clip_text("The user said: " + " ".join(kept), MAX_KNOWLEDGE_CHARS)
    parts: list[str] = []
    context_positions: list[int] = []
    if asked:
        parts.append("The user was asking: " + clip_text(asked[0], _CONTEXT_CHARS))
    prev = position - 1
    if prev >= 0 and not is_user_turn(turns[prev]):
        first = _sentences(turns[prev].text)
        if first:
            parts.append(
                f"Replying to the {turns[prev].role}: " + clip_text(first[0], _CONTEXT_CHARS)
            )
            context_positions.append(prev)
    if not parts:
        parts.append("Said without a preceding question.")
    return NoteDecision(position, True, " ".join(parts), knowledge, context_positions, "heuristic")


def heuristic_decisions(turns: Sequence[Turn]) -> list[NoteDecision]:
    """Offline decisions for every user utterance of a session, in order."""
    return [heuristic_note(turns, i) for i, t in enumerate(turns) if is_user_turn(t)]


_TRUE = {"true", "yes", "y", "1", "keep", "remember"}
_FALSE = {"false", "no", "n", "0", "skip", "none"}


def parse_yes_no(value: Any) -> bool | None:
    """Read a yes / no value (bool, 0/1, `yes`, `no`, `true`, `keep`, ...); `None` if unclear."""
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
    decision = parse_yes_no(m.group(2)) if m else None
    reply = text[: m.start()] if m else text
    r = _REPLY_RE.search(reply)
    if r is not None:
        reply = reply[r.end() :]
    return reply.strip(), decision
