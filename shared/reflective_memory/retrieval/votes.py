"""Small-to-big stages: the question's cues, and ranked units become turn votes.

The algorithms are `retrieval.cues` (what the question asks), `retrieval.turn_votes`
(votes per turn) and `retrieval.features` with `retrieval.ranker` (the learned model that
weighs every cue); these stages feed them the user's turns, read once per index version.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from reflective_memory.retrieval.cues import (
    addressed_role,
    asks_when,
    named_speaker,
    present_tense,
    without_name,
    without_present_cue,
)
from reflective_memory.retrieval.features import QuestionSignals, turn_features
from reflective_memory.retrieval.interleave import interleaved_scores
from reflective_memory.retrieval.passages import PassageConfig
from reflective_memory.retrieval.ranker import TurnRanker, load_ranker
from reflective_memory.retrieval.redundancy import (
    Distinct,
    collapse_duplicates,
    lifting,
    ride,
    riders,
)
from reflective_memory.retrieval.speakers import speaker_of
from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.retrieval.timeframe import time_frame
from reflective_memory.retrieval.turn_votes import TurnVotes, collect_votes, unit_positions
from reflective_memory.retrieval.units import CONVERSATION_STARTS, turn_unit_id
from reflective_memory.storage.base import MemoryStore
from reflective_memory.storage.user_index import UserIndex
from reflective_memory.types import Memory, SessionTurns, Turn

__all__ = ["CONTEXT_UNITS", "UserTurns", "QuestionCues", "DistinctCandidates", "Votes"]

#: Users with at most this many indexed memories have all their turns read in one query.
PRELOAD_TURNS = 20_000
#: Turns that must open with a `Name: ` before that name counts as a speaker.
MIN_LABELLED = 3

#: Unit kinds `end_session` cuts a session into that vote for their turns as context.
CONTEXT_UNITS = ("segment", "session")


#: Fills a version's text cache for one session's turns: `(cache, session_id, turns, labels)`.
Prepare = Callable[[dict[Any, Any], str, Sequence[Turn], frozenset[str]], None]


class UserTurns:
    """A user's turns and unit table, cached on their index (so per store version).

    Args:
        store: The store of record.
        prepare: Fills the text cache (`text_cache`) for the sessions an index version is the
            first to hold, when it is made (`passages.prepare_turns`); None fills it as
            queries ask.
    """

    def __init__(self, store: MemoryStore, prepare: Prepare | None = None) -> None:
        self.store, self.prepare = store, prepare

    def sessions(self, user_id: str, index: UserIndex) -> SessionCache:
        """The user's turns by session.

        A user with up to `PRELOAD_TURNS` memories has all turns read in one query the first
        time (a question's candidates span many sessions); larger users read sessions on demand
        through `session_turns`.
        """
        cache: SessionCache | None = index.extras.get("session_turns")
        if cache is None:
            preload = len(index) <= PRELOAD_TURNS
            starts = self.conversation_starts(user_id, index)
            before = self._carried(index, "session_turns")
            if before is not None:  # the sessions the new memories are of are read again
                touched = self._touched(user_id, index)
                # dict() copies in one step: readers of the older version may still add to it
                got = {sid: ts for sid, ts in dict(before).items() if sid not in touched}
                if preload:
                    for sid in touched:
                        turns = self.store.turns(user_id, sid)
                        if turns:
                            got[sid] = with_starts(turns, starts.get(sid))
            else:
                got = {}
                if preload:
                    for t in self.store.turns(user_id):
                        got.setdefault(t.session_id, []).append(t)
                    for sid, turns in got.items():
                        turns.sort(key=lambda t: t.position)
                        got[sid] = with_starts(turns, starts.get(sid))
            # the first reader's copy wins: every stage of this version reads the same turns
            cache = index.extras.setdefault(
                "session_turns", SessionCache(self.store, user_id, got, starts)
            )
        return cache

    def conversation_starts(self, user_id: str, index: UserIndex) -> dict[str, Sequence[int]]:
        """Where conversations start inside sessions whose log gave no times, by session.

        Found when each session was stored (`sessions.starts`) and kept in the metadata of
        the memories built from its first turn (`CONVERSATION_STARTS`). Cached per index
        version (a session rebuilt is a version that did not only append: read again).
        """
        got: dict[str, Sequence[int]] | None = index.extras.get("conversation_starts")
        if got is None:
            # a version that only appended keeps the marks before it and reads its new units
            before = self._carried(index, "conversation_starts")
            n = index.carried.appended_from if before is not None and index.carried else 0
            found: dict[str, Sequence[int]] = dict(before) if before is not None else {}
            for mem in self.units(user_id, index)[n:]:
                marks = (
                    None
                    if mem is None or not mem.metadata
                    else mem.metadata.get(CONVERSATION_STARTS)
                )
                if isinstance(marks, list) and all(type(p) is int for p in marks):
                    found[mem.session_id] = marks
            got = index.extras.setdefault("conversation_starts", found)
        return got

    @staticmethod
    def _carried(index: UserIndex, name: str) -> Any:
        """`name` of the previous index version when this one only appended to it, else None.

        The whole-history preload is carried only between versions on the same side of
        `PRELOAD_TURNS`.
        """
        carried = index.carried
        if carried is None:
            return None
        if name == "session_turns" and (carried.appended_from <= PRELOAD_TURNS) != (
            len(index) <= PRELOAD_TURNS
        ):
            return None
        return carried.extras.get(name)

    def _touched(self, user_id: str, index: UserIndex) -> frozenset[str]:
        """Sessions of the memories this index version appended to the one before."""
        got = index.extras.get("touched")
        if got is None:
            n = index.carried.appended_from if index.carried is not None else 0
            got = index.extras.setdefault(
                "touched",
                frozenset(m.session_id for m in self.units(user_id, index)[n:] if m is not None),
            )
        return got

    def text_cache(self, user_id: str, index: UserIndex) -> dict[Any, Any]:
        """What the turns' texts cost and hold (`passages.pack_passages`' cache).

        Carried from the previous index version when the speaker labels did not change,
        without the sessions it appended to; `prepare` fills in the sessions not carried
        (all of them for a user of up to `PRELOAD_TURNS` memories, whose turns are read at
        once), so a version's first question finds its candidates counted.
        """
        got = index.extras.get("text_cache")
        if got is None:
            before = self._carried(index, "text_cache")
            labels = self.labels(user_id, index)
            fresh: frozenset[str] | None = None  # sessions to prepare (None: every one)
            if before is not None and index.carried is not None:
                if index.carried.extras.get("labels") == labels:
                    fresh = self._touched(user_id, index)
                    # keys: (session, position) of a line, ("header", session, dated), ...
                    before = {k: v for k, v in dict(before).items() if k[-2] not in fresh}
                else:
                    before = None
            got = before if before is not None else {}
            if self.prepare is not None and len(index) <= PRELOAD_TURNS:
                read = dict(self.sessions(user_id, index))  # readers may add sessions meanwhile
                for sid in read if fresh is None else fresh & read.keys():
                    self.prepare(got, sid, read[sid], labels)
            got = index.extras.setdefault("text_cache", got)
        return got

    def reader(self, user_id: str, index: UserIndex) -> Callable[[str], list[Turn]]:
        """A `session_id -> turns` function over the cache (reads missing sessions)."""
        return self.sessions(user_id, index).__getitem__

    def speakers(self, user_id: str, index: UserIndex) -> list[str]:
        """Who speaks in the user's turns (of the sessions read so far above `PRELOAD_TURNS`).

        A speaker is a turn's role, or the `Name: ` a chat-role turn opens with
        (`speakers.speaker_of`) when at least `MIN_LABELLED` turns open with that name (so a
        lone "Note: ..." is no speaker).
        """
        speakers = index.extras.get("speakers")
        if speakers is None or len(index) > PRELOAD_TURNS:
            said, roles = self._said(user_id, index)
            speakers = sorted(s for s, n in said.items() if s in roles or n >= MIN_LABELLED)
            index.extras["speakers"] = speakers
        return speakers

    def _said(self, user_id: str, index: UserIndex) -> tuple[Counter[str], Counter[str]]:
        """How many turns each speaker said and each role holds (of the sessions read).

        Carried from the previous index version by recounting only the sessions it touched.
        """
        cache = self.sessions(user_id, index)
        got = index.extras.get("said")
        if got is None or len(index) > PRELOAD_TURNS:
            before = self._carried(index, "said")
            old = self._carried(index, "session_turns")
            if before is not None and old is not None and len(index) <= PRELOAD_TURNS:
                said, roles = Counter(before[0]), Counter(before[1])
                for sid in self._touched(user_id, index):
                    for t in old.get(sid, ()):
                        said[speaker_of(t)] -= 1
                        roles[t.role] -= 1
                    for t in cache.get(sid, ()):
                        said[speaker_of(t)] += 1
                        roles[t.role] += 1
                said, roles = +said, +roles  # drop the counts that fell to zero
            else:
                read = list(dict(cache).values())  # readers may add sessions meanwhile
                said = Counter(speaker_of(t) for turns in read for t in turns)
                roles = Counter(t.role for turns in read for t in turns)
            if len(index) > PRELOAD_TURNS:  # recounted as sessions are read
                got = index.extras["said"] = (said, roles)
            else:
                got = index.extras.setdefault("said", (said, roles))
        return got

    def newest(self, user_id: str, index: UserIndex) -> datetime | None:
        """The time of the user's newest turn (timezone-aware), if any turn has one."""
        if "newest" not in index.extras:
            times = [
                t.timestamp
                for turns in list(dict(self.sessions(user_id, index)).values())
                for t in turns
                if t.timestamp is not None
            ]
            aware = [ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc) for ts in times]
            index.extras["newest"] = max(aware) if aware else None
        got: datetime | None = index.extras["newest"]
        return got

    def labels(self, user_id: str, index: UserIndex) -> frozenset[str]:
        """The speakers that are `Name: ` labels of chat-role turns, not roles."""
        got = index.extras.get("labels")
        if got is None:
            read = dict(self.sessions(user_id, index)).values()
            roles = {t.role for turns in read for t in turns}
            got = frozenset(self.speakers(user_id, index)) - roles
            index.extras["labels"] = got
        return got

    def units(self, user_id: str, index: UserIndex) -> list[Memory | None]:
        """Each index position's memory without its text (cached per index version)."""
        table = index.extras.get("units")
        if table is None:
            before = self._carried(index, "units")
            n = index.carried.appended_from if before is not None and index.carried else 0
            new = index.ids[n:]
            got = self.store.memories(user_id, new) if n else self.store.memories(user_id)
            light = {m.id: replace(m, text="", key="") for m in got}
            table = (before[:n] if n else []) + [light.get(i) for i in new]
            table = index.extras.setdefault("units", table)
        return table

    def turn_at(self, user_id: str, index: UserIndex, position: int) -> tuple[str, int] | None:
        """`(session_id, position)` of the turn a `turn` unit at an index position keys.

        None for other units. Kept per index version.
        """
        known: dict[int, tuple[str, int] | None] = index.extras.setdefault("turn_at", {})
        if position in known:
            return known[position]
        mem = self.units(user_id, index)[position]
        got = None
        if mem is not None and mem.granularity == "turn" and len(mem.turn_ids) == 1:
            at = unit_positions(mem, self.reader(user_id, index)(mem.session_id))
            got = (mem.session_id, at[0]) if at else None
        known[position] = got
        return got

    def provisional(self, user_id: str, index: UserIndex) -> frozenset[str]:
        """Ids of the `turn` units whose turn no segment or session unit covers yet.

        These are the turns of open sessions (and turns added to a session after it ended):
        they get a context vote only once `end_session` builds their segments. Cached per
        index version.
        """
        got = index.extras.get("provisional")
        if got is None:
            table = self.units(user_id, index)
            before = self._carried(index, "covered")
            if before is not None and index.carried is not None:
                n = index.carried.appended_from
                covered, waiting = set(before[0]), dict(before[1])  # copies: theirs stay
                table = table[n:]
            else:
                covered, waiting = set(), {}
            table = [m for m in table if m is not None]
            covered.update(
                (m.session_id, tid)
                for m in table
                if m.granularity in CONTEXT_UNITS
                for tid in m.turn_ids
            )
            waiting.update(
                (m.id, (m.session_id, m.turn_ids[0]))
                for m in table
                if m.granularity == "turn" and len(m.turn_ids) == 1
            )
            waiting = {i: key for i, key in waiting.items() if key not in covered}
            covered, waiting = index.extras.setdefault("covered", (covered, waiting))
            got = index.extras.setdefault("provisional", frozenset(waiting))
        return got


