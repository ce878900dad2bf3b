"""Candidate stages: the query's vector, dense search (RF-Mem) and lexical search (BM25)."""

from __future__ import annotations

import logging

import numpy as np

from reflective_memory.embed import Embedder, QueryBatcher, encode_query
from reflective_memory.errors import EmbeddingError, ReflectiveMemoryError
from reflective_memory.recall import RecallConfig, fitted_gate
from reflective_memory.recall import recall as rf_recall
from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.storage.bridge import await_io, bridged

__all__ = ["EmbedQuery", "DenseCandidates", "LexicalCandidates", "default_gate"]

logger = logging.getLogger(__name__)
#: Reasons already logged why an embedder has no fitted RF-Mem gate (logged once each).
_UNFITTED: set[str] = set()


def default_gate(rcfg: RecallConfig) -> bool:
    """Whether `rcfg` gates with RF-Mem at the default thresholds (explicit ones are kept)."""
    base = RecallConfig()
    return rcfg.mode == "rfmem" and (rcfg.theta_high, rcfg.theta_low, rcfg.tau) == (
        base.theta_high,
        base.theta_low,
        base.tau,
    )


class EmbedQuery:
    """Embed the search text as a query (once per retrieval; stages read `qvec`).

    Args:
        embedder: The memory's embedder.
        max_chars: The text is cut to this many characters first.
    """

    name = "embed"
    repeat = False

    def __init__(self, embedder: Embedder, max_chars: int) -> None:
        self.embedder = embedder
        self.max_chars = max_chars
        self.batcher = QueryBatcher(embedder)

    def vector(self, text: str) -> np.ndarray:
        """The query embedding of `text` (cut to `max_chars`; see `embed.encode_query`).

        Inside a native async call (a bridged `aretrieve` on PostgreSQL) the model runs off the
        event loop: the query waits on the loop, which serves other coroutines meanwhile, and
        is embedded in the model thread together with the queries of the loop's concurrent
        calls (`embed.QueryBatcher`; an embedder's own async method is awaited instead).

        Raises:
            EmbeddingError: The embedder raised on this query (its error is the cause).
        """
        text = text[: self.max_chars]
        try:
            if bridged():
                return await_io(self.batcher.encode(text))
            return encode_query(self.embedder, text)
        except ReflectiveMemoryError:
            raise
        except Exception as exc:  # the embedder refused this query (only this caller's)
            raise EmbeddingError(
                f"the embedder raised on the query: {type(exc).__name__}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        """Let the running loop's waiting queries be embedded (see `QueryBatcher.aclose`)."""
        await self.batcher.aclose()

    def run(self, state: RetrievalState) -> None:
        """Set `state.qvec`."""
        state.qvec = self.vector(state.search_query)


class DenseCandidates:
    """RF-Mem over the user's dense index: one top-K when familiar, recollection otherwise.

    With `RecallConfig.calibrate` and the gate's default thresholds, θ_high, θ_low and τ are the
    ones fitted for the memory's embedder on the dev sets (`recall.fitted_gate`, written by
    `reflective-memory bench fit-gate`); an embedder without a fit keeps the paper's thresholds,
    and the reason is logged once per embedder.

    Args:
        embedder_name: The memory's `embedder.name`, which selects the fitted gate.
    """

    name = "dense"
    repeat = True

    def __init__(self, embedder_name: str) -> None:
        self.embedder_name = embedder_name

    def run(self, state: RetrievalState) -> None:
        """Set `state.dense` and `state.dense_trace`."""
        if state.recall is None:
            state.recall = self._calibrated(state)
        res = rf_recall(state.index.dense, state.qvec, state.n, state.recall)  # type: ignore[arg-type]
        state.dense = (res.positions, res.cosine)
        state.dense_trace = res.diagnostics()

    def _calibrated(self, state: RetrievalState) -> RecallConfig:
        rcfg = state.request.recall
        if not (rcfg.calibrate and default_gate(rcfg)):
            return rcfg
        cal, reason = fitted_gate(self.embedder_name, rcfg.probe_k, rcfg.lam)
        if cal is None:
            if reason not in _UNFITTED:
                _UNFITTED.add(reason)
                logger.info("%s: the RF-Mem gate uses the paper's thresholds", reason)
            return rcfg
        state.gate = {"theta_high": cal.theta_high, "theta_low": cal.theta_low, "tau": cal.tau}
        return cal.apply(rcfg)


class LexicalCandidates:
    """BM25 over the user's keys."""

    name = "lexical"
    repeat = True

    def run(self, state: RetrievalState) -> None:
        """Set `state.lexical`."""
        scores, positions = state.index.lexical.search(state.search_query, state.n)
        state.lexical = (positions, scores)
