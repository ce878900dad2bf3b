"""Engine side of RMM's retrospective reflection: rerank at retrieval, learn at feedback.

`RerankStage` owns the rerankers of one `ReflectiveMemory` (one per user, or one shared), applies
them to the head of a retriever ranking, and turns feedback on a `Retrieval` into REINFORCE
episodes. Rerankers are persisted under `<store dir>/rerankers/` (safetensors + JSON config); an
in-memory engine keeps them in memory only.

The Retrieval carries everything feedback needs in `diagnostics["rerank"]` (candidate ids in
retriever order, their prior scores, the reranked order), so feedback also works for a retrieval
made by another process or long ago: missing vectors are taken from the user's current index and
the query is embedded again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.config import MemoryConfig
from reflective_memory.embed import Embedder
from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.rmm.citations import attribute, echoes_instructions, parse_citations
from reflective_memory.rmm.episodes import Episode, FitReport
from reflective_memory.rmm.features import citation_rewards, rank_prior
from reflective_memory.rmm.reranker import Reranker, RerankResult
from reflective_memory.storage.index import UserIndex
from reflective_memory.types import Retrieval

__all__ = ["RerankStage", "FeedbackResult"]

logger = logging.getLogger(__name__)

_SHARED = "__shared__"
_EPISODE_CACHE = 512
_RERANKER_CACHE = 64


@dataclass
class FeedbackResult:
    """What one feedback call learned: the one result type of every feedback API.

    Returned by `ReflectiveMemory.feedback`, LlamaIndex's `ReflectiveNodePostprocessor.feedback`
    and `ReflectiveMemoryBlock.feedback`, and LangChain's `CitationReranker.feedback` (and the
    chat memory / middleware that send answers back).

    Attributes:
        retrieval_id: The retrieval (or adapter ranking) the feedback is about.
        user_id: Its user.
        cited: Positions in the shown list (`retrieval.hits`, or the nodes / documents the
            adapter returned) counted as cited.
        rewards: Reward per shown item (+1 cited, -1 not) fed to the reranker, by memory id (or
            node / document id in the adapters).
        inferred: The citations were inferred by the attribution fallback (no marker in the
            answer).
        no_cite: The answer said `[NO_CITE]`.
        out_of_range: Cited numbers that named no hit (ignored).
        repeated: Repeated citations (ignored).
        learned: An episode was given to the reranker.
        updates: Reranker optimizer steps taken by this call (0 while a batch fills).
        pending: Episodes waiting for the next step.
        loss: REINFORCE loss of the step taken, if any.
        similarities: For inferred feedback, the best answer-sentence cosine per hit.
        reason: Why nothing was learned, when `learned` is False.
    """

    retrieval_id: str
    user_id: str
    cited: tuple[int, ...] = ()
    rewards: dict[str, float] = field(default_factory=dict)
    inferred: bool = False
    no_cite: bool = False
    out_of_range: int = 0
    repeated: int = 0
    learned: bool = False
    updates: int = 0
    pending: int = 0
    loss: float | None = None
    similarities: list[float] | None = None
    reason: str = ""


@dataclass
class _Context:
    query: np.ndarray
    candidates: np.ndarray
    prior: np.ndarray
    ids: list[str]
    features: np.ndarray | None = None
    user_id: str = ""


class RerankStage:
    """Rerankers of one engine.

    Args:
        config: The engine's settings (`rerank_*`, `attribution_*`).
        embedder: The engine's embedder (defines the vector size).
        directory: Where reranker files go (`None`: memory only).
    """

    def __init__(self, config: MemoryConfig, embedder: Embedder, directory: Path | None) -> None:
        self.config = config
        self.embedder = embedder
        self.directory = directory
        self._rerankers: OrderedDict[str, Reranker] = OrderedDict()
        self._contexts: OrderedDict[str, _Context] = OrderedDict()
        # Which user gave each buffered episode of the shared reranker (by object id).
        self._episode_users: dict[int, str] = {}
        self._lock = threading.RLock()

    # -------------------------------------------------------------- rerankers
    def _owner(self, user_id: str) -> str:
        return _SHARED if self.config.rerank_scope == "shared" else user_id

    def _file(self, owner: str) -> Path | None:
        if self.directory is None:
            return None
        if owner == _SHARED:
            return self.directory / "shared"
        return self.directory / f"user-{hashlib.sha1(owner.encode()).hexdigest()[:24]}"

    def _params(self) -> dict[str, Any]:
        """Reranker hyperparameters from the config (they also override a saved reranker's)."""
        cfg = self.config
        return {
            "top_m": cfg.rerank_top_m,
            "tau": cfg.rerank_tau,
            "learning_rate": cfg.rerank_learning_rate,
            "baseline": cfg.rerank_baseline,
            "batch_size": cfg.rerank_batch_size,
            "optimizer": cfg.rerank_optimizer,
            "weight_decay": cfg.rerank_weight_decay,
            "memory_bias": cfg.rerank_memory_bias,
            "features": cfg.rerank_features,
            "seed": cfg.rerank_seed,
        }

    def _new(self) -> Reranker:
        return Reranker(self.embedder.dim, **self._params())

    def reranker(self, user_id: str) -> Reranker:
        """The reranker that serves `user_id` (loaded from disk or new and untrained)."""
        owner = self._owner(user_id)
        with self._lock:
            rr = self._rerankers.get(owner)
            if rr is not None:
                self._rerankers.move_to_end(owner)
                return rr
            rr = None
            path = self._file(owner)
            if path is not None and (path.parent / f"{path.name}.safetensors").exists():
                try:
                    rr = Reranker.load(path, **self._params())
                    if rr.dim != self.embedder.dim:
                        raise ConfigError(
                            f"saved reranker has dim {rr.dim}, the embedder has {self.embedder.dim}"
                        )
                except (ModelLoadError, ConfigError) as exc:
                    logger.warning("starting a fresh reranker for %s: %s", owner, exc)
                    rr = None
            if rr is None:
                rr = self._new()
            self._rerankers[owner] = rr
            if self.directory is not None and len(self._rerankers) > _RERANKER_CACHE:
                old_owner, old = self._rerankers.popitem(last=False)
                if old.pending_:  # updates are saved as they happen; buffered episodes too
                    old.save(self._file(old_owner))  # type: ignore[arg-type]
            return rr

    def save_all(self) -> int:
        """Persist every loaded reranker that holds buffered episodes; return how many."""
        if self.directory is None:
            return 0
        saved = 0
        with self._lock:
            for owner, rr in self._rerankers.items():
                if rr.pending_:
                    rr.save(self._file(owner))  # type: ignore[arg-type]
                    saved += 1
        return saved

    def save(self, user_id: str) -> Path | None:
        """Persist the reranker serving `user_id` (no-op for an in-memory engine)."""
        path = self._file(self._owner(user_id))
        if path is None:
            return None
        with self._lock:
            return self.reranker(user_id).save(path)

    def learn(self, user_id: str, episode: Episode) -> FitReport:
        """Give one feedback episode to the reranker serving `user_id`; persist it if it updated.

        This is the training step `feedback` uses, public for adapters that rank their own
        candidates (e.g. a LangChain compressor or a LlamaIndex postprocessor) with
        `reranker(user_id)`: their feedback trains, and is saved with, the same reranker that
        `ReflectiveMemory.retrieve` applies.

        Args:
            user_id: The user the feedback is about.
            episode: The REINFORCE episode (`reflective_memory.rmm.reranker.Episode`).

        Returns:
            The reranker's `FitReport` for this call.
        """
        with self._lock:
            rr = self.reranker(user_id)
            before = {id(ep) for ep in rr.pending_}
            rep = rr.partial_fit(episode).last_fit_
            assert rep is not None  # every partial_fit call sets it
            if self._owner(user_id) == _SHARED:
                live = {id(ep) for ep in rr.pending_}
                self._episode_users = {k: v for k, v in self._episode_users.items() if k in live}
                for k in live - before:  # the episode as buffered (the reranker may copy it)
                    self._episode_users[k] = user_id
            if rep.updates:
                # Saved after each update; episodes still buffered (< one batch) are saved with
                # the next update, or by `save()` (e.g. on close).
                self.save(user_id)
            return rep

    def forget_retrievals(self, user_id: str) -> int:
        """Drop the kept query and candidate vectors of a user's retrievals; return how many."""
        with self._lock:
            gone = [rid for rid, ctx in self._contexts.items() if ctx.user_id == user_id]
            for rid in gone:
                del self._contexts[rid]
        return len(gone)

    def forget(self, user_id: str) -> None:
        """Erase what the rerankers hold of a user, in memory and on disk.

        Per-user scope: the user's reranker and its files go, whatever the current scope (a
        store may have been used with both). Shared scope: the user's buffered feedback
        episodes (query and memory vectors) are removed from the shared reranker and its file
        is rewritten; buffered episodes whose user is unknown (loaded from disk) are dropped
        too, as the user's could be among them (at most `rerank_batch_size - 1` episodes). The
        weights learned from earlier updates are an aggregate and stay.
        """
        with self._lock:
            self.forget_retrievals(user_id)
            self._rerankers.pop(user_id, None)
            path = self._file(user_id)
            if path is not None:
                for suffix in (".safetensors", ".json", ".safetensors.tmp", ".json.tmp"):
                    (path.parent / f"{path.name}{suffix}").unlink(missing_ok=True)
            shared = self._file(_SHARED)
            on_disk = shared is not None and (shared.parent / f"{shared.name}.safetensors").exists()
            if _SHARED not in self._rerankers and not on_disk:
                return
            try:
                if self.config.rerank_scope != "shared" and _SHARED not in self._rerankers:
                    rr = Reranker.load(shared, **self._params())  # type: ignore[arg-type]
                else:
                    rr = self._rerankers.get(_SHARED) or self.reranker(user_id)
            except (ModelLoadError, ConfigError) as exc:
                logger.warning("could not open the shared reranker to erase a user: %s", exc)
                return
            keep = [
                ep
                for ep in rr.pending_
                if self._episode_users.get(id(ep)) not in (None, user_id)
            ]
            if len(keep) != len(rr.pending_):
                rr.pending_ = keep
                if shared is not None:
                    rr.save(shared)

    # -------------------------------------------------------------- retrieval
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
        diagnostics: dict[str, Any],
    ) -> tuple[list[int], list[dict[str, float]]]:
        """Rerank the first `rerank_top_k` positions of a ranking; the tail keeps its order.

        Records retriever vs reranked order in `diagnostics["rerank"]` and keeps the vectors for
        feedback on `retrieval_id`.
        """
        k = min(self.config.rerank_top_k, len(order))
        if k == 0:
            return order, scores
        head = order[:k]
        q = np.asarray(qvec, dtype=np.float32).reshape(-1)
        cand = index.dense.vectors[head]
        prior = rank_prior(cand @ q)
        rr = self.reranker(user_id)
        feats = rr.feature_matrix([index.keys[p] for p in head])
        if rr.n_updates_ == 0 and not explore:
            # an untrained reranker keeps the retriever's order: skip scoring it
            res = RerankResult(list(range(k)), np.asarray(prior, dtype=np.float32), False)
        else:
            with self._lock:
                res = rr.rerank(q, cand, prior, explore=explore, features=feats)
        new_head = [head[i] for i in res.order]
        new_scores = []
        for i in res.order:
            sc = dict(scores[i])
            sc["rerank"] = float(res.scores[i])
            new_scores.append(sc)
        ids = [index.ids[p] for p in head]
        diagnostics["rerank"] = {
            "scope": self.config.rerank_scope,
            "top_k": k,
            "top_m": self.config.rerank_top_m,
            "explored": res.sampled,
            "updates": rr.n_updates_,
            "retriever_order": ids,
            "reranked_order": [ids[i] for i in res.order],
            "prior": [round(float(x), 6) for x in prior],
        }
        with self._lock:
            self._contexts[retrieval_id] = _Context(q, cand.copy(), prior, ids, feats, user_id)
            while len(self._contexts) > _EPISODE_CACHE:
                self._contexts.popitem(last=False)
        return new_head + order[k:], new_scores + scores[k:]

    # --------------------------------------------------------------- feedback
    def _context(self, retrieval: Retrieval, index_fn: Any) -> _Context | None:
        with self._lock:
            ctx = self._contexts.get(retrieval.retrieval_id)
        if ctx is not None:
            return ctx
        info = retrieval.diagnostics.get("rerank")
        if not isinstance(info, dict) or not info.get("retriever_order"):
            return None
        ids = list(info["retriever_order"])
        index: UserIndex = index_fn(retrieval.user_id)
        where = {mid: p for p, mid in enumerate(index.ids)}
        if any(mid not in where for mid in ids):
            return None  # memories changed since: the episode cannot be rebuilt
        q = np.asarray(self.embedder.encode(retrieval.query), dtype=np.float32).reshape(-1)
        pos = [where[m] for m in ids]
        cand = index.dense.vectors[pos]
        prior = np.asarray(info.get("prior") or rank_prior(cand @ q), dtype=np.float32)
        feats = self.reranker(retrieval.user_id).feature_matrix([index.keys[p] for p in pos])
        return _Context(q, cand.copy(), prior, ids, feats, retrieval.user_id)

    def feedback(
        self,
        retrieval: Retrieval,
        answer: str | None,
        cited: Sequence[int] | None,
        index_fn: Any,
    ) -> FeedbackResult:
        """Turn an answer (or cited hit positions) into rewards and train the reranker."""
        if not isinstance(retrieval, Retrieval):
            raise InvalidInputError(
                f"retrieval must be a Retrieval, got {type(retrieval).__name__}"
            )
        if answer is None and cited is None:
            raise InvalidInputError("give the answer text or the cited positions")
        if answer is not None and not isinstance(answer, str):
            raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
        n = len(retrieval.hits)
        out = FeedbackResult(retrieval.retrieval_id, retrieval.user_id)
        if cited is None and echoes_instructions(answer):  # type: ignore[arg-type]
            out.reason = "the answer echoes the prompt's instructions"
            return out
        if cited is not None:
            if isinstance(cited, (str, bytes)) or not isinstance(cited, Sequence):
                raise InvalidInputError("cited must be a sequence of hit positions")
            pos: list[int] = []
            for c in cited:
                if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
                    raise InvalidInputError(f"cited positions must be ints, got {c!r}")
                if not 0 <= int(c) < n:
                    raise InvalidInputError(f"cited position {c} is not a hit (0..{n - 1})")
                if int(c) not in pos:
                    pos.append(int(c))
            out.cited = tuple(pos)
        else:
            parsed = parse_citations(answer, n)  # type: ignore[arg-type]
            out.no_cite, out.out_of_range, out.repeated = (
                parsed.no_cite,
                parsed.out_of_range,
                parsed.repeated,
            )
            if parsed.found:
                out.cited = parsed.indices
            elif not self.config.attribution_fallback:
                out.reason = "the answer has no citation and the attribution fallback is off"
                return out
            else:
                out.inferred = True
        if n == 0:
            out.reason = "the retrieval has no hits"
            return out
        ctx = self._context(retrieval, index_fn)
        if ctx is None:
            out.reason = "the retrieval was not reranked or its memories changed"
            return out
        where = {mid: i for i, mid in enumerate(ctx.ids)}
        # a passage hit stands for the best-ranked reranked unit among its sources
        taken = {where[h.memory.id] for h in retrieval.hits[:n] if h.memory.id in where}
        for h in range(n):
            mem = retrieval.hits[h].memory
            if mem.id not in where:
                for src in mem.metadata.get("sources") or ():
                    if src in where and where[src] not in taken:
                        where[mem.id] = where[src]
                        taken.add(where[src])
                        break
        shown_hits = [h for h in range(n) if retrieval.hits[h].memory.id in where]
        if not shown_hits:
            out.reason = "no hit came from the reranked candidates"
            return out
        if out.inferred:
            vecs = ctx.candidates[[where[retrieval.hits[h].memory.id] for h in shown_hits]]
            text = parse_citations(answer, n).text  # type: ignore[arg-type]
            used, best = attribute(text, vecs, self.embedder, self.config.attribution_threshold)
            out.cited = tuple(shown_hits[i] for i in used)
            sims = [float("nan")] * n
            for j, h in enumerate(shown_hits):
                sims[h] = float(best[j])
            out.similarities = sims
        cited_set = set(out.cited)
        rewards = citation_rewards(
            len(shown_hits), [j for j, h in enumerate(shown_hits) if h in cited_set]
        )
        ep = Episode(
            ctx.query,
            ctx.candidates,
            [where[retrieval.hits[h].memory.id] for h in shown_hits],
            rewards,
            ctx.prior,
            ctx.features,
        )
        rep = self.learn(retrieval.user_id, ep)
        out.rewards = {
            retrieval.hits[h].memory.id: float(r) for h, r in zip(shown_hits, rewards, strict=True)
        }
        out.learned = True
        out.updates, out.pending, out.loss = rep.updates, rep.pending, rep.loss
        return out
