"""Small-to-big retrieval: ranked memory units become passages of whole turns for the reader.

The index holds fine-grained keys (one per turn) beside coarser ones (segments, sessions, topics,
notes). A ranking over all of them is resolved to *turns*: every ranked unit votes for the turns
it was built from with a reciprocal-rank weight (`weight / (rrf_k + rank + 1)`, the same rule as
the fusion of the rankers), so a turn found by its own key and inside a well-ranked segment rises
above a turn found once.

For a question about the present ("where do I live now?") the votes of newer turns are scaled up,
so the newest evidence wins when older memories say otherwise (`present_tense`).

Turns are then taken in vote order while they fit the token budget and grouped per session into
`passage` memories: one date header per session, the session's chosen turns in their original
order, `…` where turns are skipped. No turn appears twice, and the budget counts every token the
reader gets, headers and role labels included. Units that carry no turns (memories written with
`put_memory`) compete as they are.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from reflective_memory.excerpts import Pieces, excerpt
from reflective_memory.settings import check_bool, check_choice, check_int, check_number
from reflective_memory.speakers import speaker_of
from reflective_memory.text import format_date, lexical_tokens
from reflective_memory.types import Hit, Memory, Turn

__all__ = [
    "PASSAGE_GRANULARITY",
    "PassageConfig",
    "RECENCY_POOL",
    "present_tense",
    "named_speaker",
    "without_name",
    "apply_speaker_focus",
    "apply_recency",
    "apply_time_frame",
    "states_a_change",
    "without_present_cue",
    "addressed_role",
    "TurnVotes",
    "collect_votes",
    "pack_passages",
    "turn_line",
]

#: Granularity of the memories `retrieve` returns in passage mode.
PASSAGE_GRANULARITY = "passage"
#: Line put between two non-adjacent runs of turns inside one passage.
GAP_MARK = "…"
#: Characters per token of the opening `_Costs.capped` counts first (English words average
#: under six with their space, so the opening usually decides).
_OPENING_CHARS = 8

_PRESENT = re.compile(
    r"\b(now|currently|current|these days|nowadays|still|at the moment|at present|presently|"
    r"anymore|any more|latest|most recent|most recently|right now)\b",
    re.IGNORECASE,
)


_STATE_NOW = re.compile(  # the user's state, in the simple present: "where do I live?"
    r"\b(?:do I|am I|is my|are my|what's my|who's my|where's my)\b",
    re.IGNORECASE,
)


_PAST = re.compile(
    r"\b(?:initially|originally|at first|first|used to|before|previously|earlier|ago|last|"
    r"back then|once)\b",
    re.IGNORECASE,
)


def present_tense(query: str) -> bool:
    """Whether a question asks about the present state of things.

    Args:
        query: The question.

    Returns:
        True when it holds a cue such as "now", "currently", "these days", "still", "latest",
        or asks about the user's state in the simple present ("where do I live?", "what is
        my job?" read as "is my") without a cue of the past ("initially", "before", "ago").

    Example:
        >>> present_tense("Where do I live now?"), present_tense("Where did I live in 2020?")
        (True, False)
        >>> present_tense("Where do I live?"), present_tense("Where do I initially keep it?")
        (True, False)
    """
    if _PRESENT.search(query):
        return True
    return bool(_STATE_NOW.search(query)) and not _PAST.search(query)


def without_present_cue(query: str) -> str:
    """The question without its present-tense cues, which say *when*, not *what*.

    Searched as words, "these days" matches every turn about days; the cue is used by the
    recency boost instead. A question made only of cues is returned as it is.

    Example:
        >>> without_present_cue("Remind me, where am I living these days?")
        'Remind me, where am I living?'
    """
    out = " ".join(_PRESENT.sub(" ", query).split())
    out = re.sub(r"\s+([?.!,;:])", r"\1", out)
    out = re.sub(r"[,;:]+(?=[?.!]|$)", "", out)
    return out if re.search(r"\w", out) else query


def named_speaker(query: str, speakers: Iterable[str]) -> str | None:
    """The one speaker a question names, if it names exactly one.

    Args:
        query: The question.
        speakers: The roles of the user's turns (speaker names in a chat between people).

    Returns:
        The speaker named as a whole word (any case, possessives too), or None when the
        question names none or several.

    Example:
        >>> named_speaker("What hobbies does Nebraas have?", ["Nicolas", "Nebraas"])
        'Nebraas'
        >>> named_speaker("Did Nicolas meet Nebraas's roommate?", ["Nicolas", "Nebraas"]) is None
        True
    """
    found = [
        s
        for s in speakers
        if s.strip() and re.search(rf"(?<!\w){re.escape(s.strip())}(?!\w)", query, re.IGNORECASE)
    ]
    return found[0] if len(found) == 1 else None


def without_name(query: str, name: str) -> str:
    """The question with a name (and its possessive) taken out, for the rankers.

    Falls back to the question as it is when nothing with content would be left.

    Example:
        >>> without_name("What are Nebraas's hobbies?", "Nebraas")
        'What are hobbies?'
        >>> without_name("Nebraas?", "Nebraas")
        'Nebraas?'
    """
    pattern = rf"(?<!\w){re.escape(name.strip())}(?:['\u2019]s?)?(?!\w)"
    text = " ".join(re.sub(pattern, " ", query, flags=re.IGNORECASE).split())
    text = re.sub(r"\s+([?.!,;:])", r"\1", text)
    return text if lexical_tokens(text) else query


@dataclass(frozen=True)
class PassageConfig:
    """Small-to-big retrieval: how ranked units become passages of whole turns.

    Attributes:
        enabled: Resolve the ranking to turns and return `passage` memories built for the
            reader (see `ReflectiveMemory.retrieve`); `False` returns the ranked units.
        context_weight: Vote of a coarse unit (segment, session, topic, note) for each of its
            turns, relative to a turn's own key (1.0).
        context_full_budget: Below this budget (in `budget_unit`s) the coarse units' votes
            shrink in proportion (`context_weight * budget / context_full_budget`): when only
            a few turns fit, the turn that matches the question should win over its topical
            neighbours. 0 keeps the full context weight at every budget.
        recency_weight: Present-tense questions ("now", "currently", "these days", "still")
            multiply the votes of the best turns by `1 + recency_weight * r`, r from 0 (the
            oldest of them) to 1 (the newest); 0 turns it off.
        recency_margin: Only the 10 best turns whose vote is within this fraction of the best
            vote compete on time (a clearly less relevant turn is never pulled up by its date).
        time_weight: A question anchored in time ("two weeks ago", "last summer", "on 29 Dec
            2023"; `reflective_memory.timeframe`) multiplies the votes of the turns said in that
            period by `1 + time_weight`, resolved against the call's `now`; 0 turns it off.
        speaker_focus: When a question names exactly one of the speakers of the user's turns
            ("What does Kate do on weekends?"), it is searched without the name and the other
            speakers' turns' votes are multiplied by `1 - speaker_focus` (0: off).
        person_focus: In a chat of `user` and `assistant` turns, a question that names no
            speaker but asks in the first person ("where do I work?") scales the assistant's
            turns by `1 - person_focus`, one that asks what "you said / recommended" the
            user's (0: off). At 0.3: LongMemEval dev100 +8.3 points at 500 words, top-5
            0.722 -> 0.810; neutral on REALTALK (BENCHMARKS.md, issue 27). A turn holding the
            question word for word keeps its vote.
        length_exponent: Packing order is `vote / (cost / (length_free * median)) **
            length_exponent` for turns longer than `length_free` times the median candidate, so
            a long turn must out-vote the several short ones whose room it would take (the
            best-voted turns filling `length_keep_share` of the budget keep vote order); 0
            packs in vote order.
        length_free: See `length_exponent`.
        length_keep_share: See `length_exponent`.
        budget_unit: What `budget_tokens` counts: `tokens` (`reflective_memory.llm.count_tokens`)
            or `words` (whitespace words, the retrieval bench's unit).
        excerpt_length: With a budget, a turn longer than this (in `budget_unit`s) is read as
            an excerpt of this length: the run of its sentences that holds most of the
            question's words (`reflective_memory.excerpts`). The best-voted turn is read whole
            when it fits, else as an excerpt of the room the budget leaves beside the next
            turn that fits. 0 reads whole turns only. At 50: +6.3 points at 250 words on
            LongMemEval dev100, +6.8 on REALTALK (BENCHMARKS.md, issue 27).
    """

    enabled: bool = True
    context_weight: float = 0.25
    context_full_budget: int = 1000
    recency_weight: float = 0.25
    recency_margin: float = 0.1
    time_weight: float = 0.5
    speaker_focus: float = 0.8
    person_focus: float = 0.3
    length_exponent: float = 0.5
    length_free: float = 2.0
    length_keep_share: float = 0.25
    budget_unit: str = "tokens"
    excerpt_length: int = 50

    def __post_init__(self) -> None:
        check_bool("passages.enabled", self.enabled)
        for name in ("context_weight", "recency_weight", "time_weight", "length_exponent"):
            check_number(f"passages.{name}", getattr(self, name), 0)
        check_int("passages.context_full_budget", self.context_full_budget, 0)
        check_int("passages.excerpt_length", self.excerpt_length, 0)
        for name in ("length_keep_share", "speaker_focus", "person_focus"):
            check_number(f"passages.{name}", getattr(self, name), 0, 1)
        for name in ("recency_margin", "length_free"):
            check_number(f"passages.{name}", getattr(self, name), 0, open_low=True)
        check_choice("passages.budget_unit", self.budget_unit, ("tokens", "words"))


#: Turns that compete on time for a present-tense question.
RECENCY_POOL = 10


@dataclass
class TurnVotes:
    """Votes per turn (keyed by `(session_id, position)`) and per turnless memory.

    `labels` are the `Name: ` labels that name speakers in chat-role turns (`speaker_of`):
    such a turn reads as its text alone in a passage, without the role before the name.
    """

    turn: dict[tuple[str, int], float] = field(default_factory=dict)
    loose: dict[str, float] = field(default_factory=dict)
    loose_memories: dict[str, Memory] = field(default_factory=dict)
    sources: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    first_seen: dict[Any, int] = field(default_factory=dict)
    labels: frozenset[str] = frozenset()

    def add(self, key: tuple[str, int], vote: float, source: str | None) -> None:
        """Add a vote for a turn (and remember which memory gave it)."""
        self.turn[key] = self.turn.get(key, 0.0) + vote
        self.first_seen.setdefault(key, len(self.first_seen))
        if source is not None:
            srcs = self.sources.setdefault(key, [])
            if source not in srcs:
                srcs.append(source)


def _positions(mem: Memory, session_turns: Sequence[Turn]) -> list[int]:
    """Positions (indices into `session_turns`) of a memory's source turns."""
    pos = mem.metadata.get("positions")
    if isinstance(pos, (list, tuple)) and len(pos) == 2 and len(mem.turn_ids) == pos[1] - pos[0]:
        a, b = int(pos[0]), int(pos[1])
        if 0 <= a < b <= len(session_turns) and all(
            session_turns[a + i].turn_id == tid for i, tid in enumerate(mem.turn_ids)
        ):
            return list(range(a, b))
    by_id = {t.turn_id: i for i, t in enumerate(session_turns)}
    return [by_id[tid] for tid in mem.turn_ids if tid in by_id]


def collect_votes(
    ranked: Sequence[Memory],
    session_turns: Callable[[str], Sequence[Turn]],
    *,
    rrf_k: int,
    context_weight: float,
    provisional: Collection[str] = frozenset(),
) -> TurnVotes:
    """Turn a ranking of memory units into votes for turns.

    A turn no coarse unit covers yet (its session is still open) would get a context vote
    once its session ends and is cut into segments; until then its own `turn` unit, when
    its id is in `provisional`, also votes for it as a coarse unit ranked like itself
    (`1 + context_weight` in all), so it ranks as it will once its session ends.

    Args:
        ranked: Memory units in rank order.
        session_turns: The turns of a session, in order (cached by the caller).
        rrf_k: Reciprocal-rank constant of the votes (the fusion's).
        context_weight: Vote of a coarse unit for each of its turns (a turn's own key: 1).
        provisional: Ids of `turn` units whose turn no coarse unit covers yet.

    Returns:
        The votes.
    """
    votes = TurnVotes()
    for rank, mem in enumerate(ranked):
        base = 1.0 / (rrf_k + rank + 1)
        turns = session_turns(mem.session_id) if mem.turn_ids else ()
        pos = _positions(mem, turns) if turns else []
        if not pos:
            if not mem.turn_ids:  # a memory written directly: it competes as it is
                votes.loose[mem.id] = votes.loose.get(mem.id, 0.0) + base
                votes.loose_memories[mem.id] = mem
                votes.first_seen.setdefault(mem.id, len(votes.first_seen))
            continue
        weight = 1.0 if mem.granularity == "turn" else context_weight
        if mem.id in provisional:
            weight += context_weight
        for p in pos:
            votes.add((mem.session_id, p), weight * base, mem.id)
    return votes


def _epoch(ts: datetime | None) -> float | None:
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.timestamp()


def apply_recency(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    weight: float,
    top: int = 10,
    margin: float = 1.0,
    changes: bool = True,
) -> bool:
    """Scale the votes of the best turns by `1 + weight * r`, newest first.

    The turns that compete are the `top` best whose vote is at least `(1 - margin)` times the
    best vote, and (with `changes`) those of the `top` that state a change
    (`states_a_change`: "I'm moving to Neukölln" competes with an older "I live in Alfama"
    even when it matches the question's words less). `r` is 0 for the oldest of them and 1 for
    the newest by their session's time (a later turn of the same conversation is no update,
    so turns of one session keep their order), so the newest of the memories that answer wins;
    weaker turns are left alone (a recent but unrelated turn is not pulled up).

    Returns:
        Whether any vote changed (False when fewer than two distinct times are known).
    """
    pool = sorted(votes.turn, key=lambda x: -votes.turn[x])[:top]
    if pool:
        floor = (1.0 - margin) * votes.turn[pool[0]]
        pool = [
            key
            for key in pool
            if votes.turn[key] >= floor
            or (changes and states_a_change(session_turns(key[0])[key[1]].text))
        ]
    times: dict[tuple[str, int], float] = {}
    for key in pool:
        e = _epoch(turn_time(session_turns(key[0]), 0))  # its session's time
        if e is not None:
            times[key] = e
    if weight <= 0 or len(set(times.values())) < 2:
        return False
    lo, hi = min(times.values()), max(times.values())
    for key, e in times.items():
        votes.turn[key] *= 1.0 + weight * (e - lo) / (hi - lo)
    return True


_CHANGE = re.compile(
    r"\b(?:moved|moving|relocat\w*|new (?:job|flat|apartment|house|home|address|role|position|"
    r"name|number|car|partner|place)|no longer|not any ?more|switched|changed|quit|left my|"
    r"I'm now|from now on|instead)\b",
    re.IGNORECASE,
)


def states_a_change(text: str) -> bool:
    """Whether a turn says something changed: a move, a new job or name, "no longer", ...

    Example:
        >>> states_a_change("I found a flat! I'm moving to Neukölln on August 1.")
        True
        >>> states_a_change("I live in Alfama in Lisbon.")
        False
    """
    return _CHANGE.search(text) is not None


def turn_time(turns: Sequence[Turn], position: int) -> datetime | None:
    """When a turn was said: its timestamp, else its session's first known time."""
    ts = turns[position].timestamp
    if ts is None:
        ts = next((x.timestamp for x in turns if x.timestamp is not None), None)
    return ts


def apply_time_frame(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    start: datetime,
    end: datetime,
    weight: float,
) -> int:
    """Multiply the votes of the turns said in `[start, end)` by `1 + weight`.

    Naive times are taken as UTC.

    Returns:
        How many turn votes were raised.
    """
    if weight <= 0:
        return 0
    lo, hi = _epoch(start), _epoch(end)
    raised = 0
    for key in votes.turn:
        e = _epoch(turn_time(session_turns(key[0]), key[1]))
        if e is not None and lo is not None and hi is not None and lo <= e < hi:
            votes.turn[key] *= 1.0 + weight
            raised += 1
    return raised


_TO_ASSISTANT = re.compile(  # what the assistant said before, not a request ("can you suggest")
    r"\b(?:you|you've|you have|you had) (?:said|told|gave|given|wrote|written|mentioned|"
    r"recommended|suggested|provided|listed|named|shared|explained|described|made|created|"
    r"proposed|came up with)\b"
    r"|\bdid you (?:say|tell|give|write|mention|recommend|suggest|provide|list|name|share|"
    r"explain|describe)\b"
    r"|\byour (?:suggestion|recommendation|advice|answer|list)",
    re.IGNORECASE,
)
_BACK_TO_CHAT = re.compile(  # both sides spoke: "remind me", "our last chat", "we decided"
    r"\bremind me\b|\bour (?:previous|last|earlier|other) (?:chat|conversation|discussion|talk)"
    r"|\bwe (?:talked|discussed|decided|agreed|chatted)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(?:I|my|me|mine|myself|I'm|I've|I'd)\b")


def addressed_role(query: str) -> str | None:
    """Whose words a question about a two-role chat asks for, from its person.

    "What did you recommend for ...?" asks for the assistant's turns; "Where do I work?" for
    the user's. A request ("Can you suggest a show for me?") is answered from what the user
    said they like, so it is the user's. A question back to an earlier chat ("remind me",
    "our previous conversation", "we decided") may be answered by either side: None, as
    for a question with neither cue.

    Example:
        >>> addressed_role("Which hotel did you recommend?"), addressed_role("Where do I work?")
        ('assistant', 'user')
        >>> addressed_role("Can you suggest something I could cook tonight?")
        'user'
        >>> addressed_role("When is the concert?") is None
        True
    """
    if _TO_ASSISTANT.search(query):
        return "assistant"
    if _BACK_TO_CHAT.search(query):
        return None
    if _FIRST_PERSON.search(query):
        return "user"
    return None


def apply_speaker_focus(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    speaker: str,
    focus: float,
    speakers: Collection[str] | None = None,
    keep: Callable[[Turn], bool] | None = None,
) -> int:
    """Scale the votes of turns not spoken by `speaker` by `1 - focus`.

    A question about one person ("What does Kate do on weekends?") is answered by what that
    person said; the other side's turns still count, less. With `speakers`, a turn's
    `Name: ` label counts only when it is one of them (a user's "Remember: ..." was said by
    the user, not by "Remember"); pass the roles alone to compare by role. A turn for which
    `keep` is true is never scaled (asked only of the other speakers' turns).

    Returns:
        How many turn votes were scaled down.
    """
    if focus <= 0:
        return 0
    want = speaker.strip().casefold()
    scaled = 0
    for key in votes.turn:
        turn = session_turns(key[0])[key[1]]
        who = speaker_of(turn)
        if speakers is not None and who not in speakers:
            who = turn.role
        if who.strip().casefold() != want and not (keep is not None and keep(turn)):
            votes.turn[key] *= 1.0 - focus
            scaled += 1
    return scaled


def turn_line(turn: Turn, labels: Collection[str] = (), text: str | None = None) -> str:
    """How a turn reads inside a passage.

    `role: text`, or the text alone when it opens with a speaker's `Name: ` label (one of
    `labels`). `text` stands in for the turn's text (an excerpt of it).
    """
    body = turn.text if text is None else text
    if labels:
        who = speaker_of(turn)
        if who != turn.role and who in labels:
            return body
    return f"{turn.role}: {body}"


def _header(turns: Sequence[Turn], on: bool = True) -> str:
    if not on:
        return ""
    ts = next((t.timestamp for t in turns if t.timestamp is not None), None)
    date = format_date(ts)
    return f"[{date}]" if date else ""


def _passage_id(user_id: str, session_id: str, turn_ids: Iterable[str]) -> str:
    h = hashlib.sha1("\x1f".join([user_id, session_id, *turn_ids]).encode()).hexdigest()
    return f"passage-{h[:16]}"


def _render(
    turns: Sequence[Turn],
    positions: Sequence[int],
    header_on: bool = True,
    labels: Collection[str] = (),
    cut: dict[int, str] | None = None,
) -> str:
    lines = []
    header = _header(turns, header_on)
    if header:
        lines.append(header)
    prev = None
    for p in positions:
        if prev is not None and p != prev + 1:
            lines.append(GAP_MARK)
        lines.append(turn_line(turns[p], labels, (cut or {}).get(p)))
        prev = p
    return "\n".join(lines)


def _passage(
    user_id: str,
    sid: str,
    turns: Sequence[Turn],
    positions: Sequence[int],
    votes: TurnVotes,
    header_on: bool = True,
    cut: dict[int, str] | None = None,
) -> Memory:
    span = [turns[p] for p in positions]
    times = [t.timestamp for t in span if t.timestamp is not None]
    sources: list[str] = []
    for p in positions:
        for src in votes.sources.get((sid, p), []):
            if src not in sources:
                sources.append(src)
    turn_ids = tuple(t.turn_id for t in span)
    created = turns[0].timestamp or datetime.fromtimestamp(0, timezone.utc)
    text = _render(turns, positions, header_on, votes.labels, cut)
    metadata: dict[str, Any] = {
        "positions": list(positions),
        "sources": sources,
        "turn_votes": [round(votes.turn.get((sid, p), 0.0), 6) for p in positions],
    }
    if cut:
        metadata["excerpts"] = sorted(cut)
    return Memory(
        id=_passage_id(user_id, sid, turn_ids),
        user_id=user_id,
        session_id=sid,
        granularity=PASSAGE_GRANULARITY,
        text=text,
        key=text,
        turn_ids=turn_ids,
        created_at=created,
        updated_at=created,
        start_time=times[0] if times else None,
        end_time=times[-1] if times else None,
        metadata=metadata,
    )


def _by_density(
    items: list[tuple[float, int, Any]],
    cost_of: Callable[[Any], int],
    exponent: float,
    keep: int = 1,
    free: float = 1.0,
    keep_budget: float = 0.0,
    pool: int = 400,
) -> list[tuple[float, int, Any]]:
    """Reorder the best `pool` items by vote per relative cost; the rest keep vote order.

    An item's cost is relative to the median cost of the pool and never below 1: items
    longer than the median are discounted, shorter ones get no bonus (so cheap small talk is
    not pulled above what answers).
    """
    head, tail = items[:pool], items[pool:]
    costs = [max(1, cost_of(key)) for _, _, key in head]
    mid = free * float(np.median(costs))
    spent = 0
    while keep < len(head) and spent + costs[keep] <= keep_budget:
        spent += costs[keep]
        keep += 1
    kept, head, costs = head[:keep], head[keep:], costs[keep:]
    if not head:
        return items
    scored = [
        (item[0] / max(1.0, c / mid) ** exponent, item) for item, c in zip(head, costs, strict=True)
    ]
    scored.sort(key=lambda x: (-x[0], x[1][1]))
    return kept + [item for _, item in scored] + tail


class _Costs:
    """Token costs of turn lines, headers and turnless memories, cached by what they belong to.

    Keyed by `(session_id, position)` for a turn's line and by session for its header, so a
    long turn is neither rendered nor hashed again; `cache` may be kept by the caller for as
    long as the turns do not change (one index version).
    """

    def __init__(
        self,
        votes: TurnVotes,
        session_turns: Callable[[str], Sequence[Turn]],
        count: Callable[[str], int],
        date_header: bool,
        cache: dict[Any, Any] | None,
    ) -> None:
        self.votes = votes
        self.session_turns = session_turns
        self.count = count
        self.date_header = date_header
        self.cache: dict[Any, Any] = {} if cache is None else cache

    def of(self, key: Any) -> int:
        """Cost of a turn (`(session_id, position)`) or of a turnless memory (its id)."""
        if isinstance(key, str):
            return self.count(self.votes.loose_memories[key].text)
        n = self.cache.get(key)
        if n is None:
            turn = self.session_turns(key[0])[key[1]]
            n = self.cache[key] = self.count(turn_line(turn, self.votes.labels))
        return int(n)

    def capped(self, key: Any, cap: int) -> int:
        """`min(cap, of(key))`, counting no more of a long turn's line than it takes to tell.

        A line whose opening already counts more than `cap` costs more than `cap` (a counter
        never counts a text's prefix above the text), so the rest of it is not counted.
        """
        if isinstance(key, str):
            return min(cap, self.of(key))
        n = self.cache.get(key)
        if n is not None:
            return min(cap, int(n))
        slot = ("over", *key)  # what the line's opening counted: the line costs at least that
        over = self.cache.get(slot)
        if over is not None and over > cap:
            return cap
        line = turn_line(self.session_turns(key[0])[key[1]], self.votes.labels)
        head = line[: _OPENING_CHARS * (cap + 1)]
        if len(head) < len(line):
            over = self.cache[slot] = self.count(head)
            if over > cap:
                return cap
        n = self.cache[key] = self.count(line)
        return min(cap, n)

    def pieces(self, key: tuple[str, int]) -> Pieces:
        """A turn's text cut into pieces for excerpts (once per index version)."""
        slot = ("pieces", *key)
        got = self.cache.get(slot)
        if got is None:
            got = self.cache[slot] = Pieces.of(self.session_turns(key[0])[key[1]].text, self.count)
        return got

    def header(self, sid: str) -> int:
        """Cost of the date header that opens a passage of session `sid`."""
        slot = ("header", sid, self.date_header)
        n = self.cache.get(slot)
        if n is None:
            text = _header(self.session_turns(sid), self.date_header)
            n = self.cache[slot] = self.count(text) if text else 0
        return int(n)


def pack_passages(
    user_id: str,
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    count: Callable[[str], int],
    *,
    k: int | None,
    budget: int | None,
    date_header: bool = True,
    length_exponent: float = 0.0,
    length_keep: int = 1,
    length_free: float = 1.0,
    length_keep_share: float = 0.0,
    cost_cache: dict[Any, Any] | None = None,
    query_terms: Collection[str] | None = None,
    excerpt_length: int = 0,
) -> tuple[list[Hit], int, bool]:
    """Take turns (and turnless memories) in vote order and group them into passages.

    With a budget, a session's chosen turns form one passage (one date header, `…` between
    runs that are not adjacent); an item whose cost (its line, plus the header when it opens a
    passage, plus a gap mark when it starts a new run) does not fit is skipped and later,
    smaller ones may still fit; packing stops when fewer than 10 tokens are left. With `k` as
    well, turns that would open a passage beyond the `k`-th are skipped. With only `k`, the
    top `k` turns are taken in vote order, each a passage of its own (`k` hits, as a caller of
    `retrieve(k=...)` expects).

    Args:
        user_id: Owner (for passage ids).
        votes: Turn votes from `collect_votes`.
        session_turns: The turns of a session, in order.
        count: Token counter.
        k: Most passages (hits).
        budget: Token budget of the passages' texts.
        date_header: Start each passage with its session's date.
        length_exponent: See `PassageConfig.length_exponent` (with a budget only).
        length_keep: The best-voted items that keep their place in front of the length-aware
            order (the clearest match is always read, however long).
        length_free: See `PassageConfig.length_free`.
        length_keep_share: See `PassageConfig.length_keep_share`.
        cost_cache: Token counts of turn lines and headers, kept by the caller while the turns
            do not change (they repeat from query to query).
        query_terms: The question's `lexical_tokens`, for excerpts.
        excerpt_length: See `PassageConfig.excerpt_length` (with a budget and `query_terms`
            only; 0: whole turns only).

    Returns:
        Hits (passages and turnless memories, best first), tokens used, and whether the cut was
        reached (False: candidates ran out first).
    """
    costs = _Costs(votes, session_turns, count, date_header, cost_cache)
    cut = excerpt_length if budget is not None and query_terms is not None else 0
    cost_of = costs.of
    if cut:

        def cost_of(key: Any) -> int:  # what a turn costs once cut to an excerpt
            return costs.of(key) if isinstance(key, str) else costs.capped(key, cut)

    items = _offer_order(
        votes, cost_of, budget, length_exponent, length_keep, length_free, length_keep_share
    )
    pick = _Selection(votes, costs, k, budget, gap=count(GAP_MARK))
    if cut and items:
        pick.excerpts = _Excerpts(query_terms or (), cut, _next_fit(items, costs, cost_of, budget))
    for vote, seen, key in items:
        if not pick.take(vote, seen, key):
            break
    return pick.hits(user_id, session_turns, date_header), pick.used, pick.filled


@dataclass(frozen=True)
class _Excerpts:
    """How `_Selection` cuts long turns: the question's words, the length, the room to leave."""

    terms: Collection[str]
    length: int
    reserve: int


def _next_fit(
    items: list[tuple[float, int, Any]],
    costs: _Costs,
    cost_of: Callable[[Any], int],
    budget: int | None,
) -> int:
    """What the best item that fits costs (as an excerpt when long), if the first one does not.

    An excerpt of the first item leaves that much room, so it never pushes out the turn that
    would have been read in its place.
    """

    def cost(key: Any, of: Callable[[Any], int]) -> int:
        return of(key) if isinstance(key, str) else of(key) + costs.header(key[0])

    if budget is None or cost(items[0][2], costs.of) <= budget:
        return 0
    for _, _, key in items[1:50]:
        c = cost(key, cost_of)
        if c <= budget:
            return c
    return 0


def _offer_order(
    votes: TurnVotes,
    cost_of: Callable[[Any], int],
    budget: int | None,
    length_exponent: float,
    length_keep: int,
    length_free: float,
    length_keep_share: float,
) -> list[tuple[float, int, Any]]:
    """Every turn and turnless memory as `(vote, first seen, key)`, in the order offered.

    By vote, then first seen; with a budget and a positive `length_exponent`, reordered by vote
    per relative cost (`_by_density`).
    """
    items: list[tuple[float, int, Any]] = [
        (v, votes.first_seen[key], key) for key, v in votes.turn.items()
    ]
    items += [(v, votes.first_seen[mid], mid) for mid, v in votes.loose.items()]
    items.sort(key=lambda x: (-x[0], x[1]))
    if budget is not None and length_exponent > 0 and items:
        items = _by_density(
            items,
            cost_of,
            length_exponent,
            length_keep,
            length_free,
            keep_budget=length_keep_share * budget,
        )
    return items


class _Selection:
    """Which turns (and turnless memories) `pack_passages` takes, in the order offered.

    With a budget, a session's turns share one passage (one header; a gap mark between runs
    that are not adjacent); without, every turn opens a passage of its own.
    """

    def __init__(
        self,
        votes: TurnVotes,
        costs: _Costs,
        k: int | None,
        budget: int | None,
        gap: int,
    ) -> None:
        self.votes, self.costs, self.k, self.budget, self.gap = votes, costs, k, budget, gap
        self.by_session = budget is not None
        self.excerpts: _Excerpts | None = None
        self.offered = 0
        self.cut: dict[str, dict[int, str]] = {}
        self.chosen: dict[str, set[int]] = {}
        self.best: dict[tuple[str, int], tuple[float, int]] = {}
        self.loose: list[tuple[float, int, Memory]] = []
        self.used = self.passages = 0
        self.filled = False

    def _full(self, opens: bool) -> bool | None:
        """Whether a new passage is refused by `k`: True stops packing, None skips the item."""
        if not (opens and self.k is not None and self.passages >= self.k):
            return False
        if self.budget is None:
            self.filled = True
            return True
        return None

    def take(self, vote: float, seen: int, key: Any) -> bool:
        """Offer one item; return False when packing is over."""
        budget = self.budget
        if budget is not None and budget - self.used < 10:
            self.filled = True
            return False
        first = self.offered == 0
        self.offered += 1
        if isinstance(key, str):
            full = self._full(True)
            if full is not False:
                return not full
            cost = self.costs.of(key)
            if budget is None or self.used + cost <= budget:
                self.used += cost
                self.passages += 1
                self.loose.append((vote, seen, self.votes.loose_memories[key]))
            return True
        sid, p = key
        cut = self.excerpts
        # a long turn is cut unless it is the clearest match: how long need not be counted
        line = (
            self.costs.capped(key, cut.length + 1)
            if budget is not None and cut is not None and not first
            else self.costs.of(key)
        )
        cost, opens, delta = self._turn_cost(sid, p, line)
        full = self._full(opens)
        if full is not False:
            return not full
        fits = budget is None or self.used + cost <= budget
        # whole: without excerpts, or when it fits and is short or the clearest match
        if budget is None or cut is None or (fits and (first or line <= cut.length)):
            if fits:
                self._add(vote, seen, sid, p, cost, delta)
            return True
        if first:  # the clearest match, too long for the budget: cut to the room left
            room = budget - self.used - cut.reserve - (cost - line)
        else:
            room = min(cut.length, budget - self.used - (cost - line))
        got = self._excerpt(sid, p, room, cut.terms)
        if got is not None and self.used + cost - line + got[1] <= budget:
            self.cut.setdefault(sid, {})[p] = got[0]
            self._add(vote, seen, sid, p, cost - line + got[1], delta)
        return True

    def _add(self, vote: float, seen: int, sid: str, p: int, cost: int, delta: int) -> None:
        self.used += cost
        self.passages += delta
        self.chosen.setdefault(sid, set()).add(p)
        self.best.setdefault((sid, p), (vote, seen))

    def _excerpt(
        self, sid: str, p: int, room: int, terms: Collection[str]
    ) -> tuple[str, int] | None:
        """An excerpt of a turn whose line costs at most about `room` tokens, and that cost.

        None when fewer than 10 tokens would be left for the text.
        """
        turn, count = self.costs.session_turns(sid)[p], self.costs.count
        label = count(turn_line(turn, self.votes.labels, ""))  # "role: ", or none
        room -= label
        text = excerpt(self.costs.pieces((sid, p)), terms, room, count) if room >= 10 else None
        return None if text is None else (text, label + count(text))

    def hits(
        self, user_id: str, session_turns: Callable[[str], Sequence[Turn]], date_header: bool
    ) -> list[Hit]:
        """The items taken as hits, best first: passages and turnless memories.

        With a budget a session's chosen turns form one passage; without, each turn is one.
        """
        entries: list[tuple[float, int, Memory]] = []
        for sid, have in self.chosen.items():
            turns = session_turns(sid)
            groups = [sorted(have)] if self.by_session else [[q] for q in sorted(have)]
            for positions in groups:
                best = max((self.best[(sid, q)] for q in positions), key=lambda b: (b[0], -b[1]))
                cut = {q: t for q, t in self.cut.get(sid, {}).items() if q in positions}
                mem = _passage(user_id, sid, turns, positions, self.votes, date_header, cut)
                entries.append((best[0], best[1], mem))
        entries += self.loose
        entries.sort(key=lambda e: (-e[0], e[1]))
        return [Hit(mem, float(v), i, {"vote": v}) for i, (v, _, mem) in enumerate(entries)]

    def _turn_cost(self, sid: str, p: int, cost: int) -> tuple[int, bool, int]:
        """A turn's cost in context, whether it opens a passage, and the passages it adds.

        `cost` is what the turn's line costs (its excerpt's, when cut).
        """
        if not self.by_session:
            return cost + self.costs.header(sid), True, 1
        have = self.chosen.get(sid, set())
        left, right = p - 1 in have, p + 1 in have
        if not have:
            return cost + self.costs.header(sid), True, 1
        if not left and not right:
            return cost + self.gap, False, 0
        if left and right:
            return cost - self.gap, False, 0
        return cost, False, 0
