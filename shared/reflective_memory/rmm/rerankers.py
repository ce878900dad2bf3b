"""The learned rerankers of one engine, kept in a `StateStore`.

With scope `user` (default) every user is served by a `PersonalReranker`: the prior shared by the
engine's users plus the user's own `UserAdapter`; `shared` serves everyone with the prior alone;
`isolated` gives each user a full `Reranker` of their own.

Learned state lives in a `reflective_memory.storage.state.StateStore` (the store's own, e.g.
PostgreSQL's, so every process serving the same users shares it; a `FileStateStore` for an
embedded store): the prior under owner `PRIOR_OWNER` and name `RERANKER_STATE`, a user's offsets
under the user id and `ADAPTER_STATE`, an isolated user's reranker under the user id and
`RERANKER_STATE`. Each feedback episode is applied inside the state's read-modify-write
(`StateStore.update`), so updates from several processes apply one after the other and none is
lost, and nothing learned waits in memory for a flush. A process caches each state with its
version and reloads it when another process wrote a newer one.

Every state is stored sealed with a checksum (`reflective_memory.rmm.sealed`), whatever the
store, and checked when loaded: the seal, then shapes, finite values and magnitudes
(`Reranker.from_bytes`, `UserAdapter.from_bytes`). A damaged state is set aside (a
`SetsAside` store keeps it for inspection, any other deletes it) and starts again from scratch,
with a warning naming the state, its owner and the reason. State stored before seals existed
loads once and is stored again sealed.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from reflective_memory.errors import ConfigError, ModelLoadError
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode, FitReport
from reflective_memory.rmm.features import sign_vector
from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.sealed import seal, unseal
from reflective_memory.storage.bridge import TaskLock
from reflective_memory.storage.state import SetsAside, StateStore

__all__ = ["Rerankers", "PRIOR_OWNER", "RERANKER_STATE", "ADAPTER_STATE"]

logger = logging.getLogger(__name__)

#: State owner of the prior shared by an engine's users.
PRIOR_OWNER = "__shared__"
#: State name of a full reranker (the prior, or an isolated user's).
RERANKER_STATE = "rmm.reranker"
#: State name of a user's offsets on top of the prior.
ADAPTER_STATE = "rmm.user_adapter"
_RERANKER_CACHE = 64
_ADAPTER_CACHE = 4096
_ADAPTER_SUFFIX = ".delta.json"  # a user's offsets in files written before 0.2
_T = TypeVar("_T")


class _Moved(Exception):
    """A conditional update found the state changed since it was read (nothing is written)."""


class Rerankers:
    """The rerankers of one engine (see the module docs), loaded from and stored in `state`.

    Args:
        config: The reranker settings (`MemoryConfig.rerank`).
        dim: The embedding size.
        state: Where learned state is kept.
        legacy: A directory of reranker files written before 0.2 (`shared.safetensors`,
            `user-<hash>.delta.json`, `user-<hash>.safetensors`, ...): each is moved into
            `state` the first time its state is read, then deleted (a user's are deleted by
            `forget` too).

    Attributes:
        lock: Held while a reranker scores, learns or is loaded (re-entrant).
    """

    def __init__(
        self,
        config: RerankConfig,
        dim: int,
        state: StateStore,
        *,
        legacy: Path | None = None,
    ) -> None:
        if not isinstance(state, StateStore):
            raise ConfigError(f"state must be a StateStore, got {type(state).__name__}")
        self.config = config
        self.dim = dim
        self.state = state
        self.legacy = legacy
        self.lock = TaskLock(reentrant=True)  # held across state I/O: see `TaskLock`
        self._rerankers: OrderedDict[str, Reranker] = OrderedDict()
        self._adapters: OrderedDict[str, UserAdapter] = OrderedDict()
        self._versions: dict[tuple[str, str], int] = {}
        # Which user gave each buffered episode of the prior (by object id), for `forget`.
        self._episode_users: dict[int, str] = {}
        self._views: dict[str, PersonalReranker] = {}

    # ---------------------------------------------------------------- loading
    def _owner(self, user_id: str) -> str:
        return user_id if self.config.scope == "isolated" else PRIOR_OWNER

    def _fresh(self, name: str) -> Reranker | UserAdapter:
        """A new, untrained state `name`."""
        if name == RERANKER_STATE:
            return Reranker(self.dim, self.config)
        return UserAdapter(self.config)

    def _decode(self, name: str, data: bytes) -> tuple[Reranker | UserAdapter, bool]:
        """The state `name` in stored bytes, checked, and whether the bytes were sealed.

        Raises:
            ModelLoadError: The bytes are damaged: checksum, format, shapes, NaN or infinite
                values, magnitudes (see `Reranker.from_bytes`), or another embedding size.
        """
        payload, sealed = unseal(data)
        if name == ADAPTER_STATE:
            return UserAdapter.from_bytes(payload, self.config), sealed
        rr = Reranker.from_bytes(payload, self.config)
        if rr.dim != self.dim:
            raise ModelLoadError(f"saved reranker has dim {rr.dim}, the embedder has {self.dim}")
        return rr, sealed

    def _load(self, owner: str, name: str, data: bytes | None) -> Any:
        """The state in `data` (None: a fresh one), fresh with a warning when it is damaged."""
        if data is not None:
            try:
                return self._decode(name, data)[0]
            except ModelLoadError as exc:
                logger.warning(
                    "damaged learned state %r of %r (%s): it starts again from scratch",
                    name,
                    owner,
                    exc,
                )
        return self._fresh(name)

    def _set_aside(self, owner: str, name: str, version: int, exc: Exception) -> int:
        """Take a damaged stored state out of the way (if still at `version`), with a warning.

        A store that `SetsAside` keeps it for inspection (`FileStateStore`: renamed
        `*.damaged-<time>`); any other store deletes it. Returns the state's version after.
        """
        if isinstance(self.state, SetsAside):
            where = self.state.set_aside(owner, name, version)
            done = "still in place" if where is None else f"set aside as {where}"
        else:
            gone = self._update_if(owner, name, version, lambda _d: None)
            done = "deleted" if gone else "still in place"
        logger.warning(
            "damaged learned state %r of %r (%s): %s; it starts again from scratch",
            name,
            owner,
            exc,
            done,
        )
        return self.state.version(owner, name)

    def _update_if(
        self, owner: str, name: str, version: int, fn: Callable[[bytes], bytes | None]
    ) -> bool:
        """`fn` on the stored state if it is still at `version`; return whether it ran."""

        def update(current: int, data: bytes | None) -> bytes | None:
            if current != version or data is None:
                raise _Moved
            return fn(data)

        try:
            self.state.update(owner, name, update)
        except _Moved:
            return False
        return True

    def _legacy_files(self, owner: str) -> Path | None:
        """Base path of an owner's reranker files from before 0.2 (None without `legacy`)."""
        if self.legacy is None:
            return None
        if owner == PRIOR_OWNER:
            return self.legacy / "shared"
        return self.legacy / f"user-{hashlib.sha1(owner.encode()).hexdigest()[:24]}"

    def _migrate(self, owner: str, name: str) -> None:
        """Move an owner's pre-0.2 file for `name` into the state store, then delete it."""
        base = self._legacy_files(owner)
        if base is None:
            return
        suffix = ".safetensors" if name == RERANKER_STATE else _ADAPTER_SUFFIX
        path = base.parent / f"{base.name}{suffix}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("cannot read %s to migrate it: %s", path, exc)
            return
        # the saved bytes are what `to_bytes` writes; state written meanwhile wins
        self.state.update(owner, name, lambda _v, old: data if old is None else old)
        self._erase_files(owner, name)
        logger.info("moved %s into the state store", path)

    def _erase_files(self, owner: str, *names: str) -> None:
        """Delete an owner's pre-0.2 files for these state names (and crashed writes' leftovers)."""
        base = self._legacy_files(owner)
        if base is None:
            return
        suffixes = {RERANKER_STATE: (".safetensors", ".json"), ADAPTER_STATE: (_ADAPTER_SUFFIX,)}
        for name in names:
            for suffix in suffixes[name]:
                (base.parent / f"{base.name}{suffix}").unlink(missing_ok=True)
                for tmp in base.parent.glob(f".{base.name}{suffix}.*"):
                    tmp.unlink(missing_ok=True)

    def _cached(self, owner: str, name: str) -> Any:
        """The state `(owner, name)` as an object, reloaded when its stored version moved on."""
        cache: OrderedDict[str, Any] = self._rerankers if name == RERANKER_STATE else self._adapters
        # The usual case (cached and current) reads the version before taking the lock, so the
        # lock is never held across that read: concurrent retrievals do not queue behind it.
        version = self.state.version(owner, name)
        with self.lock:
            obj = cache.get(owner)
            fresh = version != 0 or self.legacy is None  # else a pre-0.2 file may migrate
            if obj is not None and fresh and self._versions.get((owner, name)) == version:
                cache.move_to_end(owner)
                return obj
            version = self.state.version(owner, name)
            if version == 0 and self.legacy is not None:
                self._migrate(owner, name)
                version = self.state.version(owner, name)
            obj = cache.get(owner)
            if obj is not None and self._versions.get((owner, name)) == version:
                cache.move_to_end(owner)
                return obj
            got = self.state.get(owner, name) if version else None
            version, data = (0, None) if got is None else got
            obj = None
            if data is not None:
                try:
                    obj, sealed = self._decode(name, data)
                except ModelLoadError as exc:
                    version = self._set_aside(owner, name, version, exc)
                else:
                    if not sealed and self._update_if(owner, name, version, seal):
                        logger.info("sealed learned state %r of %r with a checksum", name, owner)
                        version = self.state.version(owner, name)
            if obj is None:
                obj = self._fresh(name)
            self._put_cache(owner, name, obj, version)
            return obj

    def _put_cache(self, owner: str, name: str, obj: Any, version: int) -> None:
        cache: OrderedDict[str, Any] = self._rerankers if name == RERANKER_STATE else self._adapters
        limit = _RERANKER_CACHE if name == RERANKER_STATE else _ADAPTER_CACHE
        cache[owner] = obj
        cache.move_to_end(owner)
        self._versions[(owner, name)] = version
        while len(cache) > limit:
            old, _ = cache.popitem(last=False)
            self._versions.pop((old, name), None)

    def _full(self, owner: str) -> Reranker:
        """The full reranker of an owner (the prior, or an isolated user's), loaded or new."""
        return self._cached(owner, RERANKER_STATE)  # type: ignore[no-any-return]

    def prior(self) -> Reranker:
        """The reranker shared by this engine's users (scopes `user` and `shared`)."""
        return self._full(PRIOR_OWNER)

    def adapter(self, user_id: str) -> UserAdapter:
        """A user's own offsets on top of the prior (loaded, or new and zero)."""
        return self._cached(user_id, ADAPTER_STATE)  # type: ignore[no-any-return]

    def reranker(self, user_id: str) -> Reranker | PersonalReranker:
        """The reranker that serves `user_id` (by scope; see the class docs)."""
        scope = self.config.scope
        if scope == "isolated":
            return self._full(user_id)
        if scope == "shared":
            return self.prior()
        prior, ad = self.prior(), self.adapter(user_id)
        with self.lock:
            view = self._views.get(user_id)
            if view is None or view.prior is not prior or view.adapter is not ad:
                view = PersonalReranker(prior, ad)  # one view per user, for identity checks
                self._views[user_id] = view
                while len(self._views) > _ADAPTER_CACHE:
                    self._views.pop(next(iter(self._views)))
            return view

    # ---------------------------------------------------------------- writing
    def _modify(self, owner: str, name: str, change: Callable[[Any], _T]) -> _T:
        """Apply `change` to the latest stored state `(owner, name)` and store it, atomically."""
        box: dict[str, Any] = {}
        cache: OrderedDict[str, Any] = self._rerankers if name == RERANKER_STATE else self._adapters

        def update(version: int, data: bytes | None) -> bytes:
            obj = cache.get(owner)
            if obj is None or self._versions.get((owner, name)) != version:
                obj = self._load(owner, name, data)
            box["obj"], box["out"] = obj, change(obj)
            return seal(obj.to_bytes())

        with self.lock:
            self._cached(owner, name)  # a damaged stored state is set aside first
            if self.legacy is not None and self.state.version(owner, name) == 0:
                self._migrate(owner, name)
            try:
                version, _ = self.state.update(owner, name, update)
            except BaseException:
                # the cached copy may hold a change the store never got
                cache.pop(owner, None)
                self._versions.pop((owner, name), None)
                raise
            self._put_cache(owner, name, box["obj"], version)
        return box["out"]  # type: ignore[no-any-return]

    def _replace(self, owner: str, name: str, obj: Reranker | UserAdapter) -> None:
        """Store `obj` as the state `(owner, name)`, whatever was stored before."""
        with self.lock:
            version, _ = self.state.update(owner, name, lambda _v, _d: seal(obj.to_bytes()))
            self._erase_files(owner, name)  # a pre-0.2 file would be stale now
            self._put_cache(owner, name, obj, version)

    # --------------------------------------------------------------- learning
    def _fit(self, owner: str, rr: Reranker, episode: Episode, user_id: str) -> FitReport:
        """`rr.partial_fit(episode)`, remembering whose episodes the prior buffers."""
        before = {id(ep) for ep in rr.pending_}
        rep = rr.partial_fit(episode).last_fit_
        assert rep is not None  # every partial_fit call sets it
        if owner == PRIOR_OWNER:
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
        """Give one feedback episode to the reranker serving `user_id` and store the result.

        Scope `user`: one step of the user's offsets, then the episode joins the prior's
        batch; other scopes: the episode joins the full reranker's batch. Each change happens
        inside the state's read-modify-write, so concurrent feedback from other processes is
        never overwritten.

        Returns:
            The prior's (or the user's full reranker's) `FitReport`; with scope `user`,
            `extra["user_step"]` is the size of the offsets' change.
        """
        if self.config.scope != "user":
            owner = self._owner(user_id)
            return self._modify(
                owner, RERANKER_STATE, lambda rr: self._fit(owner, rr, episode, user_id)
            )
        with self.lock:
            prior = self.prior()
            ep, step = self._modify(
                user_id, ADAPTER_STATE, lambda ad: self._personal_step(prior, ad, episode)
            )
            rep = self._modify(
                PRIOR_OWNER, RERANKER_STATE, lambda rr: self._fit(PRIOR_OWNER, rr, ep, user_id)
            )
        rep.extra["user_step"] = step
        return rep

    # ---------------------------------------------------------------- erasure
    def forget(self, user_id: str) -> None:
        """Erase what the rerankers hold of a user, in memory and in the state store.

        The user's own state goes whatever the current scope (a store may have been used with
        several): offsets (scope `user`) and full reranker (scope `isolated`), and their
        files from before 0.2. The prior keeps the weights it learned from everyone, this user
        included (a few aggregate weights, not memories), but the user's buffered feedback
        episodes (query and memory vectors) are removed from it and it is stored again;
        buffered episodes whose user is unknown (stored by another process or an earlier run)
        are dropped too, as the user's could be among them (at most `batch_size - 1`).
        """
        with self.lock:
            self._views.pop(user_id, None)
            for name in (RERANKER_STATE, ADAPTER_STATE):
                cache = self._rerankers if name == RERANKER_STATE else self._adapters
                cache.pop(user_id, None)
                self._versions.pop((user_id, name), None)
                self.state.delete(user_id, name)
            self._erase_files(user_id, RERANKER_STATE, ADAPTER_STATE)
            if self.state.version(PRIOR_OWNER, RERANKER_STATE) or self._has_legacy_prior():
                self._modify(PRIOR_OWNER, RERANKER_STATE, lambda rr: self._keep_others(rr, user_id))

    def _has_legacy_prior(self) -> bool:
        base = self._legacy_files(PRIOR_OWNER)
        return base is not None and (base.parent / f"{base.name}.safetensors").exists()

    def _keep_others(self, rr: Reranker, user_id: str) -> bool:
        """Drop a user's (and unknown users') buffered episodes; return whether any went."""
        keep = [ep for ep in rr.pending_ if self._episode_users.get(id(ep)) not in (None, user_id)]
        if len(keep) == len(rr.pending_):
            return False
        rr.pending_ = keep
        return True

    # ------------------------------------------------------------ state bytes
    def user_state(self, user_id: str) -> bytes | None:
        """A user's own reranker state as bytes (None when the user has learned nothing).

        The offsets' JSON (scope `user`) or a full reranker's safetensors blob (scope
        `isolated`), e.g. to export a user's data.
        """
        with self.lock:
            scope = self.config.scope
            if scope == "shared":
                return None
            if scope == "isolated":
                rr = self._full(user_id)
                return None if rr.is_identity and not rr.pending_ else rr.to_bytes()
            ad = self.adapter(user_id)
            return None if ad.is_zero and not ad.n_episodes_ else ad.to_bytes()

    def restore_user_state(self, user_id: str, data: bytes) -> None:
        """Install a user's state from `user_state` bytes (and store it).

        Raises:
            ModelLoadError: The bytes are no such state.
            ConfigError: Scope `shared` keeps no per-user state.
        """
        scope = self.config.scope
        if scope == "shared":
            raise ConfigError("scope 'shared' keeps no per-user reranker state")
        if scope == "isolated":
            rr = Reranker.from_bytes(data, self.config)
            if rr.dim != self.dim:
                raise ModelLoadError(f"state has dim {rr.dim}, the embedder {self.dim}")
            self._replace(user_id, RERANKER_STATE, rr)
            return
        self._replace(user_id, ADAPTER_STATE, UserAdapter.from_bytes(data, self.config))

    def prior_state(self) -> bytes:
        """The shared prior as bytes (safetensors)."""
        with self.lock:
            return self.prior().to_bytes()

    def restore_prior_state(self, data: bytes) -> None:
        """Install the shared prior from `prior_state` bytes (and store it)."""
        rr = Reranker.from_bytes(data, self.config)
        if rr.dim != self.dim:
            raise ModelLoadError(f"state has dim {rr.dim}, the embedder {self.dim}")
        self._replace(PRIOR_OWNER, RERANKER_STATE, rr)
