"""Candidate ranking (dense via RF-Mem, lexical BM25, reciprocal-rank fusion) and hit packing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory.errors import ConfigError
from reflective_memory.llm import count_tokens
from reflective_memory.recall import RecallConfig
from reflective_memory.recall import recall as rf_recall
from reflective_memory.settings import check_choice, check_int, check_names, check_number, set_field
from reflective_memory.types import GRANULARITIES, Hit, Memory

if TYPE_CHECKING:
    from reflective_memory.storage.index import UserIndex

__all__ = ["SEARCH_MODES", "SearchConfig", "rank_candidates", "pack_hits"]


#: Search modes: dense fused with lexical, or either alone.
SEARCH_MODES = ("hybrid", "dense", "lexical")


@dataclass(frozen=True)
class SearchConfig:
    """Candidate search: dense (RF-Mem) and lexical (BM25) rankings and their fusion.

    Attributes:
        mode: `hybrid` (dense cosine fused with BM25), `dense` or `lexical`.
        dense_weight: Weight of the dense ranking in reciprocal-rank fusion.
        lexical_weight: Weight of the BM25 ranking in reciprocal-rank fusion.
        rrf_k: The constant of reciprocal-rank fusion, `score = sum(w / (rrf_k + rank + 1))`
            (small-to-big turn votes use it too).
        candidate_k: Candidates each ranker contributes before fusion (at least `k`).
        default_k: Hits returned when neither `k` nor `budget_tokens` is given.
        views: Memory kinds `retrieve` searches (e.g. `("note", "segment")`), all in one
            ranking that shares `k` / the budget, returned as they are (no passages); `None`
            searches every stored kind.
    """

    mode: str = "hybrid"
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: int = 60
    candidate_k: int = 50
    default_k: int = 5
    views: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_choice("search.mode", self.mode, SEARCH_MODES)
        check_number("search.dense_weight", self.dense_weight, 0)
        check_number("search.lexical_weight", self.lexical_weight, 0)
        for name in ("rrf_k", "candidate_k", "default_k"):
            check_int(f"search.{name}", getattr(self, name))
        if self.views is not None:
            views = check_names("search.views", self.views, GRANULARITIES)
            if not views:
                raise ConfigError(f"search.views must name kinds from {GRANULARITIES}")
            set_field(self, "views", views)


def rank_candidates(
    index: UserIndex,
    query: str,
    qvec: np.ndarray | None,
    n: int,
    mode: str,
    rcfg: RecallConfig,
    fusion: SearchConfig,
    timings: dict[str, float],
    diagnostics: dict[str, Any],
) -> tuple[list[int], list[dict[str, float]]]:
    """Rank positions of `index`: dense (RF-Mem), lexical, or their reciprocal-rank fusion.

    Args:
        index: The user's indexes.
        query: Query text (for the lexical ranker).
        qvec: Query vector (None in lexical mode).
        n: Candidates per ranker.
        mode: `hybrid`, `dense` or `lexical`.
        rcfg: RF-Mem settings for the dense ranker.
        fusion: Reciprocal-rank fusion weights.
        timings: Filled with per-stage times in ms.
        diagnostics: Filled with the dense path and candidate counts.

    Returns:
        Index positions in rank order and each one's scores by ranker.
    """
    cfg = fusion
    dense_pos: np.ndarray = np.zeros(0, np.int64)
    dense_sc: np.ndarray = np.zeros(0, np.float32)
    lex_pos: np.ndarray = np.zeros(0, np.int64)
    lex_sc: np.ndarray = np.zeros(0, np.float32)
    if mode != "lexical":
        t0 = time.perf_counter()
        res = rf_recall(index.dense, qvec, n, rcfg)  # type: ignore[arg-type]
        dense_pos, dense_sc = res.positions, res.cosine
        rd = res.diagnostics()
        diagnostics["recall"] = rd
        diagnostics["ann"] = index.dense.kind
        for key in ("path", "mean_score", "entropy", "rounds", "hits_per_round"):
            diagnostics[key] = rd[key]
        timings["dense"] = (time.perf_counter() - t0) * 1000
    if mode != "dense":
        t0 = time.perf_counter()
        lex_sc, lex_pos = index.lexical.search(query, n)
        timings["lexical"] = (time.perf_counter() - t0) * 1000
    diagnostics["candidates"] = {"dense": int(len(dense_pos)), "lexical": int(len(lex_pos))}
    if mode == "dense":
        return dense_pos.tolist(), [{"dense": float(x)} for x in dense_sc]
    if mode == "lexical":
        return lex_pos.tolist(), [{"lexical": float(x)} for x in lex_sc]
    t0 = time.perf_counter()
    fused: dict[int, dict[str, float]] = {}
    for weight, name, pos, sc in (
        (cfg.dense_weight, "dense", dense_pos, dense_sc),
        (cfg.lexical_weight, "lexical", lex_pos, lex_sc),
    ):
        for rank, (p, s) in enumerate(zip(pos.tolist(), sc.tolist(), strict=True)):
            entry = fused.setdefault(p, {"fused": 0.0})
            entry[name] = float(s)
            entry["fused"] += weight / (cfg.rrf_k + rank + 1)
    order = sorted(fused, key=lambda p: (-fused[p]["fused"], -fused[p].get("dense", -1.0)))
    diagnostics["candidates"]["fused"] = len(order)
    timings["fuse"] = (time.perf_counter() - t0) * 1000
    return order, [fused[p] for p in order]


def pack_hits(
    fetch: Callable[[list[str]], list[Memory]],
    index: UserIndex,
    order: list[int],
    scores: list[dict[str, float]],
    k: int | None,
    budget: int | None,
    timings: dict[str, float],
    views: Sequence[str] | None = None,
    count: Callable[[str], int] = count_tokens,
) -> tuple[list[Hit], bool]:
    """Fetch memories in rank order until `k` hits or the budget is full.

    Args:
        fetch: Memories by id (unknown ids skipped).
        index: The user's indexes (maps positions to memory ids).
        order: Index positions in rank order.
        scores: Each position's scores by ranker.
        k: Most hits.
        budget: Token budget for the hits' texts.
        timings: Gets the fetch time in ms.
        views: Memory kinds to keep (None: all).
        count: Token counter for the budget.

    Returns:
        The hits and whether the cut was reached (False: ran out of candidates).
    """
    t0 = time.perf_counter()
    hits: list[Hit] = []
    used = 0
    filled = False
    step = 64
    for s in range(0, len(order), step):
        chunk = order[s : s + step]
        mems = {m.id: m for m in fetch([index.ids[p] for p in chunk])}
        for j, p in enumerate(chunk):
            mem = mems.get(index.ids[p])
            if mem is None:  # deleted after the index was taken
                continue
            if views is not None and mem.granularity not in views:
                continue
            sc = scores[s + j]
            if budget is not None:
                cost = count(mem.text)
                if used + cost > budget:
                    if budget - used < 10:
                        filled = True
                        break
                    continue
                used += cost
            main = sc.get("fused", sc.get("dense", sc.get("lexical", 0.0)))
            hits.append(Hit(mem, float(main), len(hits), dict(sc)))
            if k is not None and len(hits) >= k:
                filled = True
                break
        if filled:
            break
    timings["fetch"] = (time.perf_counter() - t0) * 1000
    return hits, filled
