"""Engine side of RMM's retrospective reflection: rerank at retrieval, learn at feedback.

`RerankStage` owns the rerankers of one `ReflectiveMemory` (a prior shared by its users plus
per-user offsets, one shared reranker, or one per user: `RerankConfig.scope`). It reranks the
head of a retriever ranking (`apply`) or texts from any retriever (`rerank_texts`), recording
what it showed in a `RerankRecord`, and turns feedback on a `Retrieval`, `RankedTexts` or
`RerankRecord` into REINFORCE episodes (`feedback`; reading the answer's citations is
`reflective_memory.rmm.answer_feedback`, the learned rerankers and their storage
`reflective_memory.rmm.rerankers`). This is the one feedback path: the framework adapters
call it through `ReflectiveMemory.rerank_texts` / `ReflectiveMemory.feedback`.

The vectors of recent rankings are kept in memory; a record alone (from another process, or
long ago) is enough for feedback too: the query is embedded again and the candidates are read
from the user's index (or the texts embedded again). Learned state is kept in a
`reflective_memory.storage.state.StateStore` (the database's, or files beside an embedded store).
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from reflective_memory.embed import Embedder, encode_query
from reflective_memory.errors import InvalidInputError
from reflective_memory.retrieval.timeframe import time_frame
from reflective_memory.rmm.answer_feedback import (
    FeedbackResult,
    candidate_positions,
    read_answer,
)
from reflective_memory.rmm.citations import attribute, parse_citations
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode, RankedTexts, RerankResult
from reflective_memory.rmm.features import Candidates, citation_rewards, rank_prior
from reflective_memory.rmm.personal import PersonalReranker
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.rerankers import Rerankers
from reflective_memory.storage.state import StateStore
from reflective_memory.storage.user_index import UserIndex
from reflective_memory.text import parse_timestamp
from reflective_memory.types import RerankRecord, Retrieval
from reflective_memory.validation import check_id

__all__ = ["RerankStage", "FeedbackResult", "CallerReranker", "CUSTOM_SCOPE"]

logger = logging.getLogger(__name__)

_EPISODE_CACHE = 512
#: Side features read from the stored `Memory` objects (fetched only when one is used).
_MEMORY_FEATURES = frozenset({"cost", "recency", "size", "derived"})


#: `RerankRecord.scope` of a ranking made with a reranker the caller passed in.
CUSTOM_SCOPE = "custom"


@runtime_checkable
class CallerReranker(Protocol):
    """A reranker a caller passes to `RerankStage.rerank_texts` instead of the engine's.

    `Reranker` is one. `rerank` returns an object with `order` (every candidate position,
    best first) and `scores` (`(K,)`); `partial_fit` learns from an `Episode`.
    """

    def rerank(
        self,
        query: np.ndarray,
        candidates: np.ndarray,
        prior: np.ndarray | None = None,
        *,
        explore: bool = False,
    ) -> Any:
        """Order the candidates."""
        ...

    def partial_fit(self, episode: Episode) -> Any:
        """Learn from one feedback episode."""
        ...


@dataclass
class _Kept:
    """The vectors of one ranking, kept for feedback on it."""

    user_id: str
    query: np.ndarray
    candidates: np.ndarray
    keys: list[str]
    reranker: CallerReranker | None = None


@dataclass
class _View:
    """What one feedback call is about: the shown items in citation order."""

    user_id: str
    retrieval_id: str
    ids: list[str]
    where: list[int | None]  # each item's candidate position (None: not reranked)
    record: RerankRecord | None
    texts: Sequence[str] | None = None


@dataclass
class _TextOrder:
    """How `RerankStage.rerank_texts` ordered its texts, before the shown head is cut."""

    query: np.ndarray  # the query's embedding
    candidates: np.ndarray  # the texts' embeddings, (K, dim)
    cosines: np.ndarray  # each text's cosine with the query (the prior)
    features: np.ndarray | None
    order: list[int]  # every text position, best first
    scores: np.ndarray  # each text's score, by position
    explored: bool
    updates: int  # the engine reranker's updates (0 for a caller's reranker or none)


class RerankStage:
    """The RMM rerank stage of one engine: rerank at retrieval, learn from feedback.

    Args:
        config: The reranker settings (`MemoryConfig.rerank`).
        embedder: The engine's embedder (defines the vector size; embeds texts and queries).
        state: Where learned state is kept (see `reflective_memory.rmm.rerankers`).
        legacy: A directory of reranker files written before 0.2, moved into `state` on first
            use (see `Rerankers`).

    Attributes:
        rerankers: The engine's learned rerankers (`Rerankers`).
    """

    def __init__(
        self,
        config: RerankConfig,
        embedder: Embedder,
        state: StateStore,
        *,
        legacy: Path | None = None,
    ) -> None:
        self.config = config
        self.embedder = embedder
        self.rerankers = Rerankers(config, embedder.dim, state, legacy=legacy)
        self._lock = self.rerankers.lock
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    def reranker(self, user_id: str) -> Reranker | PersonalReranker:
        """The reranker that serves `user_id` (see `Rerankers.reranker`)."""
        return self.rerankers.reranker(user_id)

    def forget_retrievals(self, user_id: str) -> int:
        """Drop the kept query and candidate vectors of a user's retrievals; return how many."""
        with self._lock:
            gone = [rid for rid, kept in self._kept.items() if kept.user_id == user_id]
            for rid in gone:
                del self._kept[rid]
        return len(gone)

    def forget(self, user_id: str) -> None:
        """Erase what the stage holds of a user: kept vectors and learned state.

        See `Rerankers.forget`.
        """
        with self._lock:
            self.forget_retrievals(user_id)
            self.rerankers.forget(user_id)

    # -------------------------------------------------------------- retrieval
    def _memories(
        self, index: UserIndex, ids: list[str], fetch: Callable[[list[str]], list[Any]] | None
    ) -> list[Any] | None:
        """Stored memories of the candidates, cached per index version (None without fetch)."""
        if fetch is None:
            return None
        cache: dict[str, Any] = index.extras.setdefault("rerank_memories", {})
        missing = [m for m in ids if m not in cache]
        if missing:
            for mem in fetch(missing):
                cache[getattr(mem, "id", "")] = mem
        return [cache.get(m) for m in ids]

    def _keep(self, retrieval_id: str, kept: _Kept) -> None:
        """Keep a ranking's vectors for feedback on it (a bounded number of rankings)."""
        with self._lock:
            self._kept[retrieval_id] = kept
            self._kept.move_to_end(retrieval_id)
            while len(self._kept) > _EPISODE_CACHE:
                self._kept.popitem(last=False)

    def apply(
        self,
        user_id: str,
        index: UserIndex,
        qvec: np.ndarray,
        order: list[int],
        scores: list[dict[str, float]],
        *,
        explore: bool,
        retrieval_id: str,
        query: str,
        fetch: Callable[[list[str]], list[Any]] | None = None,
    ) -> tuple[list[int], list[dict[str, float]], RerankRecord | None]:
        """Rerank the first `top_k` positions of a ranking; the tail keeps its order.

        Args:
            user_id: Whose reranker ranks.
            index: The user's index (`order` holds positions into it).
            qvec: The query's embedding.
            order: The retriever's ranking (index positions, best first).
            scores: Each ranked position's scores by ranker, as `order`.
            explore: Sample the reranked top-M with Gumbel noise.
            retrieval_id: Id of the retrieval (the record's, and the key of the vectors kept
                for feedback).
            query: The query text as ranked (side features; feedback re-embeds it when the
                vectors are no longer kept).
            fetch: Stored memories by id, for the side features that read them (without it
                those features are neutral).

        Returns:
            The new order, its scores (each with the reranker's `rerank` score added for the
            head) and the `RerankRecord` of what was reranked (None when nothing was:
            `order` empty). Store the record on the `Retrieval` (`rerank`) and its
            `as_diagnostics()` under `diagnostics["rerank"]`.
        """
        k = min(self.config.top_k, len(order))
        if k == 0:
            return order, scores, None
        q = np.asarray(qvec, dtype=np.float32).reshape(-1)
        head = order[:k]
        res, record = self._rerank_head(
            user_id,
            index,
            q,
            head,
            scores[:k],
            explore=explore,
            retrieval_id=retrieval_id,
            query=query,
            fetch=fetch,
        )
        new_head = [head[i] for i in res.order]
        new_scores = [{**scores[i], "rerank": float(res.scores[i])} for i in res.order]
        return new_head + order[k:], new_scores + scores[k:], record

    def _rerank_head(
        self,
        user_id: str,
        index: UserIndex,
        q: np.ndarray,
        head: list[int],
        scores: list[dict[str, float]],
        *,
        explore: bool,
        retrieval_id: str,
        query: str,
        fetch: Callable[[list[str]], list[Any]] | None,
    ) -> tuple[RerankResult, RerankRecord]:
        """Rerank the head of a ranking, record it and keep its vectors (see `apply`)."""
        rr = self.reranker(user_id)
        cand = index.dense.vectors[head]
        dense = cand @ q
        prior = rank_prior(dense)
        ids = [index.ids[p] for p in head]
        keys = [index.keys[p] for p in head]
        feats = self._head_features(rr, index, head, ids, keys, query, dense, scores, fetch)
        if _untrained(rr) and not explore:
            # an untrained reranker keeps the retriever's order: skip scoring it
            res = RerankResult(list(range(len(head))), np.asarray(prior, dtype=np.float32), False)
        else:
            with self._lock:
                res = rr.rerank(q, cand, prior, explore=explore, features=feats)
        record = _record(
            user_id,
            retrieval_id,
            query,
            self.config.scope,
            ids,
            res.order,
            prior,
            feats,
            updates=rr.n_updates_,
            top_m=self.config.top_m,
            explored=res.sampled,
        )
        self._keep(retrieval_id, _Kept(user_id, q, cand.copy(), keys))
        return res, record

    def _head_features(
        self,
        rr: Reranker | PersonalReranker,
        index: UserIndex,
        head: list[int],
        ids: list[str],
        keys: list[str],
        query: str,
        dense: np.ndarray,
        scores: list[dict[str, float]],
        fetch: Callable[[list[str]], list[Any]] | None,
    ) -> np.ndarray | None:
        """The side features of a ranking's head (None when the reranker uses none)."""
        if not rr.features:
            return None
        need_mem = bool(set(rr.features) & _MEMORY_FEATURES)
        mems = self._memories(index, ids, fetch) if need_mem else None
        known = index.overlap(query, head) if query and "overlap" in rr.features else None
        cands = Candidates(keys, query, dense, scores, memories=mems, overlap=known)
        return rr.features_of(cands)

    def rerank_texts(
        self,
        user_id: str,
        query: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str | None] | None = None,
        top_n: int | None = None,
        explore: bool = False,
        keep_order: bool = False,
        reranker: CallerReranker | None = None,
        times: Sequence[Any] | None = None,
        now: Any = None,
    ) -> RankedTexts:
        """Rerank texts from any retriever with the user's reranker and record what is shown.

        Query and texts are embedded with the engine's embedder; the reranker serving
        `user_id` (the one `apply` uses) orders them, its prior being each text's cosine with
        the query (an untrained reranker keeps the cosine order; with reranking off
        (`enabled=False`) the cosine order is used). The vectors are kept for `feedback` on
        the result.

        Args:
            user_id: Whose reranker ranks (and learns from feedback on the result).
            query: The query text.
            texts: The candidates' texts, in the retriever's order (may be empty).
            ids: An id per text (None entries: the text's position), by which feedback reports
                rewards; when they repeat, every text is named by its position (`"0"`,
                `"1"`, ...). Default: positions.
            top_n: Texts to show (default: all of them).
            explore: Sample the shown head with Gumbel noise (for learning).
            keep_order: Show the texts in the order given (ranked elsewhere), only recording
                them for feedback.
            reranker: A reranker to use instead of the engine's (neither saved nor used by
                `retrieve`); feedback on the result trains it with `partial_fit`.
            times: When each text was said (None entries: unknown), any timestamp `add_turn`
                takes. When the query names a period ("two weeks ago", "in March"), resolved
                against `now`, the texts said in it come first, in the reranker's order.
            now: When the query is asked (default: the newest of `times`).

        Returns:
            The `RankedTexts`: shown positions, scores, cosines and the `RerankRecord`.

        Raises:
            InvalidInputError: Bad user id, query, texts, ids, `top_n` or reranker.
        """
        _check_texts_call(user_id, query, texts, top_n, reranker)
        texts = list(texts)
        names = _text_ids(ids, len(texts))
        said = _text_times(times, len(texts))
        asked = parse_timestamp(now)
        ordered = self._order_texts(user_id, query, texts, explore, keep_order, reranker)
        if said is not None and not keep_order:
            ordered.order = _said_in_frame_first(ordered.order, query, said, asked)
        n = len(texts) if top_n is None else min(top_n, len(texts))
        return self._show_texts(user_id, query, texts, names, ordered, n, reranker)

    def _order_texts(
        self,
        user_id: str,
        query: str,
        texts: list[str],
        explore: bool,
        keep_order: bool,
        reranker: CallerReranker | None,
    ) -> _TextOrder:
        """Embed the query and texts and order the texts (see `rerank_texts`)."""
        k = len(texts)
        q = np.asarray(encode_query(self.embedder, query), dtype=np.float32).reshape(-1)
        m = np.zeros((0, q.shape[0]), dtype=np.float32)
        if k:
            m = np.asarray(self.embedder.encode(texts), dtype=np.float32).reshape(k, -1)
        cos = m @ q
        rr: Any = reranker
        if rr is None and self.config.enabled:
            rr = self.reranker(user_id)
        feats = None
        if isinstance(rr, (Reranker, PersonalReranker)):
            feats = rr.features_of(Candidates(texts, query=query, dense=cos))
        explored = False
        if keep_order:
            order, scores = list(range(k)), cos
        elif rr is None or k == 0:
            order, scores = [int(i) for i in np.argsort(-cos, kind="stable")], cos
        else:
            order, scores, explored = self._score_texts(rr, q, m, cos, feats, explore)
        updates = rr.n_updates_ if isinstance(rr, (Reranker, PersonalReranker)) else 0
        return _TextOrder(q, m, cos, feats, order, scores, explored, updates)

    def _score_texts(
        self,
        rr: CallerReranker,
        q: np.ndarray,
        m: np.ndarray,
        cos: np.ndarray,
        feats: np.ndarray | None,
        explore: bool,
    ) -> tuple[list[int], np.ndarray, bool]:
        """Order texts with a reranker: the order, its scores and whether it sampled.

        Raises:
            InvalidInputError: The reranker did not order and score every candidate.
        """
        kw = {} if feats is None else {"features": feats}
        with self._lock:
            res = rr.rerank(q, m, cos, explore=explore, **kw)
        order = [int(i) for i in res.order]
        scores = np.asarray(res.scores, dtype=np.float32).reshape(-1)
        k = m.shape[0]
        if sorted(order) != list(range(k)) or scores.shape != (k,):
            raise InvalidInputError("the reranker must order every candidate and score it")
        explored = res.sampled if isinstance(res, RerankResult) else bool(explore)
        return order, scores, explored

    def _show_texts(
        self,
        user_id: str,
        query: str,
        texts: list[str],
        names: list[str],
        ordered: _TextOrder,
        n: int,
        reranker: CallerReranker | None,
    ) -> RankedTexts:
        """Record the first `n` ordered texts as shown, keep their vectors and return them."""
        record = _record(
            user_id,
            uuid.uuid4().hex,
            query,
            self.config.scope if reranker is None else CUSTOM_SCOPE,
            names,
            ordered.order,
            ordered.cosines,
            ordered.features,
            updates=ordered.updates,
            top_m=n,
            explored=ordered.explored,
        )
        self._keep(
            record.retrieval_id, _Kept(user_id, ordered.query, ordered.candidates, texts, reranker)
        )
        shown = ordered.order[:n]
        return RankedTexts(
            order=tuple(shown),
            scores=tuple(float(ordered.scores[i]) for i in shown),
            cosines=tuple(float(ordered.cosines[i]) for i in shown),
            texts=tuple(texts),
            record=record,
        )

    # --------------------------------------------------------------- feedback
    def _view(self, shown: Retrieval | RankedTexts | RerankRecord) -> _View:
        """What was shown, in citation order, and where each item sits among the candidates."""
        if isinstance(shown, Retrieval):
            rec = shown.rerank if shown.rerank is not None else _legacy_record(shown)
            hits = shown.hits
            where: list[int | None] = [None] * len(hits)
            if rec is not None:
                pos = candidate_positions(shown, rec.candidates)
                where = [pos.get(h.memory.id) for h in hits]
            ids = [h.memory.id for h in hits]
            return _View(shown.user_id, shown.retrieval_id, ids, where, rec)
        if isinstance(shown, RankedTexts):
            rec, texts = shown.record, shown.texts
        elif isinstance(shown, RerankRecord):
            rec, texts = shown, None
        else:
            raise InvalidInputError(
                "feedback takes a Retrieval, RankedTexts or RerankRecord, "
                f"got {type(shown).__name__}"
            )
        at = {mid: i for i, mid in enumerate(rec.candidates)}
        ids = list(rec.reranked[: rec.top_m])
        return _View(rec.user_id, rec.retrieval_id, ids, [at.get(i) for i in ids], rec, texts)

    def _kept_for(self, rec: RerankRecord) -> _Kept | None:
        """The kept vectors of a ranking, if this process still has them."""
        with self._lock:
            kept = self._kept.get(rec.retrieval_id)
        if kept is None or kept.user_id != rec.user_id:
            return None
        return kept if kept.candidates.shape[0] == len(rec.candidates) else None

    def _rebuild(
        self,
        rec: RerankRecord,
        texts: Sequence[str] | None,
        index_fn: Callable[[str], UserIndex] | None,
    ) -> _Kept | None:
        """A ranking's vectors again: the texts re-embedded, or the user's index (if unchanged)."""
        q = np.asarray(encode_query(self.embedder, rec.query), dtype=np.float32).reshape(-1)
        if texts is not None:
            if len(texts) != len(rec.candidates) or not texts:
                return None
            m = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
            return _Kept(rec.user_id, q, m.reshape(len(texts), -1), list(texts))
        if index_fn is None or rec.scope == CUSTOM_SCOPE:
            return None
        index = index_fn(rec.user_id)
        where = {mid: p for p, mid in enumerate(index.ids)}
        if any(mid not in where for mid in rec.candidates):
            return None  # memories changed since: the episode cannot be rebuilt
        pos = [where[m] for m in rec.candidates]
        keys = [index.keys[p] for p in pos]
        return _Kept(rec.user_id, q, index.dense.vectors[pos].copy(), keys)

    def _features(self, rec: RerankRecord, kept: _Kept, learner: Any) -> np.ndarray | None:
        """The episode's side features: the recorded ones, else what the texts still tell."""
        if not isinstance(learner, (Reranker, PersonalReranker)) or not learner.n_features:
            return None
        if rec.features is not None:
            arr = np.asarray(rec.features, dtype=np.float32)
            if arr.shape == (len(rec.candidates), learner.n_features):
                return arr
        dense = kept.candidates @ kept.query  # retriever scores are gone
        return learner.features_of(Candidates(kept.keys, query=rec.query, dense=dense))

    def feedback(
        self,
        shown: Retrieval | RankedTexts | RerankRecord,
        answer: str | None,
        cited: Sequence[int] | None,
        index_fn: Callable[[str], UserIndex] | None,
        *,
        numbering: Mapping[int, int | None] | None = None,
    ) -> FeedbackResult:
        """Turn an answer (or cited numbers) into rewards and train the reranker that ranked.

        Each shown item that came from the reranked candidates gets reward +1 when cited and
        -1 when not, and the episode trains the reranker that ranked (the user's, or the one
        given to `rerank_texts`). The ranking's vectors are the ones kept when it was made, or
        rebuilt: texts re-embedded (`RankedTexts`), or the user's index read again through
        `index_fn` (when none of the candidates changed).

        Args:
            shown: A `Retrieval` (citations name its hits), or `RankedTexts` / a
                `RerankRecord` (citations name the texts shown, best first).
            answer: The answer, whose citation markers are read (see `read_answer`).
            cited: The cited numbers instead of an answer.
            index_fn: The user's index by user id (to rebuild a retrieval's vectors).
            numbering: What each citation number names (see `read_answer`).

        Returns:
            The `FeedbackResult`; `learned=False` with a `reason` when nothing was learned
            (nothing cited or readable, an uncited answer in which the attribution fallback
            finds no shown item, reranking off, the ranking's memories changed).

        Raises:
            InvalidInputError: Not a shown ranking, neither answer nor citations, or a cited
                number names nothing.
        """
        view = self._view(shown)
        out = read_answer(
            len(view.ids),
            answer,
            cited,
            fallback=self.config.attribution_fallback,
            numbering=numbering,
            retrieval_id=view.retrieval_id,
            user_id=view.user_id,
        )
        if out.reason:
            return out
        ranking = self._ranking_to_learn(view, out, index_fn)
        if ranking is None:
            return out
        rec, kept = ranking
        return self._learn(view, out, rec, kept, answer)

    def _ranking_to_learn(
        self,
        view: _View,
        out: FeedbackResult,
        index_fn: Callable[[str], UserIndex] | None,
    ) -> tuple[RerankRecord, _Kept] | None:
        """The record and vectors feedback trains on, or None with `out.reason` set.

        With reranking off (and no caller's reranker), `out` gets the citations' rewards
        unless they were inferred (see `feedback`).
        """
        rec = view.record
        kept = None if rec is None else self._kept_for(rec)
        custom = None if kept is None else kept.reranker
        if rec is not None and rec.scope == CUSTOM_SCOPE and custom is None:
            out.reason = "the reranker given for this ranking is no longer kept"
            return None
        if custom is None and not self.config.enabled:
            if not out.inferred:
                rewards = citation_rewards(len(view.ids), out.cited)
                out.rewards = {view.ids[j]: float(r) for j, r in enumerate(rewards)}
            out.inferred = False
            out.reason = "reranking is off (config.rerank.enabled)"
            return None
        if rec is None:
            out.reason = "the retrieval was not reranked"
            return None
        if kept is None:
            kept = self._rebuild(rec, view.texts, index_fn)
        if kept is None:
            out.reason = "the retrieval was not reranked or its memories changed"
            return None
        return rec, kept

    def _attribute(
        self,
        out: FeedbackResult,
        answer: str | None,
        kept: _Kept,
        shown_items: list[int],
        positions: list[int],
        n: int,
    ) -> bool:
        """Infer an uncited answer's citations from its sentences' similarity to shown items.

        Sets `out.cited` and `out.similarities`; False (with `out.reason`) when no sentence
        matches a shown item.
        """
        text = parse_citations(answer, 0).text  # type: ignore[arg-type]
        used, best = attribute(
            text, kept.candidates[positions], self.embedder, self.config.attribution_threshold
        )
        out.cited = tuple(shown_items[i] for i in used)
        sims = [float("nan")] * n
        for i, j in enumerate(shown_items):
            sims[j] = float(best[i])
        out.similarities = sims
        if not used:  # no evidence either way: an uncited answer is no [NO_CITE]
            out.reason = "the answer has no citation and no sentence of it matches a shown item"
            return False
        return True

    def _learn(
        self,
        view: _View,
        out: FeedbackResult,
        rec: RerankRecord,
        kept: _Kept,
        answer: str | None,
    ) -> FeedbackResult:
        """Reward the shown items that came from the candidates and train the reranker."""
        n = len(view.ids)
        shown_items = [j for j in range(n) if view.where[j] is not None]
        if not shown_items:
            out.reason = "no hit came from the reranked candidates"
            return out
        positions = [int(view.where[j]) for j in shown_items]  # type: ignore[arg-type]
        if out.inferred and not self._attribute(out, answer, kept, shown_items, positions, n):
            return out
        cited_set = set(out.cited)
        rewards = citation_rewards(
            len(shown_items), [i for i, j in enumerate(shown_items) if j in cited_set]
        )
        custom = kept.reranker
        learner = custom if custom is not None else self.reranker(rec.user_id)
        prior = np.asarray(rec.prior, dtype=np.float32)
        feats = self._features(rec, kept, learner)
        ep = Episode(kept.query, kept.candidates, positions, rewards, prior, feats)
        if custom is not None:
            with self._lock:
                custom.partial_fit(ep)
            rep = custom.last_fit_ if isinstance(custom, Reranker) else None
        else:
            rep = self.rerankers.learn(rec.user_id, ep)
        out.rewards = {view.ids[j]: float(r) for j, r in zip(shown_items, rewards, strict=True)}
        out.learned = True
        if rep is not None:
            out.updates, out.pending, out.loss = rep.updates, rep.pending, rep.loss
        return out


