"""Votes for turns: ranked memory units become votes for the turns they were built from.

Every ranked unit votes for its turns with a reciprocal-rank weight (`weight / (rrf_k + rank +
1)`, the fusion's rule), so a turn found by its own key and inside a well-ranked segment rises
above a turn found once (`collect_votes`). What the question asks (`retrieval.cues`) is read
against the voted turns here: how new each of the best turns is for a question about the
present (`recency_ranks`), the turns inside a question's time frame (`in_time_frame`), the
turns someone other than the asked-about speaker said (`other_speakers`). These become
features the learned ranker weighs (`retrieval.features`); `retrieval.passages` packs the
voted turns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from reflective_memory.retrieval.speakers import speaker_of
from reflective_memory.types import Memory, SessionTurns, Turn

__all__ = [
    "RECENCY_RELEVANCE",
    "TurnVotes",
    "collect_votes",
    "recency_ranks",
    "in_time_frame",
    "other_speakers",
    "turn_time",
    "conversation_bounds",
    "conversation_spans",
    "conversation_time",
    "unit_positions",
]

#: The share of the best competing turn's query cosine a turn's own must reach to compete on
#: time for a present-tense question (`recency_ranks`).
RECENCY_RELEVANCE = 0.5


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
    riders: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, key: tuple[str, int], vote: float, source: str | None) -> None:
        """Add a vote for a turn (and remember which memory gave it)."""
        self.add_all(key[0], (key[1],), vote, source)

    def add_all(
        self, session_id: str, positions: Iterable[int], vote: float, source: str | None
    ) -> None:
        """Add the same vote for several turns of one session, in order (see `add`)."""
        turn, first, sources = self.turn, self.first_seen, self.sources
        for p in positions:
            key = (session_id, p)
            turn[key] = turn.get(key, 0.0) + vote
            first.setdefault(key, len(first))
            if source is not None:
                srcs = sources.setdefault(key, [])
                if source not in srcs:
                    srcs.append(source)


def unit_positions(mem: Memory, session_turns: Sequence[Turn]) -> list[int]:
    """Positions (indices into `session_turns`) of a memory's source turns."""
    pos = mem.metadata.get("positions")
    if isinstance(pos, (list, tuple)) and len(pos) == 2 and len(mem.turn_ids) == pos[1] - pos[0]:
        a, b = int(pos[0]), int(pos[1])
        ids = [t.turn_id for t in session_turns[a:b]] if 0 <= a < b <= len(session_turns) else []
        if ids and ids == list(mem.turn_ids):
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
        pos = unit_positions(mem, turns) if turns else []
        if not pos:
            if not mem.turn_ids:  # a memory written directly: it competes as it is
                votes.loose[mem.id] = votes.loose.get(mem.id, 0.0) + base
                votes.loose_memories[mem.id] = mem
                votes.first_seen.setdefault(mem.id, len(votes.first_seen))
            continue
        weight = 1.0 if mem.granularity == "turn" else context_weight
        if mem.id in provisional:
            weight += context_weight
        votes.add_all(mem.session_id, pos, weight * base, mem.id)
    return votes


def _epoch(ts: datetime | None) -> float | None:
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.timestamp()


def recency_ranks(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    top: int = 10,
    relevance: Callable[[tuple[str, int]], float | None] | None = None,
    answers: Callable[[tuple[str, int]], bool] | None = None,
) -> dict[tuple[str, int], float]:
    """How new each turn competing on time is: 0 for the oldest of them, 1 for the newest.

    The turns that compete are the `top` best. With `relevance` (a turn's own query cosine, None
    when its key was not ranked), one whose cosine is below `RECENCY_RELEVANCE` of the best
    one's does not compete: fused votes of a small history are close, but "Tusen takk!" is no
    answer to "What am I allergic to?" however new. Time is their conversation's
    (`conversation_time`: a later turn of the same conversation is no update, so its turns keep
    their order), so a log kept under one session id still tells the months apart. With
    `answers`, only the turns it accepts compete (a "when" question: the turns that name a time;
    a newer turn without one does not answer it). When every competing turn has one time (a
    history imported without times: each turn took the time of the one before it), their
    conversations compete in the order they were stored (the `seq` of each one's first turn).

    Returns:
        `r` per competing turn; empty when they all belong to one conversation of one time.
    """
    pool = sorted(votes.turn, key=lambda x: -votes.turn[x])[:top]
    if answers is not None:
        pool = [key for key in pool if answers(key)]
    if pool:
        cosines = {key: relevance(key) for key in pool} if relevance is not None else {}
        known = [c for c in cosines.values() if c is not None]
        near = RECENCY_RELEVANCE * max(known) if known else None

        def close(key: tuple[str, int]) -> bool:
            cos = cosines.get(key)
            return near is None or cos is None or cos >= near

        pool = [key for key in pool if close(key)]
    times: dict[tuple[str, int], float] = {}
    for key in pool:
        e = _epoch(conversation_time(session_turns(key[0]), key[1]))
        if e is not None:
            times[key] = e
    if len(set(times.values())) < 2:  # one time for all (a log without times): their order
        for key in pool:
            turns = session_turns(key[0])
            times[key] = float(turns[conversation_bounds(turns, key[1])[0]].seq)
    if len(set(times.values())) < 2:
        return {}
    lo, hi = min(times.values()), max(times.values())
    return {key: (e - lo) / (hi - lo) for key, e in times.items()}


