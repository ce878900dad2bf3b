"""Rerankers kept in the database, shared by every process that serves the same users.

`StoredRerankStage` is `RerankStage` with its persistence moved from files into a store's
versioned blobs (`get_blob` / `update_blob` / `blob_version` / `delete_blob`, e.g.
`reflective_memory.storage.postgres.PostgresStore`):

- the prior shared by the users (scopes `user` and `shared`): owner `__shared__`, `BLOB_NAME`;
- a user's own offsets (scope `user`): owner the user id, `ADAPTER_BLOB_NAME`;
- a user's full reranker (scope `isolated`): owner the user id, `BLOB_NAME`.

A user's blobs are owned by the user, so the store deletes them with the rest of the user's
data (`delete_user`). A process caches each state together with the blob version it was read at
and reloads it when another process has saved a newer one, so no process reranks with stale
weights for longer than one call. Each feedback episode is applied inside the store's
read-modify-write of the blob (under a cross-process lock), so updates from several processes
are applied one after the other and none is lost; buffered episodes are saved with every call,
so a crash loses nothing either.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from reflective_memory.embed import Embedder
from reflective_memory.errors import ConfigError, ModelLoadError
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.feedback import _ADAPTER_CACHE, _SHARED, RerankStage
from reflective_memory.rmm.personal import UserAdapter
from reflective_memory.rmm.reranker import Episode, FitReport, Reranker

__all__ = [
    "StoredRerankStage",
    "reranker_to_bytes",
    "reranker_from_bytes",
    "BLOB_NAME",
    "ADAPTER_BLOB_NAME",
]

logger = logging.getLogger(__name__)

#: Blob name of a full reranker (owner: the user id, or the shared owner for the prior).
BLOB_NAME = "rmm.reranker"
#: Blob name of a user's offsets on top of the prior (owner: the user id).
ADAPTER_BLOB_NAME = "rmm.user_adapter"
_RERANKER_CACHE = 64

_T = TypeVar("_T")


def reranker_to_bytes(rr: Reranker) -> bytes:
    """A reranker as one safetensors blob (weights, buffered episodes, config)."""
    return rr.to_bytes()


def reranker_from_bytes(data: bytes, config: RerankConfig | None = None) -> Reranker:
    """Inverse of `reranker_to_bytes`; `config` overrides the saved hyperparameters."""
    return Reranker.from_bytes(data, config)


class StoredRerankStage(RerankStage):
    """`RerankStage` persisted in a store's versioned blobs instead of files.

    Args:
        config: The engine's settings.
        embedder: The engine's embedder.
        store: A store with `get_blob`, `update_blob`, `blob_version` and `delete_blob`.
    """

    def __init__(self, config: RerankConfig, embedder: Embedder, store: Any) -> None:
        super().__init__(config, embedder, None)
        self.store = store
        self._versions: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------ decoding
    def _load(self, owner: str, data: bytes | None) -> Reranker:
        if data is not None:
            try:
                rr = reranker_from_bytes(data, self.config)
                if rr.dim != self.embedder.dim:
                    raise ConfigError(
                        f"saved reranker has dim {rr.dim}, the embedder has {self.embedder.dim}"
                    )
                return rr
            except (ModelLoadError, ConfigError) as exc:
                logger.warning("starting a fresh reranker for %s: %s", owner, exc)
        return self._new()

    def _load_adapter(self, user_id: str, data: bytes | None) -> UserAdapter:
        if data is not None:
            try:
                ad = UserAdapter.from_bytes(data, self.config)
                if ad.features != tuple(self.config.features):
                    raise ModelLoadError("saved for other features")
                return ad
            except (ModelLoadError, ConfigError) as exc:
                logger.warning("starting fresh user offsets: %s", exc)
        return self._new_adapter()

    # ------------------------------------------------------- cached reads
    def _cached(
        self,
        owner: str,
        name: str,
        cache: OrderedDict[str, Any],
        load: Callable[[str, bytes | None], Any],
        limit: int,
    ) -> Any:
        """The cached state of a blob, reloaded when the stored version moved on."""
        version = self.store.blob_version(owner, name)
        with self._lock:
            obj = cache.get(owner)
            if obj is not None and self._versions.get((owner, name)) == version:
                cache.move_to_end(owner)
                return obj
            got = self.store.get_blob(owner, name)
            version, data = (0, None) if got is None else got
            obj = load(owner, data)
            cache[owner] = obj
            self._versions[(owner, name)] = version
            while len(cache) > limit:
                old, _ = cache.popitem(last=False)
                self._versions.pop((old, name), None)
            return obj

    def _full(self, owner: str) -> Reranker:
        """The stored full reranker of an owner, reloaded when another process saved a newer one."""
        return self._cached(owner, BLOB_NAME, self._rerankers, self._load, _RERANKER_CACHE)

    def adapter(self, user_id: str) -> UserAdapter:
        """A user's stored offsets, reloaded when another process saved newer ones."""
        return self._cached(
            user_id, ADAPTER_BLOB_NAME, self._adapters, self._load_adapter, _ADAPTER_CACHE
        )

    # -------------------------------------------------------------- writes
    def _modify(
        self,
        owner: str,
        name: str,
        cache: OrderedDict[str, Any],
        load: Callable[[str, bytes | None], Any],
        change: Callable[[Any], _T],
    ) -> _T:
        """Apply `change` to the latest stored state of a blob and save it, atomically."""
        box: dict[str, Any] = {}

        def update(version: int, data: bytes | None) -> bytes:
            obj = cache.get(owner)
            if obj is None or self._versions.get((owner, name)) != version:
                obj = load(owner, data)
            box["obj"], box["out"] = obj, change(obj)
            return obj.to_bytes()

        with self._lock:
            try:
                version = self.store.update_blob(owner, name, update)
            except BaseException:
                # the in-memory copy may hold a change the database never got
                cache.pop(owner, None)
                self._versions.pop((owner, name), None)
                raise
            cache[owner] = box["obj"]
            self._versions[(owner, name)] = version
        return box["out"]

    def _put(self, owner: str, name: str, cache: OrderedDict[str, Any], obj: Any) -> None:
        """Store `obj` as the blob's new state (whatever was stored before)."""
        with self._lock:
            version = self.store.update_blob(owner, name, lambda _v, _d: obj.to_bytes())
            cache[owner] = obj
            self._versions[(owner, name)] = version

    def _write_full(self, owner: str, rr: Reranker) -> None:
        self._put(owner, BLOB_NAME, self._rerankers, rr)

    def _write_adapter(self, user_id: str, ad: UserAdapter) -> None:
        self._put(user_id, ADAPTER_BLOB_NAME, self._adapters, ad)

    def learn(self, user_id: str, episode: Episode) -> FitReport:
        """Apply one episode to the latest stored state and save it, atomically.

        See `RerankStage.learn`; here each update happens inside the store's locked
        read-modify-write (with scope `user`: the user's offsets, then the prior), so
        concurrent feedback from other processes is never overwritten.
        """
        if self.config.scope != "user":
            owner = self._owner(user_id)
            return self._modify(
                owner,
                BLOB_NAME,
                self._rerankers,
                self._load,
                lambda rr: self._fit(owner, rr, episode, user_id),
            )
        with self._lock:
            prior = self.prior()
            ep, step = self._modify(
                user_id,
                ADAPTER_BLOB_NAME,
                self._adapters,
                self._load_adapter,
                lambda ad: self._personal_step(prior, ad, episode),
            )
            rep = self._modify(
                _SHARED,
                BLOB_NAME,
                self._rerankers,
                self._load,
                lambda rr: self._fit(_SHARED, rr, ep, user_id),
            )
        rep.extra["user_step"] = step
        return rep

    def save(self, user_id: str) -> Path | None:
        """Write the state serving `user_id` to the store (already done by `learn`)."""
        owner = self._owner(user_id)
        with self._lock:
            self._write_full(owner, self._full(owner))
            if self.config.scope == "user" and user_id in self._adapters:
                self._write_adapter(user_id, self._adapters[user_id])
        return None

    def save_all(self) -> int:
        """Nothing to do: every episode is saved when it is learned."""
        return 0

    # ------------------------------------------------------------- erasure
    def _erase_own(self, user_id: str) -> None:
        """Delete the user's own blobs (offsets and full reranker), whatever the scope."""
        for name in (BLOB_NAME, ADAPTER_BLOB_NAME):
            self._versions.pop((user_id, name), None)
            self.store.delete_blob(user_id, name)

    def _erase_from_prior(self, user_id: str) -> None:
        """Remove the user's buffered episodes from the stored prior, in the store's lock.

        Buffered episodes whose user this process does not know (learned by another process)
        are dropped too, as the user's could be among them.
        """
        if self.store.blob_version(_SHARED, BLOB_NAME) == 0:
            return
        self._modify(
            _SHARED,
            BLOB_NAME,
            self._rerankers,
            self._load,
            lambda rr: self._keep_others(rr, user_id),
        )
