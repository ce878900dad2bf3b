"""What a turn adds beside the others: short turns ride with their anchor, duplicates count once.

Two rules, neither a word list, so they hold in any language and from a user's first turn:

- **Short turns never stand alone.** A turn of at most `SHORT_WORDS` words ("Got it.", "Tusen
  takk!", "Miso soup") is read with its *anchor*, the nearest turn before it in its session
  that is not short (`riders`). When its own score is higher than its anchor's (it answers
  what the anchor asked), it lifts the anchor to its score; it then follows its anchor, just
  below it, so a passage shows the two together, and a call with `k` alone shows it inside its
  anchor's hit (`ride`). A session that opens with short turns anchors them on its first
  turn that is not short. A short turn that lifted nothing is context a passage may show after
  its anchor, never a slot of its own. A statement with more words is never treated so,
  however often it is said.
- **Near-duplicates cost budget once.** Two turns are near-duplicates when their words,
  numbers aside, are the same set, and at least `DUPLICATE_OVERLAP` of all their distinct words
  (numbers included) are shared (`Distinct`): a request sent 200 times with a different number
  in it is one turn, while "I moved to Oslo in 2023" and "... in 2024" (5 of 7 words) stay two.
  In each candidate list a copy of a turn ranked above it in the same session (a flood) moves
  to the end, and the list makes room for as many distinct candidates as it held copies
  (`retrieval.votes.DistinctCandidates`; sayings of a fact on other days found on the way come
  with them); once every turn is scored only the best-voted of a set keeps a vote, to which
  the set's best `SAID_AGAIN` sayings on other days that the search found add theirs
  (`collapse_duplicates`). So a flood takes neither candidate slots nor ranks from an update,
  nor lines of a passage, and a fact said again on other days counts for it (each day's copy
  keeps its rank, and their votes add up) but takes one slot. Short turns are never collapsed
  ("Yes" means what its anchor asked), nor is an anchor a short turn lifted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from reflective_memory.retrieval.turn_votes import TurnVotes
from reflective_memory.text import short_words, words_of
from reflective_memory.types import Turn

__all__ = [
    "SHORT_WORDS",
    "DUPLICATE_OVERLAP",
    "SAID_AGAIN",
    "Distinct",
    "collapse_duplicates",
    "is_short",
    "lifting",
    "ride",
    "riders",
    "signature",
]

#: A turn of at most this many words is read with the turn before it, never alone.
SHORT_WORDS = 2
#: Share of two same-worded turns' distinct words (numbers included) they must share to count
#: as one.
DUPLICATE_OVERLAP = 0.8
#: How many sayings of a fact on other days add their votes to its best one. Without a bound,
#: a greeting that opens many sessions ("Hey, how is your day going so far?") summed the small
#: votes of its sayings (eight in a history of fifty sessions) above the turn that answers;
#: with two, a fact said on three days counts three times (measured: LongMemEval dev300 with
#: small talk opening every session, k=5 +1.1 cross-validated; REALTALK unchanged; one or a
#: harmonic sum instead lost up to 1.7 points of what repeated facts gain, BENCHMARKS "Messy
#: histories").
SAID_AGAIN = 2
#: What a rider's vote is of its anchor's: just below, so it is offered right after it.
_BEHIND = 0.999

Key = tuple[str, int]
SessionTurns = Callable[[str], Sequence[Turn]]
_NOT_READ = object()


def is_short(cache: dict[Any, Any], session_turns: SessionTurns, key: Key) -> bool:
    """Whether a turn has at most `SHORT_WORDS` words.

    Read from its `short_words`, kept in `cache` (the text cache of `UserTurns.text_cache`)
    under `("words", session_id, position)`.
    """
    slot = ("words", *key)
    words = cache.get(slot, _NOT_READ)
    if words is _NOT_READ:
        words = cache.setdefault(slot, short_words(session_turns(key[0])[key[1]].text))
    return words is not None and len(words) <= SHORT_WORDS  # type: ignore[arg-type]


def signature(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """A text's words without numbers, and all its words: what tells near-duplicates."""
    words = words_of(text)
    return frozenset(w for w in words if not w.isdigit()), words