class SessionCache(dict[str, list[Turn]]):
    """A user's turns by session; a session not read yet is read from the store (then kept).

    Its `__getitem__` is the `session_id -> turns in order` function the stages call hundreds
    of times per retrieval: a hit is a plain dict lookup.

    Args:
        store: The store of record.
        user_id: Whose turns.
        sessions: The sessions read already.
        starts: Where conversations start in the sessions that were found to hold several
            (`UserTurns.conversation_starts`).
    """

    def __init__(
        self,
        store: MemoryStore,
        user_id: str,
        sessions: dict[str, list[Turn]] | None = None,
        starts: dict[str, Sequence[int]] | None = None,
    ) -> None:
        super().__init__(sessions or {})
        self.store, self.user_id, self.starts = store, user_id, starts or {}

    def __missing__(self, session_id: str) -> list[Turn]:
        turns = self.store.turns(self.user_id, session_id)
        got = self[session_id] = with_starts(turns, self.starts.get(session_id))
        return got


def with_starts(turns: list[Turn], starts: Sequence[int] | None) -> list[Turn]:
    """A session's turns, as `SessionTurns` when conversations were found to start in it."""
    return SessionTurns(turns, starts) if starts else turns


class QuestionCues:
    """What a question says about *whose* turns and *when*, taken out of the searched text.

    - A question naming exactly one speaker of the user's turns is searched without the name:
      "What does Kate do on weekends?" as "What does do on weekends?". The name says whose
      turns answer (the `Votes` stage weighs the other speakers' turns), not what they are
      about, and would otherwise pull up every turn that mentions or addresses that person. In
      a `user` / `assistant` chat the question's person does the same (person focus).
    - A present-tense cue ("these days", "currently", or "now" in another of the configured
      `languages`: "jetzt", "nå") is left out of the searched text; it lifts the newest
      answers in the `Votes` stage instead.
    - A time the question is anchored in ("two weeks ago", "on 29 Dec 2023") is resolved
      against the call's `now` (default: the user's newest turn), in any of the configured
      `languages` ("vor zwei Wochen", "i fjor"); the `Votes` stage lifts the turns said in
      that period. Its words stay in the searched text (taking them out
      cost 0.8 to 1.7 points at 1,000–2,000 words on REALTALK).

    Each cue runs only when its setting is on (`speaker_focus`, `person_focus`, `recency`,
    `time_frame`).

    Args:
        config: Passage settings.
        turns: The user's turns.
    """

    name = "cues"
    repeat = False

    def __init__(self, config: PassageConfig, turns: UserTurns) -> None:
        self.config, self.turns = config, turns

    def run(self, state: RetrievalState) -> None:
        """Set `state.speaker`, `state.speakers`, `state.frame` and `state.search_query`."""
        req, cfg = state.request, self.config
        speakers = self.turns.speakers(req.user_id, state.index)
        speaker = named_speaker(req.query, speakers) if cfg.speaker_focus else None
        if speaker is not None:
            state.speaker = speaker
            state.speakers = tuple(speakers)
            state.search_query = without_name(req.query, speaker)
        elif cfg.person_focus and {"user", "assistant"} <= set(speakers):
            role = addressed_role(req.query)
            if role is not None:
                state.speaker = role
                state.speakers = ("user", "assistant")  # compared by role
        if cfg.recency:  # the cue goes to the ranker's recency feature, not the search
            state.search_query = without_present_cue(state.search_query, cfg.languages)
        if cfg.time_frame:
            now = req.now or self.turns.newest(req.user_id, state.index)
            if now is not None:  # the phrase stays searched (measured: removing it costs)
                state.frame = time_frame(state.search_query, now, cfg.languages)


