"""Plain data types shared by every part of the core.

`Turn` is one stored utterance, `Memory` one stored unit of memory (a turn, a session, a segment,
a topic summary or a note), `Hit` a memory with its scores in a ranking, `RerankRecord` what the
citation-trained reranker showed for one ranking, and `Retrieval` the answer to one query with
its diagnostics, LLM `Usage` and rerank record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "Turn",
    "SessionTurns",
    "Memory",
    "Hit",
    "Retrieval",
    "RerankRecord",
    "Usage",
    "GRANULARITIES",
    "LEXICAL_HALF_RELEVANCE",
]

#: Memory unit kinds. `turn`, `session` and `segment` are built from a session's turns;
#: `topic` (RMM topic memories) and `note` (conditional memory records) come from reflection;
#: `item` is a memory written directly through `ReflectiveMemory.put_memory`.
GRANULARITIES = ("turn", "session", "segment", "topic", "note", "item")


@dataclass(frozen=True)
class Turn:
    """One utterance as stored.

    Attributes:
        user_id: Owner of the conversation.
        session_id: Session the turn belongs to.
        role: `user`, `assistant`, `system` or any speaker label.
        text: The utterance, stored whole.
        turn_id: The caller's id for the turn (generated as `<session_id>:<position>` if not given).
        position: 0-based index of the turn inside its session.
        timestamp: When the turn was said, if known.
        seq: Store-wide insertion sequence number (monotonic).
    """

    user_id: str
    session_id: str
    role: str
    text: str
    turn_id: str
    position: int
    timestamp: datetime | None = None
    seq: int = 0


class SessionTurns(list[Turn]):
    """A session's turns in order, with where a conversation starts that no time shows.

    Args:
        turns: The turns.
        conversation_starts: Positions (after 0) where a new conversation starts, as found when
            the session was stored (`sessions.starts.ConversationStarts`; a log imported without
            session ids or times).
    """

    def __init__(self, turns: Sequence[Turn], conversation_starts: Sequence[int]) -> None:
        super().__init__(turns)
        self.conversation_starts = tuple(sorted({int(p) for p in conversation_starts}))


@dataclass(frozen=True)
class Memory:
    """One unit of memory.

    Attributes:
        id: Stable memory id.
        user_id: Owner.
        session_id: Session the unit came from (the latest one for merged topic memories).
        granularity: One of `GRANULARITIES`.
        text: What an LLM should read: the raw turns (prefixed with the session date when known).
        key: What was indexed (may be denoised or a summary); never shown to the LLM by default.
        turn_ids: The callers' ids of every source turn.
        created_at: When the memory was created.
        updated_at: When the memory was last changed.
        start_time: Timestamp of the first source turn, if known.
        end_time: Timestamp of the last source turn, if known.
        metadata: Free-form extra fields (e.g. RMM provenance, conditional context).
    """

    id: str
    user_id: str
    session_id: str
    granularity: str
    text: str
    key: str
    turn_ids: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Usage:
    """LLM cost of an operation.

    Attributes:
        llm_calls: Number of LLM calls made.
        prompt_chars: Characters sent.
        completion_chars: Characters received.
        prompt_tokens: Tokens sent (as reported by the model, else estimated).
        completion_tokens: Tokens received (as reported by the model, else estimated).
        failures: Calls that raised or whose output could not be used.
    """

    llm_calls: int = 0
    prompt_chars: int = 0
    completion_chars: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0

    def add(self, other: Usage) -> Usage:
        """Add another usage into this one in place and return self."""
        self.llm_calls += other.llm_calls
        self.prompt_chars += other.prompt_chars
        self.completion_chars += other.completion_chars
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.failures += other.failures
        return self

    def as_dict(self) -> dict[str, int]:
        """Return the counters as a plain dict."""
        return dict(self.__dict__)


#: BM25 score at which `Hit.relevance` of a memory found by BM25 alone reaches 0.5.
LEXICAL_HALF_RELEVANCE = 10.0


@dataclass(frozen=True)
class Hit:
    """A memory in a ranking.

    Attributes:
        memory: The memory.
        score: The score the ranking was sorted by (higher is better). Its scale depends on the
            ranker, so compare it only within one `Retrieval`: with the default hybrid mode it
            is a reciprocal-rank-fusion score, `sum(weight / (rrf_k + rank))` over the dense and
            BM25 rankings (about 0.016 for a memory ranked near the top of one ranker with
            `rrf_k=60`); in `dense` mode a cosine, in `lexical` mode a BM25 score; with the
            reranker on, the reranker's score. For an absolute threshold use `relevance`.
        rank: 0-based position in the ranking.
        scores: Component scores (`dense` cosine, `lexical` BM25, `fused`, `rerank`, ...).
    """

    memory: Memory
    score: float
    rank: int
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def relevance(self) -> float:
        """How well the memory matches the query, in [0, 1], comparable across queries.

        The dense ranker's cosine similarity between the query and the memory's indexed key,
        clipped to [0, 1]. Keys are denoised and segments hold several turns, so values are
        modest: with all-MiniLM-L6-v2 on the bundled demo, memories that hold the answer score
        about 0.2-0.3 and unrelated ones about 0.1. A memory found by BM25 alone gets
        `s / (s + LEXICAL_HALF_RELEVANCE)` of its BM25 score `s`; a hit with neither gets 0.
        """
        dense = self.scores.get("dense")
        if dense is not None:
            return float(min(1.0, max(0.0, dense)))
        lexical = self.scores.get("lexical")
        if lexical is not None and lexical > 0:
            return float(lexical / (lexical + LEXICAL_HALF_RELEVANCE))
        return 0.0


@dataclass(frozen=True)
class RerankRecord:
    """What the reranker showed for one ranking: everything feedback on it learns from.

    Made by the RMM rerank stage for every reranked `retrieve` (`Retrieval.rerank`) and for
    texts from any retriever (`ReflectiveMemory.rerank_texts`). Plain data: it can be kept,
    serialised (`as_diagnostics` / `from_diagnostics`) and sent back with `feedback` by another
    process, which rebuilds the vectors from the user's index (or the texts) and the query.

    Attributes:
        user_id: Whose reranker ranked.
        retrieval_id: Id of the retrieval (or text ranking) the record belongs to.
        scope: The reranker scope (`user`, `shared`, `isolated`), or `custom` for a reranker
            passed in by the caller.
        top_k: Candidates reranked (the head of the retriever's ranking).
        top_m: Memories the reranker selects (for text rankings: texts shown).
        explored: Retrieved for learning (`explore`: an interleaving, or Gumbel noise).
        updates: Optimizer steps the reranker had taken when it ranked.
        candidates: Candidate ids in the retriever's order (memory ids, or the ids of the
            texts given).
        reranked: The same ids in the reranker's order.
        prior: Prior score of each candidate, as `candidates` (rounded to 6 decimals).
        features: Side features of each candidate, as `candidates` (rounded to 5 decimals),
            or None when the reranker scores none.
        query: The query text as ranked (after speaker focus, if any).
        groups: For a record of turns (scope `turns`: what `retrieve` showed, the turn
            ranker's to learn from), the shown passage each candidate turn belongs to; the
            candidates are then the shown turns' ids and `features` their feature rows.
        teams: For a record of turns of an interleaved retrieval (`retrieval.interleave`),
            per candidate the team that placed its passage (1: the learned weights, -1: the
            served ones); None when the retrieval was not interleaved.
    """

    user_id: str
    retrieval_id: str
    scope: str
    top_k: int
    top_m: int
    explored: bool
    updates: int
    candidates: tuple[str, ...]
    reranked: tuple[str, ...]
    prior: tuple[float, ...]
    features: tuple[tuple[float, ...], ...] | None
    query: str
    groups: tuple[int, ...] | None = None
    teams: tuple[int, ...] | None = None

    def as_diagnostics(self) -> dict[str, Any]:
        """The record as `Retrieval.diagnostics["rerank"]` shows it (JSON-ready).

        Example:
            >>> r = RerankRecord("u", "r1", "user", 2, 1, False, 0, ("a", "b"), ("b", "a"),
            ...                  (0.5, 0.25), None, "q")
            >>> r.as_diagnostics()["reranked_order"]
            ['b', 'a']
        """
        out: dict[str, Any] = {
            "scope": self.scope,
            "top_k": self.top_k,
            "top_m": self.top_m,
            "explored": self.explored,
            "updates": self.updates,
            "retriever_order": list(self.candidates),
            "reranked_order": list(self.reranked),
            "prior": list(self.prior),
        }
        if self.features is not None:
            out["features"] = [list(row) for row in self.features]
        if self.groups is not None:
            out["groups"] = list(self.groups)
        if self.teams is not None:
            out["teams"] = list(self.teams)
        return out

    @classmethod
    def from_diagnostics(
        cls, info: dict[str, Any], *, user_id: str, retrieval_id: str, query: str
    ) -> RerankRecord:
        """Rebuild a record from `as_diagnostics()` output (which holds no ids nor query).

        Raises:
            KeyError, TypeError, ValueError: `info` is not such a dict.
        """
        feats = info.get("features")
        return cls(
            user_id=user_id,
            retrieval_id=retrieval_id,
            scope=str(info["scope"]),
            top_k=int(info["top_k"]),
            top_m=int(info["top_m"]),
            explored=bool(info["explored"]),
            updates=int(info["updates"]),
            candidates=tuple(str(x) for x in info["retriever_order"]),
            reranked=tuple(str(x) for x in info["reranked_order"]),
            prior=tuple(float(x) for x in info["prior"]),
            features=None if feats is None else tuple(tuple(map(float, r)) for r in feats),
            query=query,
            groups=None if info.get("groups") is None else tuple(int(g) for g in info["groups"]),
            teams=None if info.get("teams") is None else tuple(int(t) for t in info["teams"]),
        )


@dataclass
class Retrieval:
    """The answer to one `retrieve` call.

    Attributes:
        user_id: Whose memories were searched.
        query: The query text.
        hits: Ranked hits, best first (already cut to `k` / the token budget).
        diagnostics: Path taken, candidate counts, timings in milliseconds and more.
        usage: LLM usage of the call.
        retrieval_id: Id used to send feedback about this retrieval.
        rerank: What the reranker showed (None when nothing was reranked); `feedback` learns
            from it. `diagnostics["rerank"]` is its `as_diagnostics()`.
    """

    user_id: str
    query: str
    hits: list[Hit]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    retrieval_id: str = ""
    rerank: RerankRecord | None = None

    @property
    def memories(self) -> list[Memory]:
        """The memories of the hits, in rank order."""
        return [h.memory for h in self.hits]

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __getitem__(self, i: int) -> Hit:
        return self.hits[i]
