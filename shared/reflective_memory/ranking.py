"""Candidate ranking (dense via RF-Mem, lexical BM25, reciprocal-rank fusion) and hit packing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reflective_memory.llm import count_tokens
from reflective_memory.recall import RecallConfig
from reflective_memory.recall import recall as rf_recall
from reflective_memory.storage.index import UserIndex
from reflective_memory.types import Hit, Memory

__all__ = ["FusionWeights", "rank_candidates", "pack_hits"]


@dataclass(frozen=True)
class FusionWeights:
    """Reciprocal-rank fusion settings: `weight / (rrf_k + rank + 1)` per ranker."""

    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: int = 60


def rank_candidates(
    index: UserIndex,
    query: str,
    qvec: np.ndarray | None,
    n: int,
    mode: str,
    rcfg: RecallConfig,
    fusion: FusionWeights,
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