def _signature(
    cache: dict[Any, Any], session_turns: SessionTurns, key: Key
) -> tuple[frozenset[str], frozenset[str]]:
    """A turn's `signature`, kept in `cache` under `("dup", session_id, position)`."""
    slot = ("dup", *key)
    got = cache.get(slot)
    if got is None:
        got = cache.setdefault(slot, signature(session_turns(key[0])[key[1]].text))
    return got  # type: ignore[no-any-return]


class Distinct:
    """Turns seen so far, to tell a near-duplicate of one of them (see the module).

    Args:
        cache: The text cache the signatures are kept in.
        session_turns: A session's turns in order.
    """

    def __init__(self, cache: dict[Any, Any], session_turns: SessionTurns) -> None:
        self.cache, self.session_turns = cache, session_turns
        self.seen: dict[frozenset[str], list[tuple[frozenset[str], set[str], Key]]] = {}
        #: Per turn placed, the first turn of its set (itself when fresh).
        self.first: dict[Key, Key] = {}

    def fresh(self, key: Key) -> bool:
        """Whether the turn is no near-duplicate of a turn seen before; it is seen from now."""
        return self.place(key) == "fresh"

    def place(self, key: Key) -> str:
        """What the turn is beside the turns seen before; it is seen from now.

        Returns:
            `"fresh"` (no near-duplicate seen), `"again"` (a near-duplicate of one seen, the
            first in its session: a thing said again another day) or `"flood"` (a
            near-duplicate of one already seen in its own session).
        """
        self.first[key] = key
        if is_short(self.cache, self.session_turns, key):
            return "fresh"
        bare, words = _signature(self.cache, self.session_turns, key)
        kept = self.seen.setdefault(bare, [])
        for w, sessions, first in kept:
            if len(words & w) >= DUPLICATE_OVERLAP * len(words | w):
                self.first[key] = first
                if key[0] in sessions:
                    return "flood"
                sessions.add(key[0])
                return "again"
        kept.append((words, {key[0]}, key))
        return "fresh"


def collapse_duplicates(
    votes: TurnVotes,
    session_turns: SessionTurns,
    cache: dict[Any, Any],
    keep: Collection[Key] = frozenset(),
    found: Collection[Key] = frozenset(),
) -> set[Key]:
    """Near-duplicate voted turns count once: the best-voted stands for them, the rest lose it.

    A fact said again on other days counts for it: the turn that stands for a set adds the
    votes of its best `SAID_AGAIN` sayings on other days that the search found on their own
    (`found`), as fusion adds a unit's votes from each ranking it is in; a line said in every
    session ("Hey, how is your day going so far?") adds no more than a fact said on three
    days. A saying voted only as the context of a unit around it adds nothing, nor do an
    assistant's sayings ("Hello! How can I help you today?"), and a set that floods a session
    (`Distinct.place`) keeps its best vote only: a request sent 200 times counts as once said.
    Run on final scores, after every turn's features were read (a copy's neighbours keep the
    support its vote gave them).

    Args:
        votes: The votes.
        session_turns: A session's turns in order.
        cache: The text cache the signatures are kept in.
        keep: Turns that keep their vote whatever they duplicate (an anchor a short turn
            lifted: "¡Hola!" before "Vivo en Madrid." is that answer's context).
        found: Turns the search ranked on their own (their `turn` unit is in the ranking);
            only their votes count for the set they say again.

    Returns:
        The turns that lost their vote.
    """
    voted = votes.turn
    seen = Distinct(cache, session_turns)
    order = sorted(voted, key=lambda k: (k not in keep, -voted[k], votes.first_seen[k]))
    placed = [(key, seen.place(key)) for key in order]
    flooded = {seen.first[key] for key, place in placed if place == "flood"}
    gone: set[Key] = set()
    said_again: dict[Key, list[float]] = {}  # per set's best-voted turn: other days' votes
    for key, place in placed:
        if place == "fresh" or key in keep:
            continue
        gone.add(key)
        first = seen.first[key]
        if (
            place == "again"
            and first not in flooded
            and key in found
            and not _assistant(session_turns, key)
        ):
            said_again.setdefault(first, []).append(voted[key])  # best first: `order`
    for key in gone:
        del voted[key]
    for key, more in said_again.items():  # the first of a set is fresh: never gone
        voted[key] += sum(more[:SAID_AGAIN])
    return gone


