"""Packing stages: turn votes become passages for the reader, or ranked units become hits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from reflective_memory.retrieval.passages import PassageConfig, pack_passages
from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.retrieval.units import turn_unit_id
from reflective_memory.retrieval.votes import UserTurns
from reflective_memory.storage.base import MemoryStore
from reflective_memory.storage.user_index import UserIndex
from reflective_memory.text import lexical_tokens
from reflective_memory.types import Hit

__all__ = ["PassagePacking", "UnitPacking", "wanted"]


def _words(text: str) -> int:
    """About `len(text.split())`, three times cheaper on long texts (spaces and line breaks)."""
    return text.count(" ") + text.count("\n") + 1


def wanted(index: UserIndex, k: int | None, budget: int | None, passages: bool) -> int:
    """How many ranked units to fetch for `k` hits or a budget of `budget` tokens."""
    if k is not None:
        return k
    assert budget is not None
    if not passages:
        return max(1, budget // 50)
    mean = index.extras.get("mean_key_words")  # enough turns to fill the budget
    if mean is None:  # mean characters of all keys x words per character of a sample
        keys = index.keys
        step = max(1, len(keys) // 32)
        sample = [keys[i] for i in range(0, len(keys), step)]
        per_char = sum(map(_words, sample)) / max(1, sum(map(len, sample)))
        chars = sum(map(len, keys)) / max(1, len(keys))
        mean = index.extras["mean_key_words"] = max(4.0, chars * per_char)
    return int(2 * budget / mean)


class PassagePacking:
    """Take turns in vote order while they fit, grouped per session into `passage` hits.

    With only `k`, each of the top `k` turns is a hit of its own (its stored `turn` memory
    where it has one).

    Args:
        config: Passage settings.
        date_header: Start each passage with its session's date.
        turns: The user's turns.
        count: Token counter of the budget.
    """

    name = "passages"
    repeat = True

    def __init__(
        self,
        config: PassageConfig,
        date_header: bool,
        turns: UserTurns,
        count: Callable[[str], int],
    ) -> None:
        self.config, self.date_header, self.turns, self.count = config, date_header, turns, count

    def run(self, state: RetrievalState) -> None:
        """Set `state.hits`, `state.filled` and `state.tokens_used`."""
        assert state.votes is not None
        req, cfg = state.request, self.config
        hits, state.tokens_used, state.filled = pack_passages(
            req.user_id,
            state.votes,
            self.turns.reader(req.user_id, state.index),
            self.count,
            k=req.k,
            budget=req.budget,
            date_header=self.date_header,
            length_exponent=cfg.length_exponent,
            length_free=cfg.length_free,
            length_keep_share=cfg.length_keep_share,
            cost_cache=self.turns.text_cache(req.user_id, state.index),
            query_terms=lexical_tokens(state.search_query) if req.budget is not None else None,
            excerpt_length=cfg.excerpt_length,
        )
        hits = [_with_unit_scores(h, state.unit_scores) for h in hits]
        if req.budget is None:  # one turn per hit: hand back the turn's stored unit
            hits = self._as_turn_units(req.user_id, hits)
        state.hits = hits

    def _as_turn_units(self, user_id: str, hits: list[Hit]) -> list[Hit]:
        """Swap one-turn passages for the stored `turn` memory of that turn where it exists.

        A hit holding a short turn beside its anchor (`redundancy.ride`) stays a passage.
        """

        def one(h: Hit) -> bool:
            return h.memory.granularity == "passage" and len(h.memory.turn_ids) == 1

        def unit_id(h: Hit) -> str:
            return turn_unit_id(user_id, h.memory.session_id, h.memory.turn_ids[0])

        want = [unit_id(h) for h in hits if one(h)]
        stored = {m.id: m for m in self.turns.store.memories(user_id, want)} if want else {}
        return [replace(h, memory=stored.get(unit_id(h), h.memory)) if one(h) else h for h in hits]


def _with_unit_scores(hit: Hit, unit_scores: dict[str, dict[str, float]]) -> Hit:
    """Give a passage hit the best dense / lexical scores of the units that voted for it."""
    own = unit_scores.get(hit.memory.id)
    names = hit.memory.metadata.get("sources", ())
    sources = [unit_scores[s] for s in names if s in unit_scores]
    if own is not None:
        sources.append(own)
    merged = dict(hit.scores)
    for name in ("dense", "lexical"):
        vals = [s[name] for s in sources if name in s]
        if vals:
            merged[name] = max(vals)
    return replace(hit, scores=merged)


class UnitPacking:
    """Fetch ranked units in order until `k` hits or the budget is full (no passages).

    Args:
        store: The store of record.
        count: Token counter of the budget.
    """

    name = "fetch"
    repeat = True

    def __init__(self, store: MemoryStore, count: Callable[[str], int]) -> None:
        self.store, self.count = store, count

    def run(self, state: RetrievalState) -> None:
        """Set `state.hits` and `state.filled`."""
        req, index = state.request, state.index
        hits: list[Hit] = []
        used, filled, step = 0, False, 64
        for s in range(0, len(state.order), step):
            chunk = state.order[s : s + step]
            mems = {
                m.id: m for m in self.store.memories(req.user_id, [index.ids[p] for p in chunk])
            }
            for j, p in enumerate(chunk):
                mem = mems.get(index.ids[p])
                if mem is None:  # deleted after the index was taken
                    continue
                if req.views is not None and mem.granularity not in req.views:
                    continue
                sc = state.scores[s + j]
                if req.budget is not None:
                    cost = self.count(mem.text)
                    if used + cost > req.budget:
                        if req.budget - used < 10:
                            filled = True
                            break
                        continue
                    used += cost
                main = sc.get("fused", sc.get("dense", sc.get("lexical", 0.0)))
                hits.append(Hit(mem, float(main), len(hits), dict(sc)))
                if req.k is not None and len(hits) >= req.k:
                    filled = True
                    break
            if filled:
                break
        state.hits, state.filled = hits, filled
