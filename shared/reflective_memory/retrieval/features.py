"""One row of features per voted turn: every cue the pipeline computes, as numbers.

The rows are what `TurnRanker` weighs. Each feature is a signal the retrieval already has for a
candidate turn; none is a word list of its own. A turn's length is not one of them: what a turn
costs is the packing's to weigh (`passages.length_exponent`, excerpts); with length as a feature
the model preferred long turns, which cost budget (cross-validated coverage of turns packed by
words, without it: up to +2.4 points on LongMemEval at 500 words, at worst -0.4 on REALTALK).

- `log_vote`: the turn's small-to-big vote (`turn_votes.collect_votes`: its own key's and its
  segments' reciprocal ranks), as `log(vote * (rrf_k + 1))` (0 for a first-ranked turn key);
- `own_rank`: its own key's reciprocal rank, `rrf_k / (rrf_k + rank + 1)` (0 when unranked);
- `cosine`, `cosine_gap`: its own key's query cosine, and that minus the best candidate's;
- `bm25`: its own key's BM25 score over the best candidate's;
- `other_speaker`: the question names one speaker and someone else said the turn;
- `other_person`: in a user/assistant chat the question asks in the first (or second) person
  and the other role said it (`cues.addressed_role`);
- `recent`: for a present-tense question, how new the turn is among the best ten
  (`turn_votes.recency_ranks`, 0 oldest to 1 newest; 0 otherwise); for one that asks for a
  time ("When is my sister's wedding?"), among those of them that date something beyond their
  own day, so the newest date given wins, not a newer turn without one or one that only says
  "today" ("I booked the flights today");
- `in_frame`: said inside the period the question names ("two weeks ago");
- `dated`: the question asks for a time ("When is ...?", `cues.asks_when`) and the turn names
  one ("on September 6", "yesterday", or its own day: "I got this today" dates what it tells;
  `timeframe.time_frame` finds a period in it);
- `small_talk`: a turn too short to stand alone, read with the turn before it
  (`redundancy.riders`);
- `neighbour`: the best vote of the turns next to it, over the best vote;
- `user`: said under the `user` role;
- `position`: where it sits in its conversation, 0 (first) to 1 (last): its session, or the
  part of it between two silences of over 30 minutes (a log kept under one session id).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from reflective_memory.retrieval.timeframe import time_frame
from reflective_memory.retrieval.turn_votes import (
    TurnVotes,
    conversation_spans,
    in_time_frame,
    other_speakers,
    recency_ranks,
)
from reflective_memory.types import Turn

__all__ = ["FEATURES", "TurnFeatures", "names_a_time", "turn_features"]

#: Any fixed day: `names_a_time` asks only whether a period is named, not which.
_SOME_DAY = datetime(2000, 1, 1, tzinfo=timezone.utc)

FEATURES: tuple[str, ...] = (
    "log_vote",
    "own_rank",
    "cosine",
    "cosine_gap",
    "bm25",
    "other_speaker",
    "other_person",
    "recent",
    "in_frame",
    "dated",
    "small_talk",
    "neighbour",
    "user",
    "position",
)
#: `own`'s entry of a turn whose own key was not ranked.
_UNRANKED: tuple[int | None, dict[str, float]] = (None, {})


@dataclass(frozen=True)
class TurnFeatures:
    """The feature rows of one retrieval's voted turns.

    Attributes:
        keys: `(session_id, position)` of each row's turn.
        matrix: One row per key, columns in `FEATURES` order.
    """

    keys: list[tuple[str, int]]
    matrix: np.ndarray


@dataclass(frozen=True)
class QuestionSignals:
    """What the question says, as the cues stage read it.

    Attributes:
        speaker: The speaker (or role) a focus applies to, if any.
        speakers: Who counts as a speaker for the focus (the two roles for person focus).
        keep: Turns never counted as another's (a turn quoting the question).
        present: Whether the question asks about the present.
        frame: `(start, end)` of the period the question names, if any.
        when: Whether the question asks for a time.
    """

    speaker: str | None = None
    speakers: tuple[str, ...] = ()
    keep: Callable[[Turn], bool] | None = None
    present: bool = False
    frame: tuple[datetime, datetime] | None = None
    when: bool = False


def names_a_time(turn: Turn, *, beyond_its_day: bool = False) -> bool:
    """Whether a turn's text names a date or a period (`timeframe.time_frame` finds one).

    With `beyond_its_day`, only one that is not the day it was said: "on 6 September",
    "yesterday", "last March" date something else; "today" or "this week" say when the turn
    itself was said.
    """
    named = _time_named(turn)
    return named == _OTHER_DAY if beyond_its_day else named != _NO_TIME


#: `_time_named`'s answers: no period, the turn's own day ("today"), another one.
_NO_TIME, _OWN_DAY, _OTHER_DAY = 0, 1, 2


def _time_named(turn: Turn) -> int:
    frame = time_frame(turn.text, _SOME_DAY)
    if frame is None:
        return _NO_TIME
    return _OWN_DAY if frame.start <= _SOME_DAY < frame.end else _OTHER_DAY


def _position(
    turns: Sequence[Turn], sid: str, p: int, cache: dict[Any, Any] | None = None
) -> float:
    """Where a turn sits in its conversation, 0 (first) to 1 (last).

    A conversation is its session, or the part of it between two long silences
    (`turn_votes.conversation_spans`: a log kept under one session id). The spans are kept in
    `cache` under `("spans", session_id, 0)`.
    """
    slot = ("spans", sid, 0)
    spans = None if cache is None else cache.get(slot)
    if spans is None:
        spans = conversation_spans(turns)
        if cache is not None:
            cache[slot] = spans
    first, last = spans[p]
    return (p - first) / (last - first) if last > first else 0.0


def turn_features(
    votes: TurnVotes,
    session_turns: Callable[[str], Sequence[Turn]],
    own: dict[tuple[str, int], tuple[int | None, dict[str, float]]],
    signals: QuestionSignals,
    *,
    rrf_k: int,
    quiet: Collection[tuple[str, int]] = frozenset(),
    relevance: Callable[[tuple[str, int]], float | None] | None = None,
    cache: dict[Any, Any] | None = None,
) -> TurnFeatures:
    """The feature rows of the voted turns (see the module for each column).

    Args:
        votes: The turns' votes before any cue changed them.
        session_turns: A session's turns in order.
        own: Per voted turn, its own key's rank in the fused ranking (None when unranked)
            and that key's scores by ranker (`dense`, `lexical`).
        signals: What the question says.
        rrf_k: The fusion constant.
        quiet: The short turns read with the turn before them (`redundancy.riders`).
        relevance: A turn's own query cosine (`recency_ranks`' relevance rule).
        cache: Where the period a turn names is kept (`("dated", session_id, position)`; the
            text cache of `UserTurns.text_cache`, which lives as long as the turns do).

    Returns:
        The rows, in the order of `votes.turn`.
    """
    keys = list(votes.turn)
    if not keys:
        return TurnFeatures(keys, np.zeros((0, len(FEATURES))))
    vote = votes.turn
    best_vote = max(vote.values())
    mine = [own.get(k, _UNRANKED) for k in keys]
    cosines = [m[1].get("dense") for m in mine]
    bm25s = [m[1].get("lexical") for m in mine]
    best_cos = max((c for c in cosines if c is not None), default=None)
    best_bm25 = max((b for b in bm25s if b is not None), default=0.0)
    others = (
        set(other_speakers(votes, session_turns, signals.speaker, signals.speakers, signals.keep))
        if signals.speaker is not None
        else set()
    )
    person = signals.speakers == ("user", "assistant")
    scale = rrf_k + 1
    known = {} if cache is None else cache

    def named(sid: str, p: int, turn: Turn) -> int:
        got = known.get(("dated", sid, p))
        if got is None:
            got = known["dated", sid, p] = _time_named(turn)
        return int(got)

    def answers_when(key: tuple[str, int]) -> bool:
        return named(*key, session_turns(key[0])[key[1]]) == _OTHER_DAY

    ranks = (
        recency_ranks(
            votes,
            session_turns,
            relevance=relevance,
            answers=answers_when if signals.when else None,
        )
        if signals.present
        else {}
    )
    frame = (
        set(in_time_frame(votes, session_turns, *signals.frame))
        if signals.frame is not None
        else set()
    )

    rows: list[tuple[float, ...]] = []
    for key, (rank, _), cos, bm25 in zip(keys, mine, cosines, bm25s, strict=True):
        sid, p = key
        turns = session_turns(sid)
        turn = turns[p]
        cosine, gap = (cos, cos - best_cos) if cos is not None and best_cos is not None else (0, 0)
        other = key in others
        near = max(vote.get((sid, p - 1), 0.0), vote.get((sid, p + 1), 0.0))
        rows.append(  # in `FEATURES` order
            (
                math.log(max(vote[key] * scale, 1e-6)),  # log_vote
                0.0 if rank is None else rrf_k / (rrf_k + rank + 1),  # own_rank
                cosine,
                gap,  # cosine_gap
                bm25 / best_bm25 if bm25 is not None and best_bm25 > 0 else 0.0,  # bm25
                float(other and not person),  # other_speaker
                float(other and person),  # other_person
                ranks.get(key, 0.0),  # recent
                float(key in frame),  # in_frame
                float(signals.when and named(sid, p, turn) != _NO_TIME),  # dated
                float(key in quiet),  # small_talk
                near / best_vote if best_vote > 0 else 0.0,  # neighbour
                float(turn.role == "user"),  # user
                _position(turns, sid, p, known),  # position
            )
        )
    return TurnFeatures(keys, np.array(rows, dtype=np.float64))