def _untrained(rr: Reranker | PersonalReranker) -> bool:
    """True while `rr` scores exactly as the retriever ranks (nothing learned yet)."""
    if isinstance(rr, PersonalReranker):
        return rr.prior.n_updates_ == 0 and rr.adapter.is_zero
    return rr.n_updates_ == 0


def _check_texts_call(
    user_id: str,
    query: str,
    texts: Sequence[str],
    top_n: int | None,
    reranker: CallerReranker | None,
) -> None:
    """Raise `InvalidInputError` on a bad `rerank_texts` argument (ids are checked apart)."""
    check_id("user_id", user_id)
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty str")
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError("texts must be a sequence of str")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)):
        raise InvalidInputError(f"top_n must be None or a positive int, got {top_n!r}")
    if top_n is not None and top_n < 1:
        raise InvalidInputError(f"top_n must be None or a positive int, got {top_n!r}")
    if reranker is not None and not isinstance(reranker, CallerReranker):
        raise InvalidInputError("reranker must have rerank(...) and partial_fit(episode)")


def _text_times(times: Sequence[Any] | None, k: int) -> list[datetime | None] | None:
    """When each of `k` texts was said (aware), or None when no times are given."""
    if times is None:
        return None
    if not isinstance(times, Sequence) or isinstance(times, (str, bytes)) or len(times) != k:
        raise InvalidInputError("times must give one time (or None) per text")
    return [parse_timestamp(t) for t in times]


