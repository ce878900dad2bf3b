"""Passages of whole turns for the reader: voted turns packed into a budget, grouped by session.

Turns (`retrieval.turn_votes`) are taken in vote order while they fit the token budget
and grouped per session into `passage` memories: one date header per session, the session's
chosen turns in their original order, `…` where turns are skipped. No turn appears twice, and the
budget counts every token the reader gets, headers and role labels included. Long turns are read
as excerpts (`retrieval.excerpts`); with a budget, long items are offered later unless
they out-vote what they would crowd out (`PassageConfig.length_exponent`). Units that carry no
turns (memories written with `put_memory`) compete as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

import numpy as np

from reflective_memory.errors import ConfigError
from reflective_memory.retrieval.excerpts import Pieces, excerpt
from reflective_memory.retrieval.redundancy import signature
from reflective_memory.retrieval.speakers import speaker_of
from reflective_memory.retrieval.time_words import check_languages
from reflective_memory.retrieval.turn_votes import TurnVotes, conversation_spans
from reflective_memory.settings import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    set_field,
)
from reflective_memory.text import format_date, short_words
from reflective_memory.types import Hit, Memory, Turn

__all__ = [
    "PASSAGE_GRANULARITY",
    "GAP_MARK",
    "PassageConfig",
    "pack_passages",
    "prepare_turns",
    "turn_line",
]

#: Granularity of the memories `retrieve` returns in passage mode.
PASSAGE_GRANULARITY = "passage"
#: Line put between two non-adjacent runs of turns inside one passage.
GAP_MARK = "…"
#: Characters per token of the opening `_Costs.capped` counts first (English words average
#: under six with their space, so the opening usually decides).
_OPENING_CHARS = 8


@dataclass(frozen=True)
class PassageConfig:
    """Small-to-big retrieval: how ranked units become passages of whole turns.

    Attributes:
        enabled: Resolve the ranking to turns and return `passage` memories built for the
            reader (see `ReflectiveMemory.retrieve`); `False` returns the ranked units.
        context_weight: Vote of a coarse unit (segment, session, topic, note) for each of its
            turns, relative to a turn's own key (1.0).
        recency: Present-tense questions ("now", "currently", "these days", "still") lift the
            newest of the best turns, and the cue's words are left out of the search (`False`:
            off).
        time_frame: A question anchored in time ("two weeks ago", "last summer", "on 29 Dec
            2023"; `retrieval.timeframe`) lifts the turns said in that period, resolved
            against the call's `now` (`False`: off).
        languages: The languages `recency` and `time_frame` read a question in: `en` by this
            package's own rules, any other code dateparser has locale data for through that
            data ("jetzt", "vor zwei Wochen", "i fjor"; `retrieval.time_words`). Their phrases
            are gathered at a process's first question (about 50 ms, once); a question holding
            none of them then costs about 10 microseconds more, however many languages are
            listed, and one that does is parsed by dateparser (0.4-3 ms).
        speaker_focus: A question naming exactly one of the speakers of the user's turns
            ("What does Kate do on weekends?") is searched without the name, and what that
            speaker said is preferred (`False`: off).
        person_focus: In a chat of `user` and `assistant` turns, a question that names no
            speaker but asks in the first person ("where do I work?") prefers the user's
            turns, one that asks what "you said / recommended" the assistant's; a turn
            holding the question word for word is not held back (`False`: off).
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
            question's words (`retrieval.excerpts`). The best-voted turn is read whole
            when it fits, else as an excerpt of the room the budget leaves beside the next
            turn that fits. 0 reads whole turns only. At 50: +6.3 points at 250 words on
            LongMemEval dev100, +6.8 on REALTALK (BENCHMARKS.md, issue 27).
        ranker: How the cues weigh a voted turn: `learned`, one log-linear model over every
            cue (`reflective_memory.retrieval`, fitted on the dev sets for coverage and for
            putting the newest statement first, shipped with the package; cross-validated in
            BENCHMARKS.md), or the path of a model file written by
            `reflective-memory bench fit-ranker`. The cue settings above only switch a cue
            on or off; the model weighs it.
    """

    enabled: bool = True
    context_weight: float = 0.25
    recency: bool = True
    time_frame: bool = True
    languages: tuple[str, ...] = ("en", "de", "fr", "es", "nb", "it", "pt", "nl", "sv", "da")
    speaker_focus: bool = True
    person_focus: bool = True
    length_exponent: float = 0.5
    length_free: float = 2.0
    length_keep_share: float = 0.25
    budget_unit: str = "tokens"
    excerpt_length: int = 50
    ranker: str = "learned"

    #: Settings of earlier versions: what took their place (`settings.coerce` raises it).
    RETIRED: ClassVar[dict[str, str]] = {
        "recency_weight": "is now passages.recency, True or False (the learned ranker weighs "
        "the cue; its strength is no setting)",
        "time_weight": "is now passages.time_frame, True or False (the learned ranker weighs "
        "the cue; its strength is no setting)",
        "recency_margin": "was removed with passages.ranker='rules', the only ranker that read it",
    }

    def __post_init__(self) -> None:
        for name in ("enabled", "recency", "time_frame", "speaker_focus", "person_focus"):
            check_bool(f"passages.{name}", getattr(self, name))
        set_field(self, "languages", check_languages("passages.languages", self.languages))
        if self.ranker == "rules":
            raise ConfigError(
                "passages.ranker='rules' was removed: the learned ranker replaces it (it weighs "
                "the same cues and cross-validated better, BENCHMARKS.md); use 'learned' or a "
                "model file"
            )
        if not isinstance(self.ranker, str) or not self.ranker.strip():
            raise ConfigError(
                f"passages.ranker must be 'learned' or a model file, got {self.ranker!r}"
            )
        for name in ("context_weight", "length_exponent"):
            check_number(f"passages.{name}", getattr(self, name), 0)
        check_int("passages.excerpt_length", self.excerpt_length, 0)
        check_number("passages.length_keep_share", self.length_keep_share, 0, 1)
        check_number("passages.length_free", self.length_free, 0, open_low=True)
        check_choice("passages.budget_unit", self.budget_unit, ("tokens", "words"))


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


def prepare_turns(
    cache: dict[Any, Any],
    session_id: str,
    turns: Sequence[Turn],
    labels: Collection[str],
    *,
    count: Callable[[str], int],
    excerpt_length: int,
) -> None:
    """Fill `pack_passages`' cost cache for one session's turns ahead of any question.

    Per turn: its line's cost, its `short_words` (what tells a short turn,
    `redundancy.is_short`), its words for near-duplicates (`redundancy.signature`), and, for a
    line longer than `excerpt_length`, its pieces for excerpts; per session, its conversations
    (`turn_votes.conversation_spans`). Entries already there are kept.
    """
    for p, turn in enumerate(turns):
        key = (session_id, p)
        n = cache.get(key)
        if n is None:
            n = cache[key] = count(turn_line(turn, labels))
        if excerpt_length and n > excerpt_length and ("pieces", session_id, p) not in cache:
            cache["pieces", session_id, p] = Pieces.of(turn.text, count)
        if ("words", session_id, p) not in cache:
            cache["words", session_id, p] = short_words(turn.text)
        if ("dup", session_id, p) not in cache:
            cache["dup", session_id, p] = signature(turn.text)
    if ("spans", session_id, 0) not in cache:
        cache["spans", session_id, 0] = conversation_spans(turns)


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
            riders = self.votes.riders
            groups = (
                [sorted(have)]
                if self.by_session
                else [sorted({q, *riders.get((sid, q), ())}) for q in sorted(have)]
            )
            for positions in groups:
                best = max(
                    (self.best[(sid, q)] for q in positions if (sid, q) in self.best),
                    key=lambda b: (b[0], -b[1]),
                )
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