def _assistant(session_turns: SessionTurns, key: Key) -> bool:
    """Whether the turn was said under the `assistant` role."""
    return session_turns(key[0])[key[1]].role == "assistant"


def riders(
    votes: TurnVotes,
    session_turns: SessionTurns,
    exclude: frozenset[str],
    cache: dict[Any, Any],
) -> dict[Key, Key]:
    """Drop the votes of excluded turns and of short turns with nothing to ride with.

    Args:
        votes: The votes.
        session_turns: A session's turns in order.
        exclude: Turn ids the caller excludes.
        cache: The text cache (`is_short`).

    Returns:
        Per voted short turn, its anchor (the nearest turn before it that is not short, else
        the nearest after it: a session may open with "Hi!" / "Hello!" / "Vivo en Madrid."),
        in turn order. A session of short turns only has no anchors: its turns stand alone. A
        short turn whose anchor is excluded loses its vote; one whose
        anchor lost its vote to a near-duplicate brings it back when it is read (`ride`): a
        greeting said in every session is one turn, but not for the answer that follows it.
    """
    voted = votes.turn
    out: dict[Key, Key] = {}
    for key in sorted(voted):
        sid, p = key
        turns = session_turns(sid)
        if turns[p].turn_id in exclude:
            del voted[key]
            continue
        if not is_short(cache, session_turns, key):
            continue
        anchor = _anchor(cache, session_turns, sid, p)
        if anchor is None:  # a session of short turns only: nothing to read it with
            continue
        if turns[anchor].turn_id in exclude:
            del voted[key]
        else:
            out[key] = (sid, anchor)
    return out


def _anchor(cache: dict[Any, Any], session_turns: SessionTurns, sid: str, p: int) -> int | None:
    """The nearest turn before `p` that is not short, else the nearest after it."""
    n = len(session_turns(sid))
    for q in (*range(p - 1, -1, -1), *range(p + 1, n)):
        if not is_short(cache, session_turns, (sid, q)):
            return q
    return None


def lifting(votes: TurnVotes, anchors: dict[Key, Key]) -> set[Key]:
    """The anchors a short turn out-scores: it lifts them (`ride`)."""
    voted = votes.turn
    return {a for r, a in anchors.items() if r in voted and voted[r] > voted.get(a, 0.0)}


def ride(
    votes: TurnVotes, anchors: dict[Key, Key], passages: bool, gone: Collection[Key] = ()
) -> None:
    """Short turns follow their anchors (see the module), on final scores.

    Args:
        votes: Scored votes.
        anchors: `riders`' map of short turn to anchor.
        passages: Whether the hits are passages (a budget); else bare turns (`k` alone), where a
            short turn that lifted its anchor is shown inside its anchor's hit
            (`TurnVotes.riders`) and one that did not is dropped.
        gone: Anchors that lost their vote to a near-duplicate (`collapse_duplicates`): their
            short turns go with them.
    """
    voted = votes.turn
    for key, anchor in anchors.items():  # in turn order: a run follows its first anchor
        mine = voted.get(key)
        if mine is None:
            continue
        if anchor in gone:
            del voted[key]
            continue
        theirs = voted.get(anchor)
        if theirs is None:  # the anchor had no vote: it is read for its rider
            votes.first_seen.setdefault(anchor, votes.first_seen[key])
            theirs = 0.0
        lifted = mine > theirs
        if lifted:
            voted[anchor] = mine
        if passages:
            voted[key] = voted[anchor] * _BEHIND
        else:
            del voted[key]
            if lifted:
                votes.riders.setdefault(anchor, []).append(key[1])
