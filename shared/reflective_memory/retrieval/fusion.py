"""`SearchConfig` and the fusion stage: dense and lexical rankings become one ranking."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.settings import check_choice, check_int, check_names, check_number, set_field
from reflective_memory.types import GRANULARITIES

__all__ = ["SEARCH_MODES", "SearchConfig", "Fusion"]

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
        default_budget_tokens: The token budget of passages `retrieve` fills when neither `k`
            nor `budget_tokens` is given (what the adapters inject by default). 500 tokens is
            about what five turns cost across the dev sets and covers more evidence than five
            bare turns on all of them (BENCHMARKS.md, issue 27).
        default_k: When set, a call without `k` or `budget_tokens` returns this many turns
            instead of filling `default_budget_tokens`.
        views: Memory kinds `retrieve` searches (e.g. `("note", "segment")`), all in one
            ranking that shares `k` / the budget, returned as they are (no passages); `None`
            searches every stored kind.
        max_query_chars: Longest accepted query (longer raises `InvalidInputError` before any
            work): a search costs CPU in proportion to its query's words (a 900 KB query took
            7 s), while the embedder reads only its first few hundred tokens.
    """

    mode: str = "hybrid"
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: int = 60
    candidate_k: int = 50
    default_budget_tokens: int = 500
    default_k: int | None = None
    views: tuple[str, ...] | None = None
    max_query_chars: int = 20_000

    def __post_init__(self) -> None:
        check_choice("search.mode", self.mode, SEARCH_MODES)
        check_number("search.dense_weight", self.dense_weight, 0)
        check_number("search.lexical_weight", self.lexical_weight, 0)
        for name in ("rrf_k", "candidate_k", "default_budget_tokens", "max_query_chars"):
            check_int(f"search.{name}", getattr(self, name))
        check_int("search.default_k", self.default_k, optional=True)
        if self.views is not None:
            views = check_names("search.views", self.views, GRANULARITIES)
            if not views:
                raise ConfigError(f"search.views must name kinds from {GRANULARITIES}")
            set_field(self, "views", views)


class Fusion:
    """Reciprocal-rank fusion of the candidate lists (a single list passes through).

    Args:
        config: Fusion weights and constant.
    """

    name = "fuse"
    repeat = True

    def __init__(self, config: SearchConfig) -> None:
        self.config = config

    def run(self, state: RetrievalState) -> None:
        """Set `state.order` and `state.scores`."""
        lists = [
            (w, name, got)
            for w, name, got in (
                (self.config.dense_weight, "dense", state.dense),
                (self.config.lexical_weight, "lexical", state.lexical),
            )
            if got is not None
        ]
        if len(lists) == 1:
            _, name, (pos, sc) = lists[0]
            state.order = pos.tolist()
            state.scores = [{name: float(x)} for x in sc]
            return
        fused: dict[int, dict[str, float]] = {}
        for weight, name, (pos, sc) in lists:
            for rank, (p, s) in enumerate(zip(pos.tolist(), sc.tolist(), strict=True)):
                entry = fused.setdefault(p, {"fused": 0.0})
                entry[name] = float(s)
                entry["fused"] += weight / (self.config.rrf_k + rank + 1)
        order = sorted(fused, key=lambda p: (-fused[p]["fused"], -fused[p].get("dense", -1.0)))
        state.order = order
        state.scores = [fused[p] for p in order]