def turn_time(turns: Sequence[Turn], position: int) -> datetime | None:
    """When a turn was said: its timestamp, else its session's first known time."""
    ts = turns[position].timestamp
    if ts is None:
        ts = next((x.timestamp for x in turns if x.timestamp is not None), None)
    return ts


#: A silence longer than this inside one session starts a new conversation
#: (`conversation_time`): the live idle time, `sessions.idle_seconds`' default.
CONVERSATION_GAP_SECONDS = 1800.0


def conversation_time(turns: Sequence[Turn], position: int) -> datetime | None:
    """When the conversation a turn belongs to began.

    A session's turns are one conversation until a silence of more than
    `CONVERSATION_GAP_SECONDS` between two timed turns (a log kept under one session id, or a
    session resumed days later); the conversation's time is its first timed turn's. A session
    without such a silence has its first known time, as `turn_time(turns, 0)`.
    """
    start: datetime | None = None
    last: datetime | None = None
    for turn in turns[: position + 1]:
        ts = turn.timestamp
        if ts is None:
            continue
        ts = ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)
        if last is None or (ts - last).total_seconds() > CONVERSATION_GAP_SECONDS:
            start = ts
        last = ts
    return start if start is not None else turn_time(turns, position)


def conversation_bounds(turns: Sequence[Turn], position: int) -> tuple[int, int]:
    """First and last position of the conversation a turn belongs to (`conversation_time`)."""
    return conversation_spans(turns)[position]


def conversation_spans(turns: Sequence[Turn]) -> list[tuple[int, int]]:
    """`conversation_bounds` of every turn of a session, in one pass.

    A conversation also starts where the session was found to start one when it was stored
    (`SessionTurns.conversation_starts`: a long log without times).
    """
    cuts = [0]
    last: datetime | None = None
    for i, turn in enumerate(turns):
        ts = turn.timestamp
        if ts is None:
            continue
        ts = ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)
        if last is not None and (ts - last).total_seconds() > CONVERSATION_GAP_SECONDS:
            cuts.append(i)
        last = ts
    if isinstance(turns, SessionTurns) and turns.conversation_starts:
        cuts = sorted({*cuts, *(p for p in turns.conversation_starts if 0 < p < len(turns))})
    cuts.append(len(turns))
    spans: list[tuple[int, int]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        spans += [(a, b - 1)] * (b - a)
    return spans


def in_time_frame(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    start: datetime,
    end: datetime,
) -> list[tuple[str, int]]:
    """The voted turns said in `[start, end)` (naive times are taken as UTC)."""
    lo, hi = _epoch(start), _epoch(end)
    if lo is None or hi is None:
        return []
    out = []
    for key in votes.turn:
        e = _epoch(turn_time(session_turns(key[0]), key[1]))
        if e is not None and lo <= e < hi:
            out.append(key)
    return out


def other_speakers(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    speaker: str,
    speakers: Collection[str] | None = None,
    keep: Callable[[Turn], bool] | None = None,
) -> list[tuple[str, int]]:
    """The voted turns not spoken by `speaker`.

    With `speakers`, a turn's `Name: ` label counts only when it is one of them (a user's
    "Remember: ..." was said by the user, not by "Remember"); pass the roles alone to compare
    by role. A turn for which `keep` is true is never counted as another's.
    """
    want = speaker.strip().casefold()
    # with `speakers`, a label counts only when it is one of them: a turn opening with none
    # of their labels is its role's, and its label need not be read
    opens = None if speakers is None else tuple(f"{s}: " for s in speakers)
    out = []
    folded: dict[str, str] = {}  # a speaker's name as compared (few names, many turns)
    for key in votes.turn:
        turn = session_turns(key[0])[key[1]]
        if opens is not None and not turn.text.startswith(opens):
            who = turn.role
        else:
            who = speaker_of(turn)
            if speakers is not None and who not in speakers:
                who = turn.role
        name = folded.get(who)
        if name is None:
            name = folded[who] = who.strip().casefold()
        if name != want and not (keep is not None and keep(turn)):
            out.append(key)
    return out