def _said_in_frame_first(
    order: list[int], query: str, said: list[datetime | None], now: datetime | None
) -> list[int]:
    """`order` with the texts said in the period the query names first (`time_frame`).

    The period is resolved against `now`, else the newest time given; without a period, or
    without times, the order is kept.
    """
    known = [t for t in said if t is not None]
    if not known:
        return order
    frame = time_frame(query, max(known) if now is None else now)
    if frame is None:
        return order
    inside = {i for i, t in enumerate(said) if t is not None and frame.start <= t < frame.end}
    return [i for i in order if i in inside] + [i for i in order if i not in inside]


def _text_ids(ids: Sequence[str | None] | None, k: int) -> list[str]:
    """One distinct id per text: the ids given (positions for None), else the positions."""
    if ids is None:
        return [str(i) for i in range(k)]
    if isinstance(ids, str) or len(ids) != k:
        raise InvalidInputError("ids must give one id (or None) per text")
    out = [str(i) if x is None else x for i, x in enumerate(ids)]
    if not all(isinstance(x, str) for x in out):
        raise InvalidInputError("ids must be str or None")
    return out if len(set(out)) == k else [str(i) for i in range(k)]


def _record(
    user_id: str,
    retrieval_id: str,
    query: str,
    scope: str,
    ids: Sequence[str],
    order: Sequence[int],
    prior: np.ndarray,
    feats: np.ndarray | None,
    *,
    updates: int,
    top_m: int,
    explored: bool,
) -> RerankRecord:
    """The `RerankRecord` of one ranking (prior rounded to 6 decimals, features to 5)."""
    return RerankRecord(
        user_id=user_id,
        retrieval_id=retrieval_id,
        scope=scope,
        top_k=len(ids),
        top_m=top_m,
        explored=bool(explored),
        updates=int(updates),
        candidates=tuple(ids),
        reranked=tuple(ids[i] for i in order),
        prior=tuple(round(float(x), 6) for x in prior),
        features=None
        if feats is None
        else tuple(tuple(float(v) for v in row) for row in np.round(feats, 5)),
        query=query,
    )


def _legacy_record(retrieval: Retrieval) -> RerankRecord | None:
    """The record of a `Retrieval` made without one: rebuilt from `diagnostics["rerank"]`."""
    info = retrieval.diagnostics.get("rerank")
    if not isinstance(info, dict):
        return None
    query = str(retrieval.diagnostics.get("search_query") or retrieval.query)  # as ranked
    try:
        return RerankRecord.from_diagnostics(
            info, user_id=retrieval.user_id, retrieval_id=retrieval.retrieval_id, query=query
        )
    except (KeyError, TypeError, ValueError):
        logger.info("diagnostics['rerank'] of retrieval %s unreadable", retrieval.retrieval_id)
        return None
