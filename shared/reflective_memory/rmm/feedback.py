"""Engine side of RMM's retrospective reflection: rerank at retrieval, learn at feedback.

`RerankStage` owns the rerankers of one `ReflectiveMemory` (a prior shared by its users plus
per-user offsets, one shared reranker, or one per user: `RerankConfig.scope`). It reranks the
head of a retriever ranking (`apply`) or texts from any retriever (`rerank_texts`), recording
what it showed in a `RerankRecord`, and turns feedback on a `Retrieval`, `RankedTexts` or
`RerankRecord` into REINFORCE episodes (`feedback`; reading the answer's citations is
`reflective_memory.rmm.answer_feedback`). This is the one feedback path: the framework adapters
call it through `ReflectiveMemory.rerank_texts` / `ReflectiveMemory.feedback`.

The vectors of recent rankings are kept in memory; a record alone (from another process, or
long ago) is enough for feedback too: the query is embedded again and the candidates are read
from the user's index (or the texts embedded again). Learned state is persisted under
`<store dir>/rerankers/` (safetensors + JSON); an in-memory engine keeps it in memory only, and
`reflective_memory.rmm.stored_rerank` keeps it in a database store's blobs.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.rmm.answer_feedback import (
    FeedbackResult,
    candidate_positions,
    read_answer,
)
from reflective_memory.rmm.citations import attribute, parse_citations
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode, FitReport, RankedTexts, RerankResult
from reflective_memory.rmm.features import Candidates, citation_rewards, rank_prior, sign_vector
from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.storage.index import UserIndex
from reflective_memory.types import RerankRecord, Retrieval
from reflective_memory.validation import check_id

__all__ = ["RerankStage", "FeedbackResult", "CallerReranker", "CUSTOM_SCOPE"]

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
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
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
            gone = [rid for rid, kept in self._kept.items() if kept.user_id == user_id]
            for rid in gone:
                del self._kept[rid]
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
        rr = self.reranker(user_id)
        head = order[:k]
        cand = index.dense.vectors[head]
        dense = cand @ q
        prior = rank_prior(dense)
        ids = [index.ids[p] for p in head]
        keys = [index.keys[p] for p in head]
        feats = None
        if rr.features:
            need_mem = bool(set(rr.features) & _MEMORY_FEATURES)
            mems = self._memories(index, ids, fetch) if need_mem else None
            known = index.overlap(query, head) if query and "overlap" in rr.features else None
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
        return new_head + order[k:], new_scores + scores[k:], record

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

        Returns:
            The `RankedTexts`: shown positions, scores, cosines and the `RerankRecord`.

        Raises:
            InvalidInputError: Bad user id, query, texts, ids, `top_n` or reranker.
        """
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
        texts = list(texts)
        k = len(texts)
        names = _text_ids(ids, k)
        q = np.asarray(self.embedder.encode(query), dtype=np.float32).reshape(-1)
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
            kw = {} if feats is None else {"features": feats}
            with self._lock:
                res = rr.rerank(q, m, cos, explore=explore, **kw)
            order = [int(i) for i in res.order]
            scores = np.asarray(res.scores, dtype=np.float32).reshape(-1)
            if sorted(order) != list(range(k)) or scores.shape != (k,):
                raise InvalidInputError("the reranker must order every candidate and score it")
            explored = res.sampled if isinstance(res, RerankResult) else bool(explore)
        n = k if top_n is None else min(top_n, k)
        record = _record(
            user_id,
            uuid.uuid4().hex,
            query,
            self.config.scope if reranker is None else CUSTOM_SCOPE,
            names,
            order,
            cos,
            feats,
            updates=rr.n_updates_ if isinstance(rr, (Reranker, PersonalReranker)) else 0,
            top_m=n,
            explored=explored,
        )
        self._keep(record.retrieval_id, _Kept(user_id, q, m, texts, reranker))
        shown = order[:n]
        return RankedTexts(
            order=tuple(shown),
            scores=tuple(float(scores[i]) for i in shown),
            cosines=tuple(float(cos[i]) for i in shown),
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
        q = np.asarray(self.embedder.encode(rec.query), dtype=np.float32).reshape(-1)
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
            (nothing cited or readable, reranking off, the ranking's memories changed).

        Raises:
            InvalidInputError: Not a shown ranking, neither answer nor citations, or a cited
                number names nothing.
        """
        view = self._view(shown)
        n = len(view.ids)
        out = read_answer(
            n,
            answer,
            cited,
            fallback=self.config.attribution_fallback,
            numbering=numbering,
            retrieval_id=view.retrieval_id,
            user_id=view.user_id,
        )
        if out.reason:
            return out
        rec = view.record
        kept = None if rec is None else self._kept_for(rec)
        custom = None if kept is None else kept.reranker
        if rec is not None and rec.scope == CUSTOM_SCOPE and custom is None:
            out.reason = "the reranker given for this ranking is no longer kept"
            return out
        if custom is None and not self.config.enabled:
            if not out.inferred:
                rewards = citation_rewards(n, out.cited)
                out.rewards = {view.ids[j]: float(r) for j, r in enumerate(rewards)}
            out.inferred = False
            out.reason = "reranking is off (config.rerank.enabled)"
            return out
        if rec is None:
            out.reason = "the retrieval was not reranked"
            return out
        if kept is None:
            kept = self._rebuild(rec, view.texts, index_fn)
        if kept is None:
            out.reason = "the retrieval was not reranked or its memories changed"
            return out
        shown_items = [j for j in range(n) if view.where[j] is not None]
        if not shown_items:
            out.reason = "no hit came from the reranked candidates"
            return out
        positions = [int(view.where[j]) for j in shown_items]  # type: ignore[arg-type]
        if out.inferred:
            text = parse_citations(answer, 0).text  # type: ignore[arg-type]
            used, best = attribute(
                text, kept.candidates[positions], self.embedder, self.config.attribution_threshold
            )
            out.cited = tuple(shown_items[i] for i in used)
            sims = [float("nan")] * n
            for i, j in enumerate(shown_items):
                sims[j] = float(best[i])
            out.similarities = sims
        cited_set = set(out.cited)
        rewards = citation_rewards(
            len(shown_items), [i for i, j in enumerate(shown_items) if j in cited_set]
        )
        learner = custom if custom is not None else self.reranker(rec.user_id)
        prior = np.asarray(rec.prior, dtype=np.float32)
        feats = self._features(rec, kept, learner)
        ep = Episode(kept.query, kept.candidates, positions, rewards, prior, feats)
        if custom is not None:
            with self._lock:
                custom.partial_fit(ep)
            rep = custom.last_fit_ if isinstance(custom, Reranker) else None
        else:
            rep = self.learn(rec.user_id, ep)
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
