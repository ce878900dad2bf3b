"""Engine side of RMM's retrospective reflection: record what was shown, learn from citations.

The model RMM trains is the turn ranker that fills the budget (`reflective_memory.retrieval.
ranker`), taught by `reflective_memory.rmm.turn_learning.TurnLearning`. A `retrieve` records
the shown passages' turns with their feature rows (`Retrieval.rerank`, made by the `shown`
stage); `RerankStage.rerank_texts` ranks texts from any retriever with the same weights over
the features a text has without a conversation (`reflective_memory.rmm.text_rows`) and records
them the same way. `RerankStage.feedback` reads the answer's citations
(`reflective_memory.rmm.answer_feedback`) and gives the episode, cited passages against the
shown ones not cited, to `TurnLearning`. This is the one feedback path: the framework adapters
call it through `ReflectiveMemory.rerank_texts` / `ReflectiveMemory.feedback`.

A caller may rank texts with a model of its own (`CallerReranker`, e.g. RMM's embedding
reranker `reflective_memory.rmm.reranker.Reranker`): feedback on such a ranking trains that
model (`partial_fit`), and nothing of the engine's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

from reflective_memory.embed import Embedder, encode_query
from reflective_memory.errors import InvalidInputError
from reflective_memory.kept_retrievals import RetrievalCache
from reflective_memory.retrieval.rerank import TURNS_SCOPE
from reflective_memory.retrieval.timeframe import time_frame
from reflective_memory.rmm.answer_feedback import FeedbackResult, read_answer
from reflective_memory.rmm.citations import attribute, memory_text, parse_citations
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode, RankedTexts, RerankResult
from reflective_memory.rmm.text_rows import text_rows
from reflective_memory.rmm.turn_learning import TurnLearning, episode_from_record
from reflective_memory.text import parse_timestamp
from reflective_memory.types import RerankRecord, Retrieval
from reflective_memory.validation import check_id

__all__ = ["RerankStage", "FeedbackResult", "CallerReranker", "CUSTOM_SCOPE"]

logger = logging.getLogger(__name__)

#: Rankings by a caller's reranker kept for the feedback on them.
_KEPT = 512

#: `RerankRecord.scope` of a ranking made with a reranker the caller passed in.
CUSTOM_SCOPE = "custom"


@runtime_checkable
class CallerReranker(Protocol):
    """A reranker a caller passes to `RerankStage.rerank_texts` instead of the engine's.

    `reflective_memory.rmm.reranker.Reranker` is one. `rerank` returns an object with `order`
    (every candidate position, best first) and `scores` (`(K,)`); `partial_fit` learns from an
    `Episode`.
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
    """A caller's ranking of texts, kept for feedback on it (its vectors and its model)."""

    retrieval_id: str
    user_id: str
    query: np.ndarray
    candidates: np.ndarray
    cosines: np.ndarray
    reranker: CallerReranker


