"""Side features of candidate memories for the reranker, plus the rank prior and citation rewards.

The RMM paper scores a candidate only through its embedding (`(q + W_q q) . (m + W_m m)`). What a
reranker learns that way is tied to the directions of the questions it was trained on and barely
carries over to a user's next, different questions. The side features below describe *what kind
of memory* gets cited instead, in terms that mean the same for any question and any memory
granularity (turn, segment, passage, session, topic, note): its length, how much of the query it
shares, how each retriever scored it, where it ranked, how recent it is among the candidates,
whether it came from both retrievers, whether it is itself a question, whether it is a derived
summary. Each is a `(K,)` column computed from a `Candidates` record; fields the caller could not
fill (no query, no scores, no `Memory` objects) give a neutral column of zeros, so a feature that
cannot be computed never moves a ranking.

Columns are on comparable scales (roughly within [-3, 3]) so one learning rate suits all weights.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

from reflective_memory.rmm.config import RERANK_FEATURES
from reflective_memory.text import lexical_tokens

__all__ = [
    "Candidates",
    "rank_prior",
    "cost_features",
    "candidate_features",
    "citation_rewards",
    "FEATURES",
    "FEATURE_SIGNS",
    "sign_vector",
    "project_signs",
]

logger = logging.getLogger(__name__)

#: Memory kinds written by reflection or by the application rather than cut from raw turns.
_DERIVED_KINDS = frozenset({"topic", "note", "item"})


@dataclass
class Candidates:
    """What is known about the K candidates of one ranking (all fields but `keys` optional).

    Attributes:
        keys: Indexed text of each candidate, in the retriever's order.
        query: The query text.
        dense: `(K,)` dense cosine of each candidate with the query.
        scores: Each candidate's scores by ranker (`dense`, `lexical`, `fused`, ...), as the
            retriever reported them; a ranker that did not find a candidate has no entry.
        memories: The stored `Memory` of each candidate (None where unknown). Read defensively:
            only `text`, `granularity`, `turn_ids`, `start_time`, `end_time` and `created_at`
            are used, each when present.
        overlap: `(K,)` share of the query's content words in each key, when the caller already
            knows it (the BM25 index's postings); computed from `keys` otherwise.
    """

    keys: Sequence[str]
    query: str | None = None
    dense: np.ndarray | None = None
    scores: Sequence[Mapping[str, float]] | None = None
    memories: Sequence[Any | None] | None = None
    overlap: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def memory_field(self, name: str) -> list[Any]:
        """One attribute of every candidate's memory (None where missing)."""
        if self.memories is None or len(self.memories) != len(self.keys):
            return [None] * len(self.keys)
        return [getattr(m, name, None) if m is not None else None for m in self.memories]

    def texts(self) -> list[str]:
        """What the generator reads per candidate: the memory text, else the key."""
        out = []
        for key, text in zip(self.keys, self.memory_field("text"), strict=True):
            out.append(text if isinstance(text, str) and text else str(key))
        return out


def rank_prior(dense_scores: np.ndarray) -> np.ndarray:
    """Cosine-scale prior scores that keep the retriever's order.

    Args:
        dense_scores: `(K,)` dense cosines of the candidates, listed in the retriever's order.

    Returns:
        The same values sorted descending: candidate `j` (the retriever's `j`-th) gets the `j`-th
        largest cosine. For a dense retriever this is the input itself.
    """
    s = np.asarray(dense_scores, dtype=np.float32).reshape(-1)
    return np.sort(s)[::-1].copy()


def _zscore(x: np.ndarray) -> np.ndarray:
    """Standardise within the candidate list (zeros when the list does not vary), clipped."""
    x = np.asarray(x, dtype=np.float32)
    if x.size < 2:
        return np.zeros_like(x)
    values = x.tolist()  # a few dozen numbers: plain floats are quicker than numpy's reductions
    mean = math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if not sd > 1e-6:
        return np.zeros_like(x)
    return np.clip((x - np.float32(mean)) / np.float32(sd), -3.0, 3.0).astype(np.float32)


def cost_features(texts: Sequence[str]) -> np.ndarray:
    """The `cost` side feature of candidate memories: `(K, 1)` with `log(1 + words)` per text.

    What a memory costs in the prompt. Generators tend to cite short, specific memories (a
    user's own statement) over long generic ones, and under a context budget a short memory
    leaves room for more; a reranker with `features=("cost",)` learns how much that matters.
    """
    return np.log1p(np.array([len(t.split()) for t in texts], dtype=np.float32)).reshape(-1, 1)


def _cost(c: Candidates) -> np.ndarray:
    return cost_features(c.texts())[:, 0]


def _overlap(c: Candidates) -> np.ndarray:
    """Share of the query's content words (stemmed, no stopwords) found in the candidate key."""
    if c.overlap is not None and len(c.overlap) == len(c):
        return np.asarray(c.overlap, dtype=np.float32)
    if not c.query:
        return np.zeros(len(c), np.float32)
    q = set(lexical_tokens(c.query))
    if not q:
        return np.zeros(len(c), np.float32)
    return np.array(
        [len(q & set(lexical_tokens(str(k)))) / len(q) for k in c.keys], dtype=np.float32
    )


def _dense(c: Candidates) -> np.ndarray:
    """Dense cosine, standardised within the list."""
    if c.dense is None or len(c.dense) != len(c):
        return np.zeros(len(c), np.float32)
    return _zscore(np.asarray(c.dense, dtype=np.float32).reshape(-1))


def _lexical(c: Candidates) -> np.ndarray:
    """BM25 score over the list's best (0 where the lexical ranker did not find the candidate)."""
    if c.scores is None or len(c.scores) != len(c):
        return np.zeros(len(c), np.float32)
    x = np.array([float(s.get("lexical", 0.0) or 0.0) for s in c.scores], dtype=np.float32)
    top = float(x.max()) if x.size else 0.0
    return x / top if top > 0 else np.zeros(len(c), np.float32)


def _rank(c: Candidates) -> np.ndarray:
    """Retriever position scaled to [0, 1] (0 = first)."""
    k = len(c)
    return np.arange(k, dtype=np.float32) / max(k - 1, 1)


def _both(c: Candidates) -> np.ndarray:
    """Retrieval path of the candidate: 1 when both the dense and the lexical ranker found it."""
    if c.scores is None or len(c.scores) != len(c):
        return np.zeros(len(c), np.float32)
    return np.array([float("dense" in s and "lexical" in s) for s in c.scores], dtype=np.float32)


def _time(value: Any) -> float | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def _recency(c: Candidates) -> np.ndarray:
    """How recent the candidate is among the candidates: rank of its time, 1 = newest, 0 = oldest.

    Time is the memory's last source turn, else its first, else when it was stored; candidates
    without any time get the middle (0.5), and so does everyone when fewer than two have one.
    """
    times: list[float | None] = []
    for end, start, created in zip(
        c.memory_field("end_time"),
        c.memory_field("start_time"),
        c.memory_field("created_at"),
        strict=True,
    ):
        t = _time(end)
        t = _time(start) if t is None else t
        times.append(_time(created) if t is None else t)
    known = sorted({t for t in times if t is not None})
    if len(known) < 2:
        return np.full(len(c), 0.5, np.float32)
    where = {t: i / (len(known) - 1) for i, t in enumerate(known)}
    return np.array([0.5 if t is None else where[t] for t in times], dtype=np.float32)


def _size(c: Candidates) -> np.ndarray:
    """`log(1 + source turns)`, the unit's span whatever its granularity (0 when unknown)."""
    out = []
    for tids in c.memory_field("turn_ids"):
        n = len(tids) if isinstance(tids, (list, tuple)) else 0
        out.append(math.log1p(n))
    return np.array(out, dtype=np.float32)


def _question(c: Candidates) -> np.ndarray:
    """Share of the key's lines that are questions (a question rarely holds the answer)."""
    out = []
    for key in c.keys:
        key = str(key)
        if "?" not in key:  # most keys: no line is a question (and no need to split them)
            out.append(0.0)
            continue
        lines = questions = 0
        for line in key.splitlines():
            line = line.rstrip()
            if line:
                lines += 1
                questions += line[-1] == "?"
        out.append(questions / lines if lines else 0.0)
    return np.array(out, dtype=np.float32)


def _derived(c: Candidates) -> np.ndarray:
    """1 for memories written by reflection or the app (topic, note, item), 0 for raw units."""
    return np.array(
        [float(g in _DERIVED_KINDS) for g in c.memory_field("granularity")], dtype=np.float32
    )


#: Side features a reranker can learn a weight for, by name: `Candidates` -> `(K,)` column.
FEATURES: dict[str, Callable[[Candidates], np.ndarray]] = {
    "cost": _cost,
    "overlap": _overlap,
    "dense": _dense,
    "lexical": _lexical,
    "rank": _rank,
    "both": _both,
    "recency": _recency,
    "size": _size,
    "question": _question,
    "derived": _derived,
}
assert set(FEATURES) == set(RERANK_FEATURES)

#: Direction a feature's learned weight may take when signs are enforced: +1 (never below 0),
#: -1 (never above 0), 0 (free). The signed features restate retriever evidence (more query
#: overlap, a higher dense or lexical score, an earlier rank, being found by both rankers)
#: or a question-vs-statement cue; a reranker may learn to trust such evidence more, never to
#: invert it, so noisy feedback cannot turn the retriever's order upside down.
FEATURE_SIGNS: dict[str, int] = {
    "cost": 0,
    "overlap": 1,
    "dense": 1,
    "lexical": 1,
    "rank": -1,
    "both": 1,
    "recency": 0,
    "size": 0,
    "question": -1,
    "derived": 0,
}


def sign_vector(names: Sequence[str]) -> np.ndarray:
    """`(F,)` allowed signs of these features' weights (see `FEATURE_SIGNS`)."""
    return np.array([FEATURE_SIGNS[n] for n in names], dtype=np.float32)


def project_signs(weights: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Clip weights to their allowed signs (0 where a weight points the forbidden way)."""
    w = np.asarray(weights, dtype=np.float64).copy()
    w[(signs > 0) & (w < 0)] = 0.0
    w[(signs < 0) & (w > 0)] = 0.0
    return w


def candidate_features(names: Sequence[str], candidates: Candidates) -> np.ndarray | None:
    """The `(K, len(names))` side-feature matrix of these candidates (None without names)."""
    if not names:
        return None
    cols = [np.asarray(FEATURES[n](candidates), dtype=np.float32).reshape(-1) for n in names]
    out = np.stack(cols, axis=1) if cols else np.zeros((len(candidates), 0), np.float32)
    return np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)


def citation_rewards(n_shown: int, cited: Sequence[int]) -> np.ndarray:
    """RMM rewards: `+1` for each shown position that was cited, `-1` for the others."""
    rewards = -np.ones(n_shown, dtype=np.float32)
    for i in cited:
        if 0 <= int(i) < n_shown:
            rewards[int(i)] = 1.0
    return rewards
