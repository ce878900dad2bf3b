"""Rerankers kept in the database, shared by every process that serves the same users.

`StoredRerankStage` is `RerankStage` with its persistence moved from files into a store's
versioned blobs (`get_blob` / `update_blob` / `blob_version` / `delete_blob`, e.g.
`reflective_memory.storage.postgres.PostgresStore`). A process caches a reranker together with
the blob version it was read at and reloads it when another process has saved a newer one, so
no process reranks with stale weights for longer than one call. Each feedback episode is applied
inside the store's read-modify-write of the blob (under a cross-process lock), so updates from
several processes are applied one after the other and none is lost; buffered episodes are saved
with every call, so a crash loses nothing either.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from reflective_memory.config import MemoryConfig
from reflective_memory.embed import Embedder
from reflective_memory.errors import ConfigError, ModelLoadError
from reflective_memory.rmm.feedback import _SHARED, RerankStage
from reflective_memory.rmm.reranker import Episode, FitReport, Reranker

__all__ = ["StoredRerankStage", "reranker_to_bytes", "reranker_from_bytes"]

logger = logging.getLogger(__name__)

#: Blob name of a reranker (the blob owner is the user id, or the shared owner).
BLOB_NAME = "rmm.reranker"


def reranker_to_bytes(rr: Reranker) -> bytes:
    """A reranker as one safetensors file (weights, optimizer state, buffered episodes, config)."""
    with tempfile.TemporaryDirectory(prefix="rm-rr-") as tmp:
        rr.save(Path(tmp) / "r")
        return (Path(tmp) / "r.safetensors").read_bytes()


def reranker_from_bytes(data: bytes, **params: Any) -> Reranker:
    """Inverse of `reranker_to_bytes`; `params` override saved hyperparameters."""
    with tempfile.TemporaryDirectory(prefix="rm-rr-") as tmp:
        (Path(tmp) / "r.safetensors").write_bytes(data)
        return Reranker.load(Path(tmp) / "r", **params)


class StoredRerankStage(RerankStage):
    """`RerankStage` persisted in a store's versioned blobs instead of files.

    Args:
        config: The engine's settings.
        embedder: The engine's embedder.
        store: A store with `get_blob`, `update_blob`, `blob_version` and `delete_blob`.
    """

    def __init__(self, config: MemoryConfig, embedder: Embedder, store: Any) -> None:
        super().__init__(config, embedder, None)
        self.store = store
        self._versions: dict[str, int] = {}

    def _load(self, owner: str, data: bytes | None) -> Reranker:
        if data is not None:
            try:
                rr = reranker_from_bytes(data, **self._params())
                if rr.dim != self.embedder.dim:
                    raise ConfigError(
                        f"saved reranker has dim {rr.dim}, the embedder has {self.embedder.dim}"
                    )
                return rr
            except (ModelLoadError, ConfigError) as exc:
                logger.warning("starting a fresh reranker for %s: %s", owner, exc)
        return self._new()

    def reranker(self, user_id: str) -> Reranker:
        """The reranker serving `user_id`, reloaded when another process saved a newer one."""
        owner = self._owner(user_id)
        version = self.store.blob_version(owner, BLOB_NAME)
        with self._lock:
            rr = self._rerankers.get(owner)
            if rr is not None and self._versions.get(owner) == version:
                self._rerankers.move_to_end(owner)
                return rr
            got = self.store.get_blob(owner, BLOB_NAME)
            version, data = (0, None) if got is None else got
            rr = self._load(owner, data)
            self._rerankers[owner] = rr
            self._versions[owner] = version
            while len(self._rerankers) > 64:
                old, _ = self._rerankers.popitem(last=False)
                self._versions.pop(old, None)
            return rr

    def learn(self, user_id: str, episode: Episode) -> FitReport:
        """Apply one episode to the latest stored reranker and save it, atomically.

        See `RerankStage.learn`; here the update happens inside the store's locked
        read-modify-write, so concurrent feedback from other processes is never overwritten.
        """
        owner = self._owner(user_id)
        box: dict[str, Any] = {}

        def update(version: int, data: bytes | None) -> bytes:
            rr = self._rerankers.get(owner)
            if rr is None or self._versions.get(owner) != version:
                rr = self._load(owner, data)
            box["rr"] = rr
            before = {id(ep) for ep in rr.pending_}
            box["report"] = rr.partial_fit(episode).last_fit_
            if owner == _SHARED:  # remember whose buffered episodes these are (for `forget`)
                live = {id(ep) for ep in rr.pending_}
                self._episode_users = {k: v for k, v in self._episode_users.items() if k in live}
                for k in live - before:
                    self._episode_users[k] = user_id
            return reranker_to_bytes(rr)

        with self._lock:
            try:
                version = self.store.update_blob(owner, BLOB_NAME, update)
            except BaseException:
                # the in-memory copy may hold an update the database never got
                self._rerankers.pop(owner, None)
                self._versions.pop(owner, None)
                raise
            self._rerankers[owner] = box["rr"]
            self._versions[owner] = version
        rep = box["report"]
        assert rep is not None  # every partial_fit call sets it
        return rep

    def save(self, user_id: str) -> Path | None:
        """Write the reranker serving `user_id` to the store (already done by `learn`)."""
        owner = self._owner(user_id)
        with self._lock:
            rr = self.reranker(user_id)
            self._versions[owner] = self.store.update_blob(
                owner, BLOB_NAME, lambda _v, _d: reranker_to_bytes(rr)
            )
        return None

    def save_all(self) -> int:
        """Nothing to do: every episode is saved when it is learned."""
        return 0

    def forget(self, user_id: str) -> None:
        """Erase what the stored rerankers hold of a user (see `RerankStage.forget`).

        The user's own reranker blob is deleted whatever the current scope. If a shared
        reranker is stored, the user's buffered episodes are removed from it inside the
        store's locked read-modify-write; buffered episodes whose user this process does not
        know (learned by another process) are dropped too, as the user's could be among them.
        The weights learned from earlier updates are an aggregate and stay.
        """
        with self._lock:
            self.forget_retrievals(user_id)
            self._rerankers.pop(user_id, None)
            self._versions.pop(user_id, None)
            self.store.delete_blob(user_id, BLOB_NAME)
            if self.store.blob_version(_SHARED, BLOB_NAME) == 0:
                return
            box: dict[str, Reranker] = {}

            def update(version: int, data: bytes | None) -> bytes:
                rr = self._rerankers.get(_SHARED)
                if rr is None or self._versions.get(_SHARED) != version:
                    rr = self._load(_SHARED, data)
                rr.pending_ = [
                    ep
                    for ep in rr.pending_
                    if self._episode_users.get(id(ep)) not in (None, user_id)
                ]
                box["rr"] = rr
                return reranker_to_bytes(rr)

            try:
                version = self.store.update_blob(_SHARED, BLOB_NAME, update)
            except BaseException:
                self._rerankers.pop(_SHARED, None)
                self._versions.pop(_SHARED, None)
                raise
            self._rerankers[_SHARED] = box["rr"]
            self._versions[_SHARED] = version