class RerankStage:
    """RMM's retrospective reflection in one engine: rank texts, learn from feedback.

    Args:
        config: The feedback settings (`MemoryConfig.rerank`).
        embedder: The engine's embedder (embeds texts, queries and answer sentences).
        state: Where learned state is kept (the store's, or files beside an embedded store).
        learning: The turn ranker's citation-taught weights.

    Attributes:
        learning: The turn ranker's weights (`TurnLearning`), as given.
        state: The learned-state store, as given.
    """

    def __init__(
        self,
        config: RerankConfig,
        embedder: Embedder,
        state: Any,
        *,
        learning: TurnLearning,
    ) -> None:
        self.config, self.embedder, self.state, self.learning = config, embedder, state, learning
        self._lock = learning.lock
        self._kept: RetrievalCache[_Kept] = RetrievalCache(_KEPT)

    def forget_retrievals(self, user_id: str) -> int:
        """Drop the kept vectors of a user's rankings by a caller's model; return how many."""
        return self._kept.forget(user_id)

    def forget(self, user_id: str) -> None:
        """Erase what the stage holds of a user: kept vectors and the user's own weights."""
        with self._lock:
            self.forget_retrievals(user_id)
            self.learning.forget(user_id)

    # ------------------------------------------------------------------ texts
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
        """Rank texts from any retriever with the user's turn ranker and record what is shown.

        Query and texts are embedded with the engine's embedder; each text gets the feature
        row a text has without a conversation (`text_rows`: its place in the order given, its
        query cosine and BM25) and the weights that rank the user's turns score it (with
        learning off, the fitted ranker's). Feedback on the result teaches those weights.

        Args:
            user_id: Whose weights rank (and learn from feedback on the result).
            query: The query text.
            texts: The candidates' texts, in the retriever's order (may be empty).
            ids: An id per text (None entries: the text's position), by which feedback reports
                rewards; when they repeat, every text is named by its position (`"0"`,
                `"1"`, ...). Default: positions.
            top_n: Texts to show (default: all of them).
            explore: With a caller's `reranker`: sample its shown head (for learning).
            keep_order: Show the texts in the order given (ranked elsewhere), only recording
                them for feedback.
            reranker: A model of the caller's to rank with instead (`CallerReranker`); feedback
                on the result trains it with `partial_fit`, and nothing of the engine's.
            times: When each text was said (None entries: unknown), any timestamp `add_turn`
                takes. When the query names a period ("two weeks ago", "in March"), resolved
                against `now`, the texts said in it come first, in the ranker's order.
            now: When the query is asked (default: the newest of `times`).

        Returns:
            The `RankedTexts`: shown positions, scores, cosines and the `RerankRecord`.

        Raises:
            InvalidInputError: Bad user id, query, texts, ids, `top_n` or reranker.
        """
        _check_texts_call(user_id, query, texts, top_n, reranker)
        texts = list(texts)
        k = len(texts)
        names = _text_ids(ids, k)
        said = _text_times(times, k)
        asked = parse_timestamp(now)
        q = np.asarray(encode_query(self.embedder, query), dtype=np.float32).reshape(-1)
        m = np.zeros((0, q.shape[0]), dtype=np.float32)
        if k:
            m = np.asarray(self.embedder.encode(texts), dtype=np.float32).reshape(k, -1)
        cos = m @ q
        rows = text_rows(query, texts, cos)
        explored = False
        if reranker is not None and not keep_order and k:
            order, scores, explored = _caller_order(reranker, q, m, cos, explore, self._lock)
        else:
            scores = rows @ self.learning.weights(user_id)
            order = list(range(k)) if keep_order else _best_first(scores)
        if said is not None and not keep_order:
            order = _said_in_frame_first(order, query, said, asked)
        n = k if top_n is None else min(top_n, k)
        shown = order[:n]
        rid = uuid.uuid4().hex
        if reranker is not None:
            record = _record(user_id, rid, query, CUSTOM_SCOPE, names, order, cos, n, explored)
            self._kept.put(_Kept(rid, user_id, q, m, cos, reranker))
        else:
            record = RerankRecord(
                user_id=user_id,
                retrieval_id=rid,
                scope=TURNS_SCOPE,
                top_k=n,
                top_m=n,
                explored=False,
                updates=self.learning.episodes(),
                candidates=tuple(names[i] for i in shown),
                reranked=tuple(names[i] for i in shown),
                prior=tuple(round(float(scores[i]), 6) for i in shown),
                features=tuple(tuple(float(v) for v in np.round(rows[i], 5)) for i in shown),
                query=query,
                groups=tuple(range(n)),
            )
        return RankedTexts(
            order=tuple(shown),
            scores=tuple(float(scores[i]) for i in shown),
            cosines=tuple(float(cos[i]) for i in shown),
            texts=tuple(texts),
            record=record,
        )

    # --------------------------------------------------------------- feedback
    def feedback(
        self,
        shown: Retrieval | RankedTexts | RerankRecord,
        answer: str | None,
        cited: Sequence[int] | None,
        *,
        numbering: Mapping[int, int | None] | None = None,
    ) -> FeedbackResult:
        """Turn an answer (or cited numbers) into an episode and teach the ranker that ranked.

        The shown passages (or texts) the answer cited get reward +1, the others -1; the
        episode teaches the turn ranker's weights (`TurnLearning.learn`), or the caller's
        model that ranked the texts.

        Args:
            shown: A `Retrieval` (citations name its hits), or `RankedTexts` / a
                `RerankRecord` (citations name the texts shown, best first).
            answer: The answer, whose citation markers are read (see `read_answer`).
            cited: The cited numbers instead of an answer.
            numbering: What each citation number names (see `read_answer`).

        Returns:
            The `FeedbackResult`; `learned=False` with a `reason` when nothing was learned
            (nothing cited or readable, an uncited answer in which the attribution fallback
            finds no shown item, every or no shown item cited, learning off).

        Raises:
            InvalidInputError: Not a shown ranking, neither answer nor citations, or a cited
                number names nothing.
        """
        ids, texts, rec, retrieval_id, user_id = _view(shown)
        out = read_answer(
            len(ids),
            answer,
            cited,
            fallback=self.config.attribution_fallback,
            numbering=numbering,
            retrieval_id=retrieval_id,
            user_id=user_id,
        )
        if out.reason:
            return out
        if out.inferred and not self._attribute(out, answer, texts):
            return out
        flags = [j in set(out.cited) for j in range(len(ids))]
        out.rewards = {ids[j]: 1.0 if flags[j] else -1.0 for j in range(len(ids))}
        if rec is not None and rec.scope == CUSTOM_SCOPE:
            return self._learn_custom(out, rec, flags)
        if not self.config.enabled:
            out.reason = "learning is off (config.rerank.enabled)"
            return out
        if rec is None or rec.groups is None or rec.features is None:
            out.reason = "the retrieval recorded no shown turns (passages off, or no hits)"
            return out
        width = len(rec.features[0]) if rec.features else 0
        if width != len(self.learning.prior_vector) or max(rec.groups, default=0) >= len(ids):
            out.reason = "the record's turn features are not this ranker's"
            return out
        if rec.teams is not None and len(rec.teams) != len(rec.groups):
            out.reason = "the record's interleaving teams do not match its turns"
            return out
        episode = episode_from_record(rec.features, rec.groups, flags, rec.teams)
        fit = self.learning.learn(user_id, episode)
        if fit is None:
            out.reason = "every shown item was cited, or none: nothing to tell apart"
            return out
        out.learned, out.updates, out.pending, out.loss = True, 1, fit.pending, fit.loss
        out.serving = fit.serving
        return out

    def _attribute(
        self, out: FeedbackResult, answer: str | None, texts: Sequence[str] | None
    ) -> bool:
        """Infer an uncited answer's citations from its sentences' similarity to shown items.

        Sets `out.cited` and `out.similarities`; False (with `out.reason`) when the shown
        texts are unknown or no sentence matches one of them.
        """
        if not texts:
            out.reason = "the answer has no citation and the shown texts are not at hand"
            return False
        vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        text = parse_citations(answer, 0).text  # type: ignore[arg-type]
        used, best = attribute(
            text, vectors.reshape(len(texts), -1), self.embedder, self.config.attribution_threshold
        )
        out.cited = tuple(used)
        out.similarities = [float(x) for x in best]
        if not used:  # no evidence either way: an uncited answer is no [NO_CITE]
            out.reason = "the answer has no citation and no sentence of it matches a shown item"
            return False
        return True

    def _learn_custom(
        self, out: FeedbackResult, rec: RerankRecord, flags: list[bool]
    ) -> FeedbackResult:
        """Train the caller's model that ranked the texts (`partial_fit`)."""
        kept = self._kept.get(rec.retrieval_id, rec.user_id)
        if kept is None:
            out.reason = "the reranker given for this ranking is no longer kept"
            return out
        at = {mid: i for i, mid in enumerate(rec.candidates)}
        shown = [at[i] for i in rec.reranked[: rec.top_m]]
        rewards = np.array([1.0 if f else -1.0 for f in flags], dtype=np.float32)
        ep = Episode(kept.query, kept.candidates, shown, rewards, kept.cosines)
        with self._lock:
            rep = getattr(kept.reranker.partial_fit(ep), "last_fit_", None)
        out.learned = True
        if rep is not None:
            out.updates, out.pending, out.loss = rep.updates, rep.pending, rep.loss
        return out


