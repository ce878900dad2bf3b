"""Per-user search indexes: derived caches rebuilt from the store when missing or stale.

`DenseIndex` wraps a FAISS inner-product index over L2-normalised key embeddings (cosine): exact
(`IndexFlatIP`) for small users, approximate (IVF or HNSW, see `AnnSettings`) above a configurable
size, always built from the stored embeddings; `LexicalIndex` (`storage/bm25.py`) is BM25 over
the keys. `IndexCache` keeps one `UserIndex` per user, keyed by the store's per-user version, in a
least-recently-used cache bounded by memory, and persists dense indexes under the store
directory. A persisted index is trusted only when its sealed metadata file checks
(`checksum.unseal`), the FAISS file matches the SHA-256 recorded there, and it matches the store
version, the embedder (name and dimension) and its own counts; a damaged file is logged as a
warning and, like a stale one, rebuilt from the stored embeddings. A version that only appended
memories to the cached one extends it (`UserIndex.carried`; the record is in
`reflective_memory.storage.user_index`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, cast

import faiss
import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.storage.ann import ANN_KINDS, AnnSettings
from reflective_memory.storage.base import KeyListing, MemoryStore, MemoryVectors, ServerSearch
from reflective_memory.storage.bm25 import LexicalIndex
from reflective_memory.storage.bridge import TaskLock
from reflective_memory.storage.checksum import seal, unseal
from reflective_memory.storage.user_index import UserIndex, log_model_change, text_bytes_of

__all__ = [
    "log_model_change",
    "AnnSettings",
    "DenseIndex",
    "LexicalIndex",
    "UserIndex",
    "IndexCache",
    "build_dense_index",
    "ANN_KINDS",
]

logger = logging.getLogger(__name__)


#: Approximate index kinds `AnnSettings.kind` accepts.


def _index_kind(index: Any) -> str:
    if faiss.try_extract_index_ivf(index) is not None:
        return "ivf"
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    return "exact"


def build_dense_index(vectors: np.ndarray, ann: AnnSettings | None = None) -> DenseIndex:
    """Build a `DenseIndex` over `vectors`: exact, or approximate above `ann.threshold`.

    Args:
        vectors: `(n, d)` float32 normalised rows (the stored embeddings).
        ann: Switch settings (`None`: always exact).

    Returns:
        The index; `DenseIndex.kind` says which.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    settings = AnnSettings(threshold=None) if ann is None else ann
    kind = settings.kind_for(len(vectors))
    if kind == "exact":
        return DenseIndex(vectors)
    n, d = vectors.shape
    t0 = time.perf_counter()
    if kind == "ivf":
        nlist = settings.nlist
        if nlist is None:
            nlist = int(min(max(16, 4 * np.sqrt(n)), max(1, n // 39)))
        nlist = max(1, min(nlist, n))
        quantizer = faiss.IndexFlatIP(d)
        index: Any = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = settings.seed
        rng = np.random.default_rng(settings.seed)
        take = min(n, 64 * nlist)
        sample = vectors if take == n else vectors[np.sort(rng.choice(n, take, replace=False))]
        index.train(np.ascontiguousarray(sample))
        index.add(vectors)
    else:
        index = faiss.IndexHNSWFlat(d, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = settings.ef_construction
        index.add(vectors)
    built = DenseIndex(vectors, index, settings)
    logger.info("built %s index over %d vectors in %.1f s", kind, n, time.perf_counter() - t0)
    return built


class DenseIndex:
    """Cosine search over L2-normalised vectors: exact (FAISS `IndexFlatIP`) or approximate.

    Use `build_dense_index` to get the approximate kinds. The stored vectors stay available as
    `vectors` (RF-Mem clusters and re-scores with them).

    Args:
        vectors: `(n, d)` float32 matrix of normalised rows.
        index: A FAISS index already holding `vectors` (`None`: build an exact one).
        ann: Search settings applied to an approximate `index` (`nprobe` / `ef_search`).
    """

    def __init__(
        self, vectors: np.ndarray, index: Any | None = None, ann: AnnSettings | None = None
    ) -> None:
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if index is None:
            index = faiss.IndexFlatIP(self.vectors.shape[1])
            if len(self.vectors):
                index.add(self.vectors)
        self.index = index
        self.kind = _index_kind(index)
        self._ef_search = 64
        if ann is not None:
            self.set_search_params(ann)

    def set_search_params(self, ann: AnnSettings) -> None:
        """Apply `ann.nprobe` (IVF) or `ann.ef_search` (HNSW) to the approximate index."""
        if self.kind == "ivf":
            faiss.extract_index_ivf(self.index).nprobe = ann.nprobe
        elif self.kind == "hnsw":
            self._ef_search = ann.ef_search
            self.index.hnsw.efSearch = ann.ef_search

    @property
    def ntotal(self) -> int:
        """Number of indexed vectors."""
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        """Vector size."""
        return int(self.vectors.shape[1])

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` positions per query.

        Args:
            queries: `(m, d)` float32 normalised queries (a single `(d,)` vector is accepted).
            n: Results per query.

        Returns:
            `(scores, positions)`, each `(m, n)`; missing results have position -1 and score
            `-inf`.
        """
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        m = q.shape[0]
        if n <= 0 or self.ntotal == 0:
            return np.full((m, max(n, 0)), -np.inf, np.float32), np.full((m, max(n, 0)), -1)
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self._ef_search, min(n, self.ntotal))
        scores, pos = self.index.search(q, min(n, self.ntotal))
        if n > self.ntotal:
            pad = n - self.ntotal
            scores = np.hstack([scores, np.full((m, pad), -np.inf, np.float32)])
            pos = np.hstack([pos, np.full((m, pad), -1, pos.dtype)])
        scores = np.where(pos < 0, -np.inf, scores).astype(np.float32)
        return scores, pos.astype(np.int64)


def _faiss(built: UserIndex) -> Any:
    """The FAISS index of a `UserIndex` this cache built (its dense part is a `DenseIndex`)."""
    return cast(DenseIndex, built.dense).index


def _only_appended(before: UserIndex, after: UserIndex) -> bool:
    """Whether `after` holds `before`'s memories unchanged, in place, and new ones after them.

    Read from the row marks both snapshots carry (`extras["row_marks"]`).
    """
    old, new = before.extras.get("row_marks"), after.extras.get("row_marks")
    n = len(before.ids)
    return (
        old is not None
        and new is not None
        and before.version < after.version
        and len(after.ids) > n
        and new[:n] == old
        and after.ids[:n] == before.ids
        and after.keys[:n] == before.keys
    )


def _file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _read_meta(path: Path) -> dict[str, Any]:
    """The metadata of a persisted index, its seal checked (ValueError when damaged)."""
    payload, sealed = unseal(path.read_bytes())
    if not sealed:
        raise ValueError("the metadata file has no checksum seal")
    meta = json.loads(payload.decode("utf-8", "surrogatepass"))
    if not isinstance(meta, dict):
        raise ValueError("the metadata is not a JSON object")
    return meta


class IndexCache:
    """One `UserIndex` per user, rebuilt from the store when its version moves.

    Embeddings missing from the store or made by another model are recomputed and written back.

    Args:
        store: The source of truth.
        embedder: Embeds keys that have no stored embedding.
        directory: Where dense indexes are persisted (`None`: memory only).
        batch_size: Embedding batch size.
        ann: When users switch to approximate search (`None`: always exact).
        max_bytes: Memory the cached indexes may hold (`UserIndex.nbytes`); least recently used
            users are dropped beyond it (the most recent one always stays). `None`: unbounded.
        vectors: Makes the vectors of memories without an embedding of `embedder` (a failed
            embed, another model) as writing makes them; `None`: their keys are embedded.
    """

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        directory: Path | None = None,
        batch_size: int = 64,
        ann: AnnSettings | None = None,
        max_bytes: int | None = None,
        vectors: MemoryVectors | None = None,
    ) -> None:
        self.store = store
        self.vectors = vectors
        #: The store when it searches on its server (`ServerSearch`): indexes are its snapshots.
        self._server: ServerSearch | None = store if isinstance(store, ServerSearch) else None
        self.embedder = embedder
        self.directory = directory
        self.batch_size = batch_size
        self.ann = AnnSettings(threshold=None) if ann is None else ann
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, UserIndex] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._locks: dict[str, TaskLock] = {}  # held across store calls: see `TaskLock`
        self._epochs: dict[str, int] = {}
        self._guard = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """Approximate memory held by the cached indexes."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._cache)

    def _user_lock(self, user_id: str) -> TaskLock:
        with self._guard:
            return self._locks.setdefault(user_id, TaskLock())

    def _put(self, built: UserIndex) -> None:
        with self._guard:
            self._drop(built.user_id)
            size = built.nbytes()
            self._cache[built.user_id] = built
            self._sizes[built.user_id] = size
            self._bytes += size
            limit = self.max_bytes
            while limit is not None and self._bytes > limit and len(self._cache) > 1:
                self._drop(next(iter(self._cache)))

    def _drop(self, user_id: str) -> None:
        """Forget a cached index (caller holds `_guard`)."""
        if self._cache.pop(user_id, None) is not None:
            self._bytes -= self._sizes.pop(user_id, 0)

    def _cached(self, user_id: str, version: int) -> UserIndex | None:
        with self._guard:
            cached = self._cache.get(user_id)
            if cached is None or cached.version != version:
                return None
            self._cache.move_to_end(user_id)
            return cached

    def invalidate(self, user_id: str) -> None:
        """Drop a user's cached index and its persisted files, waiting for a build in flight.

        A build that started before this call cannot save its files afterwards: it sees the
        epoch change (and the store version change) and discards them.
        """
        with self._user_lock(user_id):
            with self._guard:
                self._drop(user_id)
                self._epochs[user_id] = self._epochs.get(user_id, 0) + 1
            if self.directory is not None:
                for f in self._all_files(user_id):
                    f.unlink(missing_ok=True)

    def _files(self, user_id: str) -> tuple[Path, Path]:
        assert self.directory is not None
        h = hashlib.sha1(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        return self.directory / f"{h}.faiss", self.directory / f"{h}.json"

    def _all_files(self, user_id: str) -> list[Path]:
        fidx, fmeta = self._files(user_id)
        return [fidx, fmeta, *fidx.parent.glob(f"{fidx.stem}.*.tmp")]

    def get(self, user_id: str) -> UserIndex:
        """The user's current index (built, loaded or reused)."""
        version = self.store.version(user_id)
        cached = self._cached(user_id, version)
        if cached is not None:
            return cached
        with self._user_lock(user_id):
            version = self.store.version(user_id)
            cached = self._cached(user_id, version)
            if cached is not None:
                return cached
            with self._guard:
                before = self._cache.get(user_id)  # an older version, if any
            t0 = time.perf_counter()
            if self._server is not None:  # searched on the database server: nothing to keep
                built = self._server.server_index(user_id, self.embedder, self.vectors, before)
                if before is not None and _only_appended(before, built):
                    built.carry_from(before)  # what the pipeline derived from the turns
            else:
                with self._guard:
                    epoch = self._epochs.get(user_id, 0)
                built = (
                    self._appended(user_id, version, epoch, before)
                    or self._load(user_id, version)
                    or self._build(user_id, version, epoch)
                )
            if version != 0:
                self._put(built)
            logger.debug(
                "index for user %s: %d memories in %.1f ms",
                user_id,
                len(built),
                (time.perf_counter() - t0) * 1000,
            )
            return built

    def _load(self, user_id: str, version: int) -> UserIndex | None:
        if self.directory is None:
            return None
        fidx, fmeta = self._files(user_id)
        if not (fidx.exists() and fmeta.exists()):
            return None
        try:
            meta = _read_meta(fmeta)
            if (
                meta.get("version") != version
                or meta.get("model") != self.embedder.name
                or meta.get("user_id") != user_id
                or meta.get("dim") != self.embedder.dim
            ):
                return None  # stale: the user changed since, or another embedder
            if _file_sha256(fidx) != meta.get("faiss_sha256"):
                raise ValueError("the FAISS file does not match its checksum")
            index = faiss.read_index(str(fidx))
            if index.d != self.embedder.dim:
                raise ValueError(f"index dimension {index.d}, the embedder has {self.embedder.dim}")
            if _index_kind(index) != self.ann.kind_for(index.ntotal):
                return None  # the switch settings changed: rebuild from stored embeddings
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None:
                ivf.make_direct_map()
            vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else None
            if vectors is None:
                vectors = np.zeros((0, index.d), np.float32)
            ids, keys = meta["ids"], meta["keys"]
            if not (len(ids) == len(keys) == index.ntotal == meta.get("count")):
                raise ValueError("the index and its metadata disagree on the count")
            dense = DenseIndex(vectors, index, self.ann)
            return UserIndex(user_id, version, ids, dense, keys)
        except Exception as exc:  # a damaged cache file is rebuilt, never trusted
            logger.warning("ignoring damaged index cache for user %s: %s", user_id, exc)
            return None

    def _build(self, user_id: str, version: int, epoch: int = 0) -> UserIndex:
        ids, keys, blobs, models = self.store.embeddings(user_id)
        dim = self.embedder.dim
        vectors = np.zeros((len(ids), dim), np.float32)
        missing: list[int] = []
        for i, (blob, model) in enumerate(zip(blobs, models, strict=True)):
            if blob is None or model != self.embedder.name or len(blob) != 4 * dim:
                missing.append(i)
            else:
                vectors[i] = np.frombuffer(blob, dtype=np.float32)
        log_model_change(user_id, [models[i] for i in missing], self.embedder)
        self._embed_missing(user_id, ids, keys, vectors, missing)
        built = UserIndex(user_id, version, ids, build_dense_index(vectors, self.ann), keys)
        if isinstance(self.store, KeyListing) and ids:  # what a later append is checked against
            mark = self.store.row_mark(user_id, ids[-1])
            if self.store.version(user_id) == version:  # nothing written since the read
                built.extras["last_mark"] = mark
        self._save(built, epoch)
        return built

    def _appended(
        self, user_id: str, version: int, epoch: int, before: UserIndex | None
    ) -> UserIndex | None:
        """The new version of `before` when it only gained memories, reading just theirs.

        None (build from scratch) when the store cannot list memories by row mark
        (`KeyListing`), `before` was loaded from disk, the user crosses the exact/approximate
        switch, or any of `before`'s memories was deleted or written again since. An
        approximate index takes the new vectors into its trained lists (or graph) as is; a
        build from scratch (a restart, a deletion) trains it again.
        """
        if before is None or not isinstance(self.store, KeyListing) or before.version >= version:
            return None
        last = before.extras.get("last_mark")
        if last is None:
            return None
        got_ids, got_keys, marks, total = self.store.memory_keys(user_id, last)
        n = len(before.ids)
        if not n or not got_ids or (got_ids[0], marks[0]) != (before.ids[-1], last):
            return None  # the newest memory of `before` was deleted or written again
        new_ids, new_keys, marks = got_ids[1:], got_keys[1:], marks[1:]
        if not new_ids or total != n + len(new_ids) or not set(new_ids).isdisjoint(before.ids):
            return None  # nothing new, or some memory was deleted or written again
        ids, keys = before.ids + new_ids, before.keys + new_keys
        kind = self.ann.kind_for(len(ids))
        if kind != before.dense.kind:  # crossing the exact/approximate switch: build anew
            return None
        stored = self.store.vectors(user_id, new_ids, self.embedder.name)
        added = np.zeros((len(new_ids), self.embedder.dim), np.float32)
        missing = []
        for i, mid in enumerate(new_ids):
            got = stored.get(mid)
            if got is None or got.shape != (self.embedder.dim,):
                missing.append(n + i)
            else:
                added[i] = got
        vectors = np.concatenate([before.dense.vectors, added])
        self._embed_missing(user_id, ids, keys, vectors, missing)
        if kind == "exact":
            dense = build_dense_index(vectors, self.ann)
        else:  # the trained lists or graph take the new vectors; readers keep the old copy
            index = faiss.clone_index(_faiss(before))
            index.add(np.ascontiguousarray(vectors[n:]))
            dense = DenseIndex(vectors, index, self.ann)
        built = UserIndex(user_id, version, ids, dense, keys)
        built.extras["last_mark"] = marks[-1]
        if "text_bytes" in before.extras:
            built.extras["text_bytes"] = before.extras["text_bytes"] + text_bytes_of(
                new_ids, new_keys
            )
        built.carry_from(before)
        saved = before.extras.get("saved_count", n)
        if len(ids) >= saved * 1.1:  # the file on disk is for a restart: refreshed now and then
            self._save(built, epoch)
        else:
            built.extras["saved_count"] = saved
        return built

    def _embed_missing(
        self,
        user_id: str,
        ids: list[str],
        keys: list[str],
        vectors: np.ndarray,
        missing: list[int],
    ) -> None:
        """Embed the keys at positions `missing` into `vectors` and store their embeddings."""
        if not missing:
            return
        logger.info("embedding %d memories of user %s", len(missing), user_id)
        for s in range(0, len(missing), 4096):
            chunk = missing[s : s + 4096]
            got, texts = [ids[i] for i in chunk], [keys[i] for i in chunk]
            emb = (
                self.embedder.encode(texts)
                if self.vectors is None
                else self.vectors(user_id, got, texts)
            )
            vectors[chunk] = emb
            self.store.set_embeddings(user_id, got, emb, self.embedder.name)

    def _current(self, user_id: str, version: int, epoch: int) -> bool:
        with self._guard:
            if self._epochs.get(user_id, 0) != epoch:
                return False
        return self.store.version(user_id) == version

    def _save(self, built: UserIndex, epoch: int = 0) -> None:
        """Persist an index, unless the user changed or was deleted since the build began.

        Checked before writing and again after (another process may delete the user in
        between; then the files just written are removed).
        """
        if self.directory is None or built.version == 0 or not built.ids:
            return
        try:
            self._write(built, epoch)
        except (OSError, RuntimeError) as exc:  # derived data: a failed save costs a rebuild
            logger.warning("could not save the index cache of user %s: %s", built.user_id, exc)

    def _write(self, built: UserIndex, epoch: int) -> None:
        assert self.directory is not None
        user_id = built.user_id
        if not self._current(user_id, built.version, epoch):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fidx, fmeta = self._files(user_id)
        # Unique temporary names: other threads or processes may save the same user at once.
        token = f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
        tmp_idx = fidx.with_name(f"{fidx.stem}.{token}.faiss.tmp")
        tmp_meta = fmeta.with_name(f"{fmeta.stem}.{token}.json.tmp")
        faiss.write_index(_faiss(built), str(tmp_idx))
        meta = {
            "user_id": user_id,
            "version": built.version,
            "model": self.embedder.name,
            "dim": self.embedder.dim,
            "count": len(built.ids),
            "ids": built.ids,
            "keys": built.keys,
            "faiss_sha256": _file_sha256(tmp_idx),
        }
        tmp_meta.write_bytes(seal(json.dumps(meta).encode("utf-8", "surrogatepass")))
        tmp_idx.replace(fidx)
        tmp_meta.replace(fmeta)
        if not self._current(user_id, built.version, epoch):
            for f in self._all_files(user_id):
                f.unlink(missing_ok=True)
