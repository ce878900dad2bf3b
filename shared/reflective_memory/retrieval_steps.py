"""Read-side steps of `ReflectiveMemory.retrieve`: gate calibration and small-to-big passages.

A mixin over the engine's components (`store`, `config`, `_count`); it
never imports the engine. The algorithms themselves live in `reflective_memory.passages`
(votes, recency, packing) and `reflective_memory.recall.calibration` (the RF-Mem gate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from reflective_memory.passages import (
    RECENCY_POOL,
    apply_recency,
    apply_speaker_focus,
    collect_votes,
    named_speaker,
    pack_passages,
    present_tense,
    without_name,
)
from reflective_memory.recall import RecallConfig, calibrate_gate
from reflective_memory.types import Hit, Memory, Turn
from reflective_memory.units import turn_unit_id

__all__ = ["RetrievalSteps", "default_gate"]

logger = logging.getLogger(__name__)

#: Users with at most this many indexed memories have all their turns read in one query.
_PRELOAD_TURNS = 20_000


def _words(text: str) -> int:
    """About `len(text.split())`, three times cheaper on long texts (spaces and line breaks)."""
    return text.count(" ") + text.count("\n") + 1


def default_gate(rcfg: RecallConfig) -> bool:
    """Whether `rcfg` gates with RF-Mem at the default thresholds (explicit ones are kept)."""
    base = RecallConfig()
    return rcfg.mode == "rfmem" and (rcfg.theta_high, rcfg.theta_low, rcfg.tau) == (
        base.theta_high,
        base.theta_low,
        base.tau,
    )


class RetrievalSteps:
    """`ReflectiveMemory`'s read side after ranking: calibrate the gate, build passages."""

    store: Any
    config: Any
    _count: Callable[[str], int]

    def _wanted(self, index: Any, k: int | None, budget: int | None) -> int:
        """How many ranked units to fetch for `k` hits or a budget of `budget` tokens."""
        if k is not None:
            return k
        assert budget is not None
        if not self.config.passages.enabled:
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

    def _calibrated(
        self, index: Any, rcfg: RecallConfig, diagnostics: dict[str, Any]
    ) -> RecallConfig:
        """RF-Mem thresholds calibrated on the user's own index (cached per index version).

        Applies only with `config.recall.calibrate` and the default thresholds. Stored key
        vectors serve as pseudo-queries (`reflective_memory.recall.calibrate_gate`), so the
        gate needs no hand-set thresholds for a new embedder or a new user.
        """
        if not (self.config.recall.calibrate and default_gate(rcfg)):
            return rcfg
        key = ("gate", rcfg.probe_k, rcfg.lam)
        cal = index.extras.get(key)
        if cal is None:
            try:
                cal = calibrate_gate(index.dense, probe_k=rcfg.probe_k, lam=rcfg.lam)
            except Exception:  # too small an index to calibrate: keep the configured gate
                logger.debug("RF-Mem gate not calibrated for a %d-memory index", len(index))
                cal = False
            index.extras[key] = cal
        if cal is False:
            return rcfg
        diagnostics["gate_calibration"] = {
            "theta_high": cal.theta_high,
            "theta_low": cal.theta_low,
            "tau": cal.tau,
        }
        return cal.apply(rcfg)

    def _unit_table(self, user_id: str, index: Any) -> list[Memory | None]:
        """Each index position's memory without its text (cached per index version)."""
        table = index.extras.get("units")
        if table is None:
            light = {m.id: replace(m, text="", key="") for m in self.store.memories(user_id)}
            table = [light.get(i) for i in index.ids]
            index.extras["units"] = table
        return table

    def _session_turn_cache(self, user_id: str, index: Any) -> dict[str, list[Turn]]:
        """The user's turns by session (cached per index version).

        A user with up to `_PRELOAD_TURNS` memories has all turns read in one query the first
        time (a question's candidates span many sessions); larger users read sessions on demand.
        """
        cache: dict[str, list[Turn]] | None = index.extras.get("session_turns")
        if cache is None:
            cache = index.extras["session_turns"] = {}
            if len(index) <= _PRELOAD_TURNS:
                for t in self.store.turns(user_id):
                    cache.setdefault(t.session_id, []).append(t)
                for turns in cache.values():
                    turns.sort(key=lambda t: t.position)
        return cache

    def _speaker_focus(
        self, user_id: str, index: Any, query: str, diagnostics: dict[str, Any]
    ) -> tuple[str | None, str]:
        """The speaker a question is about, and the text to search with.

        With `config.passages.speaker_focus`, a question naming exactly one speaker of the user's
        turns
        ("What does Kate do on weekends?") is searched without the name ("What does do on
        weekends?"): the name says *whose* turns answer (their votes are kept, the others'
        scaled down), not what they are about, and it would otherwise pull up every turn that
        mentions or addresses that person. Speakers are the roles of the user's turns (all of
        them up to `_PRELOAD_TURNS` memories, those of the sessions read so far above).

        Returns:
            `(speaker or None, query text for the rankers)`.
        """
        if self.config.passages.speaker_focus <= 0:
            return None, query
        cache = self._session_turn_cache(user_id, index)
        speakers = index.extras.get("speakers")
        if speakers is None or len(index) > _PRELOAD_TURNS:
            speakers = sorted({t.role for turns in cache.values() for t in turns})
            index.extras["speakers"] = speakers
        speaker = named_speaker(query, speakers)
        if speaker is None:
            return None, query
        text = without_name(query, speaker)
        diagnostics["speaker"] = speaker
        if text != query:
            diagnostics["search_query"] = text
        return speaker, text

    def _pack_passages(
        self,
        user_id: str,
        query: str,
        index: Any,
        order: list[int],
        scores: list[dict[str, float]],
        k: int | None,
        budget: int | None,
        timings: dict[str, float],
        diagnostics: dict[str, Any],
        *,
        speaker: str | None = None,
    ) -> tuple[list[Hit], bool]:
        """Small-to-big: resolve ranked units to turns and pack them into passages.

        `speaker` (from `_speaker_focus`) scales down the votes of the other speakers' turns.
        """
        t0 = time.perf_counter()
        units = self._unit_table(user_id, index)
        ranked: list[Memory] = []
        unit_scores: dict[str, dict[str, float]] = {}
        for p, sc in zip(order, scores, strict=False):
            mem = units[p]
            if mem is not None:
                ranked.append(mem)
                unit_scores[mem.id] = sc
        loose = [m.id for m in ranked if not m.turn_ids]
        if loose:  # memories without turns are read whole
            full = {m.id: m for m in self.store.memories(user_id, loose)}
            ranked = [full.get(m.id, m) if not m.turn_ids else m for m in ranked]
        cache = self._session_turn_cache(user_id, index)

        def session_turns(sid: str) -> list[Turn]:
            got = cache.get(sid)
            if got is None:
                got = cache[sid] = self.store.turns(user_id, sid)
            return got

        cfg = self.config.passages
        context = cfg.context_weight
        full = cfg.context_full_budget
        if budget is not None and 0 < budget < full:  # few turns fit: direct matches first
            context = context * budget / full
        votes = collect_votes(
            ranked, session_turns, rrf_k=self.config.search.rrf_k, context_weight=context
        )
        if speaker is not None:
            apply_speaker_focus(votes, session_turns, speaker, cfg.speaker_focus)
        recency = False
        if cfg.recency_weight > 0 and present_tense(query):
            recency = apply_recency(
                votes, session_turns, cfg.recency_weight, RECENCY_POOL, cfg.recency_margin
            )
        text_cache = index.extras.setdefault("text_costs", {})  # per turn, per index version
        hits, used, filled = pack_passages(
            user_id,
            votes,
            session_turns,
            self._count,
            k=k,
            budget=budget,
            date_header=self.config.units.date_prefix,
            length_exponent=cfg.length_exponent,
            length_free=cfg.length_free,
            length_keep_share=cfg.length_keep_share,
            cost_cache=text_cache,
        )
        hits = [self._with_unit_scores(h, unit_scores) for h in hits]
        if budget is None:  # one turn per hit: hand back the turn's stored unit when it has one
            hits = self._as_turn_units(user_id, hits)
        diagnostics["passages"] = {
            "units_ranked": len(ranked),
            "turns_voted": len(votes.turn),
            "turns_packed": sum(len(h.memory.turn_ids) for h in hits),
            "tokens_used": used,
            "present_tense": recency,
            "speaker": speaker,
        }
        timings["passages"] = (time.perf_counter() - t0) * 1000
        return hits, filled

    @staticmethod
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

    def _as_turn_units(self, user_id: str, hits: list[Hit]) -> list[Hit]:
        """Swap one-turn passages for the stored `turn` memory of that turn where it exists."""

        def unit_id(h: Hit) -> str:
            return turn_unit_id(user_id, h.memory.session_id, h.memory.turn_ids[0])

        passages = [h for h in hits if h.memory.granularity == "passage"]
        want = [unit_id(h) for h in passages]
        stored = {m.id: m for m in self.store.memories(user_id, want)} if want else {}
        return [
            replace(h, memory=stored.get(unit_id(h), h.memory))
            if h.memory.granularity == "passage"
            else h
            for h in hits
        ]