class DistinctCandidates:
    """A flood of near-duplicate turns does not crowd the candidates (`redundancy.Distinct`).

    In each candidate list (dense, lexical), every `turn` unit whose turn near-duplicates a
    better-ranked one's makes room for one more: the list is extended, from a wider plain
    search of the same ranker, by as many distinct candidates as it holds duplicates. A copy of
    a turn already in the list from its own session (a *flood*, `Distinct.place`) then moves
    to the end of the list, so a request sent 200 times ("dinner idea number 1", "2", ...)
    neither pushes the turn that answers out of the candidates nor down their ranks (the
    copies in the middle of the list cost every turn below them rank in the fusion and in the
    votes: up to 0.4 points of REALTALK coverage with a flood, see BENCHMARKS.md). A copy said
    in another session keeps its rank: a fact said again counts for it (the votes stage keeps
    one copy of it, `redundancy.collapse_duplicates`). Sayings of a fact found by the wider
    search come with it too (they score alike, so a list's cut can fall between them): each is
    then scored in its own session's context, and the best keeps the vote, with those of
    the others the search ranked on their own.

    Args:
        turns: The user's turns.
    """

    name = "distinct"
    repeat = True

    def __init__(self, turns: UserTurns) -> None:
        self.turns = turns

    def run(self, state: RetrievalState) -> None:
        """Extend `state.dense` and `state.lexical` past their near-duplicates."""
        req, index = state.request, state.index
        assert index is not None
        cache = self.turns.text_cache(req.user_id, index)
        reader = self.turns.reader(req.user_id, index)
        for name in ("dense", "lexical"):
            got: tuple[np.ndarray, np.ndarray] | None = getattr(state, name)
            if got is None or len(got[0]) < 2:
                continue
            # equal scores in index order, whichever backend found them (FAISS and pgvector
            # break ties differently): the copy a near-duplicate is told from is the same
            order = np.lexsort((got[0], -got[1]))
            got = (got[0][order], got[1][order])
            setattr(state, name, got)
            seen = Distinct(cache, reader)

            def place(position: int) -> str:
                key = self.turns.turn_at(req.user_id, index, position)
                return "fresh" if key is None else seen.place(key)  # noqa: B023 (this loop)

            places = [place(int(p)) for p in got[0]]
            first = np.array([p != "flood" for p in places], bool)
            room = sum(p != "fresh" for p in places)
            if not room:
                continue
            more = min(len(got[0]) + 4 * room, len(index))
            if name == "dense":
                scores, positions = index.dense.search(state.qvec, more)
                scores, positions = scores[0], positions[0]
            else:
                scores, positions = index.lexical.search(state.search_query, more)
            taken = {int(p) for p in got[0]}
            extra: list[tuple[int, float]] = []
            added = 0
            for p, x in zip(positions.tolist(), scores.tolist(), strict=True):
                if added >= room:
                    break
                if p < 0 or p in taken:
                    continue
                at = place(p)
                if at != "flood":  # a copy said on another day comes with its fact
                    extra.append((p, x))
                    added += at == "fresh"
            # a flood's copies go last: they keep a rank but push no distinct candidate down
            # (the ranks fusion and the votes read); a copy said in another session keeps its
            # place, so a fact said again still counts for it
            setattr(
                state,
                name,
                (
                    np.concatenate(
                        [got[0][first], np.array([p for p, _ in extra], np.int64), got[0][~first]]
                    ),
                    np.concatenate(
                        [
                            got[1][first],
                            np.array([x for _, x in extra], got[1].dtype),
                            got[1][~first],
                        ]
                    ),
                ),
            )