def _view(
    shown: Retrieval | RankedTexts | RerankRecord,
) -> tuple[list[str], list[str] | None, RerankRecord | None, str, str]:
    """What a feedback call is about.

    Returns:
        The shown items' ids and texts in citation order, the record, the retrieval id and
        the user id.
    """
    if isinstance(shown, Retrieval):
        rec = shown.rerank if shown.rerank is not None else _legacy_record(shown)
        ids = [h.memory.id for h in shown.hits]
        texts = [memory_text(h) for h in shown.hits]
        return ids, texts, rec, shown.retrieval_id, shown.user_id
    if isinstance(shown, RankedTexts):
        rec = shown.record
        texts = [shown.texts[i] for i in shown.order]
    elif isinstance(shown, RerankRecord):
        rec, texts = shown, None
    else:
        raise InvalidInputError(
            f"feedback takes a Retrieval, RankedTexts or RerankRecord, got {type(shown).__name__}"
        )
    if rec.groups is not None and isinstance(shown, RerankRecord):
        ids = [str(i) for i in range(rec.top_m)]  # a record alone: positions
    else:
        ids = list(rec.reranked[: rec.top_m])
    return ids, texts, rec, rec.retrieval_id, rec.user_id


def _best_first(scores: np.ndarray) -> list[int]:
    """Positions by score, best first (ties in the order given)."""
    return [int(i) for i in np.argsort(-scores, kind="stable")]


def _caller_order(
    rr: CallerReranker,
    q: np.ndarray,
    m: np.ndarray,
    cos: np.ndarray,
    explore: bool,
    lock: Any,
) -> tuple[list[int], np.ndarray, bool]:
    """Order texts with a caller's reranker: the order, its scores and whether it sampled.

    Raises:
        InvalidInputError: The reranker did not order and score every candidate.
    """
    with lock:
        res = rr.rerank(q, m, cos, explore=explore)
    order = [int(i) for i in res.order]
    scores = np.asarray(res.scores, dtype=np.float32).reshape(-1)
    k = m.shape[0]
    if sorted(order) != list(range(k)) or scores.shape != (k,):
        raise InvalidInputError("the reranker must order every candidate and score it")
    explored = res.sampled if isinstance(res, RerankResult) else bool(explore)
    return order, scores, explored


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
    top_m: int,
    explored: bool,
) -> RerankRecord:
    """The `RerankRecord` of a caller's ranking of texts (prior rounded to 6 decimals)."""
    return RerankRecord(
        user_id=user_id,
        retrieval_id=retrieval_id,
        scope=scope,
        top_k=len(ids),
        top_m=top_m,
        explored=bool(explored),
        updates=0,
        candidates=tuple(ids),
        reranked=tuple(ids[i] for i in order),
        prior=tuple(round(float(x), 6) for x in prior),
        features=None,
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
