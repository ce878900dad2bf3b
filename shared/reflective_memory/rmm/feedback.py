"""Engine side of RMM's retrospective reflection: rerank at retrieval, learn at feedback.

`RerankStage` owns the rerankers of one `ReflectiveMemory` (a prior shared by its users plus
per-user offsets, one shared reranker, or one per user: `rerank_scope`), applies them to the head
of a retriever ranking, and turns feedback on a `Retrieval` into REINFORCE episodes (reading the
answer's citations is `reflective_memory.rmm.answer_feedback`). Learned state is persisted under
`<store dir>/rerankers/` (safetensors + JSON); an in-memory engine keeps it in memory only, and
`reflective_memory.rmm.stored_rerank` keeps it in a database store's blobs.

`diagnostics["rerank"]` holds what feedback needs (candidate ids, prior scores, features), so
feedback also works for a retrieval made by another process or long ago.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.errors import ConfigError, ModelLoadError
from reflective_memory.rmm.answer_feedback import (
    FeedbackResult,
    candidate_positions,
    read_answer,
)
from reflective_memory.rmm.citations import attribute, parse_citations
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode, FitReport, RerankResult
from reflective_memory.rmm.features import Candidates, citation_rewards, rank_prior, sign_vector
from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.storage.index import UserIndex
from reflective_memory.types import Retrieval

__all__ = ["RerankStage", "FeedbackResult"]

logger = logging.getLogger(__name__)

_SHARED = "__shared__"
_EPISODE_CACHE = 512
_RERANKER_CACHE = 64
_ADAPTER_CACHE = 4096
_ADAPTER_SUFFIX = ".delta.json"
#: Scope `user`: learned state is written every this many episodes (and on close / save).
_FLUSH_EVERY = 16
#: Side features read from the stored `Memory` objects (fetched only when one is used).
_MEMORY_FEATURES = frozenset({"cost", "recency", "size", "derived"})


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

    With `rerank_scope="user"` (default) every user is served by a `PersonalReranker`: the
    prior shared by this engine's users plus the user's own `UserAdapter`; `"shared"` serves
    everyone with the prior alone; `"isolated"` gives each user a full `Reranker` of their own.

    Files under `directory`: `shared.safetensors` / `shared.json` (the prior),
    `user-<hash>.delta.json` (a user's offsets, a few hundred bytes) and, for `isolated`,
    `user-<hash>.safetensors` / `.json`. `forget(user_id)` deletes a user's files and the
    user's buffered episodes from the prior; for stores that keep state elsewhere,
    `user_state` / `restore_user_state` and `prior_state` / `restore_prior_state` move the same
    state as bytes. `StoredRerankStage` overrides the persistence methods.

    Args:
        config: The engine's settings (`rerank_*`, `attribution_*`).
        embedder: The engine's embedder (defines the vector size).
        directory: Where reranker files go (`None`: memory only).
    """

    def __init__(self, config: RerankConfig, embedder: Embedder, directory: Path | None) -> None:
        self.config = config
        self.embedder = embedder
        self.directory = directory
        self._rerankers: OrderedDict[str, Reranker] = OrderedDict()
        self._adapters: OrderedDict[str, UserAdapter] = OrderedDict()
        self._contexts: OrderedDict[str, _Context] = OrderedDict()
        # Which user gave each buffered episode of the prior (by object id), for `forget`.
        self._episode_users: dict[int, str] = {}
        self._views: dict[str, PersonalReranker] = {}
        self._dirty: set[str] = set()  # scope user: users (and _SHARED) with unsaved changes
        self._since_flush = 0
        self._lock = threading.RLock()

    # -------------------------------------------------------------- rerankers
    def _owner(self, user_id: str) -> str:
        return user_id if self.config.scope == "isolated" else _SHARED

    def _file(self, owner: str) -> Path | None:
        if self.directory is None:
            return None
        if owner == _SHARED:
            return self.directory / "shared"
        return self.directory / f"user-{hashlib.sha1(owner.encode()).hexdigest()[:24]}"

    def _adapter_file(self, user_id: str) -> Path | None:
        base = self._file(user_id) if user_id != _SHARED else None
        return None if base is None else base.parent / f"{base.name}{_ADAPTER_SUFFIX}"

    def _new(self) -> Reranker:
        return Reranker(self.embedder.dim, self.config)

    def _new_adapter(self) -> UserAdapter:
        return UserAdapter(self.config)

    def _full(self, owner: str) -> Reranker:
        """The full reranker of an owner (the prior, or an isolated user's), loaded or new."""
        with self._lock:
            rr = self._rerankers.get(owner)
            if rr is not None:
                self._rerankers.move_to_end(owner)
                return rr
            rr = None
            path = self._file(owner)
            if path is not None and (path.parent / f"{path.name}.safetensors").exists():
                try:
                    rr = Reranker.load(path, self.config)
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
                if old.pending_ or old_owner in self._dirty:  # unsaved episodes or updates
                    old.save(self._file(old_owner))  # type: ignore[arg-type]
                    self._dirty.discard(old_owner)
            return rr

    def prior(self) -> Reranker:
        """The reranker shared by this engine's users (scopes `user` and `shared`)."""
        return self._full(_SHARED)

    def adapter(self, user_id: str) -> UserAdapter:
        """A user's own offsets on top of the prior (loaded, or new and zero)."""
        with self._lock:
            ad = self._adapters.get(user_id)
            if ad is not None:
                self._adapters.move_to_end(user_id)
                return ad
            path = self._adapter_file(user_id)
            ad = None
            if path is not None and path.exists():
                try:
                    ad = UserAdapter.load(path, self.config)
                    if ad.features != tuple(self.config.features):
                        raise ModelLoadError("saved for other features")
                except (ModelLoadError, ConfigError) as exc:
                    logger.warning("starting fresh user offsets: %s", exc)
                    ad = None
            if ad is None:
                ad = self._new_adapter()
            self._adapters[user_id] = ad
            while len(self._adapters) > _ADAPTER_CACHE:
                old_user, old = self._adapters.popitem(last=False)
                old_path = self._adapter_file(old_user)
                if old_user in self._dirty and old_path is not None:
                    old.save(old_path)
                self._dirty.discard(old_user)
            return ad

    def reranker(self, user_id: str) -> Reranker | PersonalReranker:
        """The reranker that serves `user_id` (by scope; see the class docs)."""
        scope = self.config.scope
        if scope == "isolated":
            return self._full(user_id)
        if scope == "shared":
            return self.prior()
        with self._lock:
            prior, ad = self.prior(), self.adapter(user_id)
            view = self._views.get(user_id)
            if view is None or view.prior is not prior or view.adapter is not ad:
                view = PersonalReranker(prior, ad)  # one view per user, for identity checks
                self._views[user_id] = view
                while len(self._views) > _ADAPTER_CACHE:
                    self._views.pop(next(iter(self._views)))
            return view

    # ------------------------------------------------------------ persistence
    def _write_full(self, owner: str, rr: Reranker) -> None:
        """Persist a full reranker (the prior, or an isolated user's) where it lives."""
        path = self._file(owner)
        if path is not None:
            rr.save(path)

    def _write_adapter(self, user_id: str, ad: UserAdapter) -> None:
        """Persist a user's offsets where they live."""
        path = self._adapter_file(user_id)
        if path is not None:
            ad.save(path)

    def save_all(self) -> int:
        """Persist all unsaved learned state (buffered episodes, offsets); return files written."""
        if self.directory is None:
            return 0
        saved = 0
        with self._lock:
            for owner, rr in self._rerankers.items():
                if rr.pending_ or owner in self._dirty:
                    rr.save(self._file(owner))  # type: ignore[arg-type]
                    saved += 1
            for user in sorted(self._dirty - {_SHARED}):
                ad = self._adapters.get(user)
                path = self._adapter_file(user)
                if ad is not None and path is not None:
                    ad.save(path)
                    saved += 1
            self._dirty.clear()
            self._since_flush = 0
        return saved

    def save(self, user_id: str) -> Path | None:
        """Persist the state serving `user_id` (no-op for an in-memory engine)."""
        path = self._file(self._owner(user_id))
        if path is None:
            return None
        with self._lock:
            out = self._full(self._owner(user_id)).save(path)
            if self.config.scope == "user" and user_id in self._adapters:
                self._adapters[user_id].save(self._adapter_file(user_id))  # type: ignore[arg-type]
            return out

    # --------------------------------------------------------------- learning
    def _fit(self, owner: str, rr: Reranker, episode: Episode, user_id: str) -> FitReport:
        """`rr.partial_fit(episode)`, remembering whose episodes the prior buffers."""
        before = {id(ep) for ep in rr.pending_}
        rep = rr.partial_fit(episode).last_fit_
        assert rep is not None  # every partial_fit call sets it
        if owner == _SHARED:
            live = {id(ep) for ep in rr.pending_}
            self._episode_users = {k: v for k, v in self._episode_users.items() if k in live}
            for k in live - before:  # the episode as buffered (the reranker may copy it)
                self._episode_users[k] = user_id
        return rep

    def _personal_step(
        self, prior: Reranker, ad: UserAdapter, episode: Episode
    ) -> tuple[Episode, float]:
        """One step of a user's offsets; return the prior's episode and the step's size.

        The prior learns from the policy that acted: its scores plus the user's offsets.
        """
        ep = episode.checked(prior.dim)
        base = prior.score(ep.query, ep.candidates, ep.prior, ep.features)
        own = ad.offsets(ep.features)
        signs = None
        if self.config.signed_features and prior.features:
            signs = sign_vector(prior.features)
        step = ad.update(ep, base, prior.w_f_.detach().numpy().copy(), signs)
        if own is not None and np.any(own):
            start = ep.prior if ep.prior is not None else ep.candidates @ ep.query
            ep = Episode(ep.query, ep.candidates, ep.shown, ep.rewards, start + own, ep.features)
        return ep, step

    def learn(self, user_id: str, episode: Episode) -> FitReport:
        """Give one feedback episode to the reranker serving `user_id`; persist what changed.

        Public for adapters that rank their own candidates with `reranker(user_id)` (LangChain
        compressor, LlamaIndex postprocessor): their feedback trains, and is saved with, the
        reranker `ReflectiveMemory.retrieve` applies. Scope `user`: one step of the user's
        offsets, and the episode joins the prior's batch; state is written every `_FLUSH_EVERY`
        episodes and by `save_all()`. Other scopes save a reranker after each update.

        Returns:
            The prior's (or the user's full reranker's) `FitReport`; with scope `user`,
            `extra["user_step"]` is the size of the offsets' change.
        """
        with self._lock:
            if self.config.scope != "user":
                owner = self._owner(user_id)
                rr = self._full(owner)
                rep = self._fit(owner, rr, episode, user_id)
                if rep.updates:
                    # Episodes still buffered (< one batch) are saved with the next update, or
                    # by `save_all()` (e.g. on close).
                    self._write_full(owner, rr)
                return rep
            prior = self.prior()
            ep, step = self._personal_step(prior, self.adapter(user_id), episode)
            if step:
                self._dirty.add(user_id)
            rep = self._fit(_SHARED, prior, ep, user_id)
            if rep.updates:
                self._dirty.add(_SHARED)
            # Writing files costs more than learning: state is flushed every _FLUSH_EVERY
            # episodes and on close, so a crash loses at most that much feedback.
            self._since_flush += 1
            if self._since_flush >= _FLUSH_EVERY:
                self.save_all()
            rep.extra["user_step"] = step
            return rep

    # ---------------------------------------------------------------- erasure
    def forget_retrievals(self, user_id: str) -> int:
        """Drop the kept query and candidate vectors of a user's retrievals; return how many."""
        with self._lock:
            gone = [rid for rid, ctx in self._contexts.items() if ctx.user_id == user_id]
            for rid in gone:
                del self._contexts[rid]
        return len(gone)

    def forget(self, user_id: str) -> None:
        """Erase what the rerankers hold of a user, in memory and where they are persisted.

        The user's own state goes whatever the current scope (a store may have been used with
        several): offsets (scope `user`) and full reranker (scope `isolated`). The prior keeps
        the weights it learned from everyone, this user included (a few aggregate weights, not
        memories), but the user's buffered feedback episodes (query and memory vectors) are
        removed from it and it is written again; buffered episodes whose user is unknown
        (loaded from disk) are dropped too, as the user's could be among them (at most
        `rerank_batch_size - 1` episodes).
        """
        with self._lock:
            self.forget_retrievals(user_id)
            self._adapters.pop(user_id, None)
            self._rerankers.pop(user_id, None)
            self._views.pop(user_id, None)
            self._dirty.discard(user_id)
            self._erase_own(user_id)
            self._erase_from_prior(user_id)

    def _keep_others(self, rr: Reranker, user_id: str) -> bool:
        """Drop a user's (and unknown users') buffered episodes; return whether any went."""
        keep = [ep for ep in rr.pending_ if self._episode_users.get(id(ep)) not in (None, user_id)]
        if len(keep) == len(rr.pending_):
            return False
        rr.pending_ = keep
        return True

    def _erase_own(self, user_id: str) -> None:
        path = self._file(user_id)
        if path is None:
            return
        for suffix in (".safetensors", ".json", _ADAPTER_SUFFIX, ".safetensors.tmp", ".json.tmp"):
            (path.parent / f"{path.name}{suffix}").unlink(missing_ok=True)
        for tmp in path.parent.glob(f".{path.name}.*"):  # a crashed atomic write's leftovers
            tmp.unlink(missing_ok=True)

    def _erase_from_prior(self, user_id: str) -> None:
        shared = self._file(_SHARED)
        rr = self._rerankers.get(_SHARED)
        if rr is None:
            if shared is None or not (shared.parent / f"{shared.name}.safetensors").exists():
                return
            try:
                rr = Reranker.load(shared, self.config)
            except (ModelLoadError, ConfigError) as exc:
                logger.warning("could not open the shared reranker to erase a user: %s", exc)
                return
        if self._keep_others(rr, user_id) and shared is not None:
            rr.save(shared)

    # ------------------------------------------------------------ state bytes
    def user_state(self, user_id: str) -> bytes | None:
        """A user's own reranker state as bytes (None when the user has learned nothing).

        For stores that keep per-user data outside the store directory: the offsets' JSON
        (scope `user`) or a full reranker's safetensors blob (scope `isolated`).
        """
        with self._lock:
            scope = self.config.scope
            if scope == "shared":
                return None
            if scope == "isolated":
                rr = self._full(user_id)
                return None if rr.is_identity and not rr.pending_ else rr.to_bytes()
            ad = self.adapter(user_id)
            return None if ad.is_zero and not ad.n_episodes_ else ad.to_bytes()

    def restore_user_state(self, user_id: str, data: bytes) -> None:
        """Install a user's state from `user_state` bytes (and persist it).

        Raises:
            ModelLoadError: The bytes are no such state.
        """
        with self._lock:
            scope = self.config.scope
            if scope == "shared":
                raise ConfigError("scope 'shared' keeps no per-user reranker state")
            if scope == "isolated":
                rr = Reranker.from_bytes(data, self.config)
                if rr.dim != self.embedder.dim:
                    raise ModelLoadError(
                        f"state has dim {rr.dim}, the embedder {self.embedder.dim}"
                    )
                self._rerankers[user_id] = rr
                self._write_full(user_id, rr)
                return
            ad = UserAdapter.from_bytes(data, self.config)
            self._adapters[user_id] = ad
            self._write_adapter(user_id, ad)

    def prior_state(self) -> bytes:
        """The shared prior as bytes (safetensors)."""
        with self._lock:
            return self.prior().to_bytes()

    def restore_prior_state(self, data: bytes) -> None:
        """Install the shared prior from `prior_state` bytes (and persist it)."""
        rr = Reranker.from_bytes(data, self.config)
        if rr.dim != self.embedder.dim:
            raise ModelLoadError(f"state has dim {rr.dim}, the embedder {self.embedder.dim}")
        with self._lock:
            self._rerankers[_SHARED] = rr
            self._write_full(_SHARED, rr)

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
        query: str | None = None,
        fetch: Callable[[list[str]], list[Any]] | None = None,
    ) -> tuple[list[int], list[dict[str, float]]]:
        """Rerank the first `rerank_top_k` positions of a ranking; the tail keeps its order.

        Records retriever vs reranked order in `diagnostics["rerank"]` and keeps the vectors for
        feedback on `retrieval_id`. `query` and `fetch` (memories by id) feed the side
        features; without them the features that need them are neutral.
        """
        k = min(self.config.top_k, len(order))
        if k == 0:
            return order, scores
        q = np.asarray(qvec, dtype=np.float32).reshape(-1)
        rr = self.reranker(user_id)
        head = order[:k]
        cand = index.dense.vectors[head]
        dense = cand @ q
        prior = rank_prior(dense)
        ids = [index.ids[p] for p in head]
        feats = None
        if rr.features:
            need_mem = bool(set(rr.features) & _MEMORY_FEATURES)
            mems = self._memories(index, ids, fetch) if need_mem else None
            known = index.overlap(query, head) if query and "overlap" in rr.features else None
            keys = [index.keys[p] for p in head]
            cands = Candidates(keys, query, dense, scores[:k], memories=mems, overlap=known)
            feats = rr.features_of(cands)
        if _untrained(rr) and not explore:
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
        diagnostics["rerank"] = {
            "scope": self.config.scope,
            "top_k": k,
            "top_m": self.config.top_m,
            "explored": res.sampled,
            "updates": rr.n_updates_,
            "retriever_order": ids,
            "reranked_order": [ids[i] for i in res.order],
            "prior": [round(float(x), 6) for x in prior],
        }
        if feats is not None:
            diagnostics["rerank"]["features"] = np.round(feats, 5).tolist()
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
        text = str(retrieval.diagnostics.get("search_query") or retrieval.query)  # as ranked
        q = np.asarray(self.embedder.encode(text), dtype=np.float32).reshape(-1)
        pos = [where[m] for m in ids]
        cand = index.dense.vectors[pos]
        prior = np.asarray(info.get("prior") or rank_prior(cand @ q), dtype=np.float32)
        rr = self.reranker(retrieval.user_id)
        feats = None
        if rr.features:
            saved = info.get("features")
            arr = None if saved is None else np.asarray(saved, dtype=np.float32)
            if arr is not None and arr.shape == (len(ids), rr.n_features):
                feats = arr
            else:  # recompute what the index still tells (retriever scores are gone)
                keys = [index.keys[p] for p in pos]
                feats = rr.features_of(Candidates(keys, query=text, dense=cand @ q))
        return _Context(q, cand.copy(), prior, ids, feats, retrieval.user_id)

    def feedback(
        self,
        retrieval: Retrieval,
        answer: str | None,
        cited: Sequence[int] | None,
        index_fn: Any,
    ) -> FeedbackResult:
        """Turn an answer (or cited hit positions) into rewards and train the reranker."""
        out = read_answer(retrieval, answer, cited, fallback=self.config.attribution_fallback)
        if out.reason:
            return out
        n = len(retrieval.hits)
        ctx = self._context(retrieval, index_fn)
        if ctx is None:
            out.reason = "the retrieval was not reranked or its memories changed"
            return out
        where = candidate_positions(retrieval, ctx.ids)
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


def _untrained(rr: Reranker | PersonalReranker) -> bool:
    """True while `rr` scores exactly as the retriever ranks (nothing learned yet)."""
    if isinstance(rr, PersonalReranker):
        return rr.prior.n_updates_ == 0 and rr.adapter.is_zero
    return rr.n_updates_ == 0