class Votes:
    """Resolve the ranked units to votes for turns (small-to-big), then weigh them.

    Coarse units (segments, topics, notes) vote for their turns at `context_weight`; the
    learned ranker (`TurnRanker`) then weighs every voted turn by its features, the question's
    cues among them (whose turn it is, how new, inside the asked-for period). Turns the caller
    excludes get no vote; near-duplicate turns keep one vote between them, and a turn of a few
    words ("Got it.", "Tusen takk!", "Miso soup") rides with the turn before it, never alone
    (`retrieval.redundancy`).

    When sessions are cut into segments or session units (`context_units`), a turn no such
    unit covers yet (its session is open) gets, from its own key, the context vote of a unit
    ranked like itself (`collect_votes`' `provisional`): a turn of an open session ranks as
    it will once its session ends, and ended sessions' votes are unchanged.

    Args:
        config: Passage settings.
        rrf_k: The fusion constant, reused for the votes' reciprocal ranks.
        turns: The user's turns.
        context_units: Whether `end_session` builds segment or session units (with turn units
            alone no session ever gets a context vote, so none is stood in for).
        weights: The ranker's weights for a user (citation-taught: `rmm.turn_learning`);
            default: the fitted ranker's.
        noise: Exploration noise for `n` turns' log-scores, added when a call explores
            (`retrieve(explore=True)`: RMM's Gumbel sampling of what is shown).
        rivals: A user's two weights to compare, `(served, learned)`, or None: a call that
            explores shows the team-draft interleaving of their rankings instead of adding
            noise (`retrieval.interleave`; `state.teams`).
        coin: The fair coin of the interleaving.
    """

    name = "votes"
    repeat = True

    def __init__(
        self,
        config: PassageConfig,
        rrf_k: int,
        turns: UserTurns,
        context_units: bool,
        weights: Callable[[str], np.ndarray] | None = None,
        noise: Callable[[int], np.ndarray] | None = None,
        rivals: Callable[[str], tuple[np.ndarray, np.ndarray] | None] | None = None,
        coin: Callable[[], bool] | None = None,
    ) -> None:
        self.config, self.rrf_k, self.turns = config, rrf_k, turns
        self.context_units = context_units
        self.ranker: TurnRanker = load_ranker(None if config.ranker == "learned" else config.ranker)
        self.weights, self.noise = weights, noise
        self.rivals, self.coin = rivals, coin

    def run(self, state: RetrievalState) -> None:
        """Set `state.votes`, `state.unit_scores`, `state.ranked_units` and `state.recency`."""
        req, cfg = state.request, self.config
        ranked = self._ranked(state)
        session_turns = self.turns.reader(req.user_id, state.index)
        context = cfg.context_weight
        provisional = (
            self.turns.provisional(req.user_id, state.index)
            if self.context_units and context > 0
            else frozenset()
        )
        votes = collect_votes(
            ranked, session_turns, rrf_k=self.rrf_k, context_weight=context, provisional=provisional
        )
        texts = self.turns.text_cache(req.user_id, state.index)
        anchors = riders(votes, session_turns, req.exclude, texts)
        votes.labels = self.turns.labels(req.user_id, state.index)
        keep = None
        if state.speaker is not None and state.speakers == ("user", "assistant"):
            keep = _quotes(req.query)
        self._learned(state, votes, ranked, session_turns, anchors, keep, texts)
        state.votes = votes
        state.ranked_units = len(ranked)

    def _learned(
        self,
        state: RetrievalState,
        votes: TurnVotes,
        ranked: Sequence[Memory],
        session_turns: Callable[[str], Sequence[Turn]],
        anchors: dict[tuple[str, int], tuple[str, int]],
        keep: Callable[[Turn], bool] | None,
        texts: dict[Any, Any],
    ) -> None:
        """Every voted turn's vote becomes `exp(w · x)` of its features (`TurnRanker`).

        A short turn then follows its anchor (`redundancy.ride`).
        """
        req = state.request
        present = self.config.recency and present_tense(req.query, self.config.languages)
        signals = QuestionSignals(
            speaker=state.speaker,
            speakers=state.speakers,
            keep=keep,
            present=present,
            frame=None if state.frame is None else (state.frame.start, state.frame.end),
            when=asks_when(req.query),
        )
        own = self._own(state, ranked, votes, session_turns)
        feats = turn_features(
            votes,
            session_turns,
            own,
            signals,
            rrf_k=self.rrf_k,
            quiet=frozenset(anchors),
            relevance=self._relevance(state, session_turns),
            cache=texts,
        )
        state.features = feats
        state.feature_ids = [session_turns(sid)[p].turn_id for sid, p in feats.keys]
        if self.weights is None or not len(feats.keys):
            scores = self.ranker.score(feats.matrix)
        else:
            scores = feats.matrix @ self.weights(req.user_id)
        pair = None
        if req.explore and self.rivals is not None and self.coin is not None and len(scores):
            pair = self.rivals(req.user_id)
        if pair is not None:
            scores, teams = interleaved_scores(
                feats.matrix @ pair[0], feats.matrix @ pair[1], self.coin
            )
            state.teams = dict(zip(feats.keys, teams.tolist(), strict=True))
        elif req.explore and self.noise is not None:
            scores = scores + self.noise(len(scores))
        for key, s in zip(feats.keys, scores.tolist(), strict=True):
            votes.turn[key] = math.exp(min(s, 50.0))
        found = {key for key, (rank, _) in own.items() if rank is not None}
        gone = collapse_duplicates(
            votes, session_turns, texts, keep=lifting(votes, anchors), found=found
        )
        ride(votes, anchors, req.budget is not None, gone)
        state.recency = present

    def _own(
        self,
        state: RetrievalState,
        ranked: Sequence[Memory],
        votes: TurnVotes,
        session_turns: Callable[[str], Sequence[Turn]],
    ) -> dict[tuple[str, int], tuple[int | None, dict[str, float]]]:
        """Per voted turn: its own key's rank in the ranking and that key's scores."""
        rank_of = {m.id: r for r, m in enumerate(ranked)}
        user = state.request.user_id
        out: dict[tuple[str, int], tuple[int | None, dict[str, float]]] = {}
        for key in votes.turn:
            uid = turn_unit_id(user, key[0], session_turns(key[0])[key[1]].turn_id)
            out[key] = (rank_of.get(uid), state.unit_scores.get(uid, {}))
        return out

    @staticmethod
    def _relevance(
        state: RetrievalState, session_turns: Callable[[str], Sequence[Turn]]
    ) -> Callable[[tuple[str, int]], float | None]:
        """A turn's own query cosine (its turn unit's dense score), None when not ranked."""
        user = state.request.user_id

        def cosine(key: tuple[str, int]) -> float | None:
            turn = session_turns(key[0])[key[1]]
            scores = state.unit_scores.get(turn_unit_id(user, key[0], turn.turn_id))
            return None if scores is None else scores.get("dense")

        return cosine

    def _ranked(self, state: RetrievalState) -> list[Memory]:
        """The ranked units (texts only for those without turns) and their scores."""
        units = self.turns.units(state.request.user_id, state.index)
        ranked: list[Memory] = []
        state.unit_scores = {}
        for p, sc in zip(state.order, state.scores, strict=False):
            mem = units[p]
            if mem is not None:
                ranked.append(mem)
                state.unit_scores[mem.id] = sc
        loose = [m.id for m in ranked if not m.turn_ids]
        if loose:  # memories without turns are read whole
            full = {m.id: m for m in self.turns.store.memories(state.request.user_id, loose)}
            ranked = [full.get(m.id, m) if not m.turn_ids else m for m in ranked]
        return ranked


def _quotes(query: str) -> Callable[[Turn], bool] | None:
    """Whether a turn holds `query` word for word (None for queries under 20 characters)."""
    want = " ".join(query.casefold().split())
    if len(want) < 20:
        return None
    longest = max(want.split(), key=len)  # in any quoting turn, with its spacing as is

    def holds(turn: Turn) -> bool:
        text = turn.text.casefold()
        return longest in text and want in " ".join(text.split())

    return holds
