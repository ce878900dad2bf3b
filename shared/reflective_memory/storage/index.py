"""Per-user search indexes: derived caches rebuilt from the store when missing or stale.

`DenseIndex` wraps a FAISS inner-product index over L2-normalised key embeddings (cosine): exact
(`IndexFlatIP`) for small users, approximate (IVF or HNSW, see `AnnSettings`) above a configurable
size, always built from the stored embeddings; `LexicalIndex` wraps a bm25s index over the keys.
`IndexCache` keeps one `UserIndex` per user, keyed by the store's per-user version, in a
least-recently-used cache bounded by memory, and persists dense indexes under the store
directory. A persisted index is trusted only when it matches the store version, the embedder
(name and dimension), its own counts and the checksums written with it; anything else is
rebuilt from the stored embeddings.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from reflective_memory.embed import Embedder
from reflective_memory.storage.ann import ANN_KINDS, AnnSettings
from reflective_memory.storage.base import MemoryStore, ServerSearch
from reflective_memory.text import lexical_tokens

__all__ = [
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


class LexicalIndex:
    """BM25 over memory keys (bm25s), with the library's tokenizer.

    Args:
        keys: One text per memory, in index order.
        known: Tokens of keys already tokenized (by an earlier version of the user's index);
            only the other keys are tokenized.

    Attributes:
        tokens: Tokens of every key, by key text (hand it to the next version's index).
    """

    def __init__(self, keys: list[str], known: dict[str, list[str]] | None = None) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets DEBUG on import

        self.size = len(keys)
        self._bm25: Any | None = None
        seen = {} if known is None else known
        self.tokens: dict[str, list[str]] = {}
        for k in keys:
            if k not in self.tokens:
                got = seen.get(k)
                self.tokens[k] = (lexical_tokens(k) or ["\u2205"]) if got is None else got
        corpus = [self.tokens[k] for k in keys]
        if corpus:
            self._bm25 = bm25s.BM25()
            self._bm25.index(corpus, show_progress=False)

    def search(self, query: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` positions with a positive BM25 score, best first."""
        tokens = lexical_tokens(query)
        if self._bm25 is None or not tokens or n <= 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        scores = np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)
        n = min(n, len(scores))
        top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        top = top[scores[top] > 0]
        return scores[top], top.astype(np.int64)

    def overlap(self, query: str, positions: Sequence[int]) -> np.ndarray:
        """Share of the query's distinct tokens found in the key at each of `positions`.

        Reads the index's postings (a key holds a token exactly where that token alone scores
        above zero) instead of tokenizing the keys again.
        """
        tokens = sorted(set(lexical_tokens(query)))
        out = np.zeros(len(positions), np.float32)
        if self._bm25 is None or not tokens or not len(positions):
            return out
        pos = np.asarray(positions, dtype=np.int64)
        for tok in tokens:
            out += np.asarray(self._bm25.get_scores([tok]), dtype=np.float32)[pos] > 0
        return out / len(tokens)


@dataclass
class UserIndex:
    """Everything searchable of one user, at one store version.

    Attributes:
        user_id: Owner.
        version: Store version this index reflects.
        ids: Memory id per position.
        dense: The dense index.
        lexical: The lexical index (built on first use).
        keys: Key text per position.
        extras: Room for components' derived per-user state tied to this version.
        known_tokens: Key tokens of the user's index at an earlier version, which the BM25
            index reuses (dropped once it is built).
    """

    user_id: str
    version: int
    ids: list[str]
    dense: DenseIndex
    keys: list[str]
    _lexical: LexicalIndex | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    known_tokens: dict[str, list[str]] | None = field(default=None, repr=False)

    @property
    def lexical(self) -> LexicalIndex:
        """BM25 index over the keys (built lazily, once per version)."""
        if self._lexical is None:
            self._lexical = LexicalIndex(self.keys, self.known_tokens)
            self.known_tokens = None
        return self._lexical

    def key_tokens(self) -> dict[str, list[str]] | None:
        """Tokens of the keys, when this process tokenized them (for the next version)."""
        lex = self._lexical
        return lex.tokens if isinstance(lex, LexicalIndex) else self.known_tokens

    def overlap(self, query: str, positions: Sequence[int]) -> np.ndarray | None:
        """`LexicalIndex.overlap` when this process holds a built BM25 index, else None.

        None when the BM25 index is not built yet (dense-only use: building it just for this
        would cost more than tokenizing a few keys) or is run by a database server.
        """
        lex = self._lexical
        return lex.overlap(query, positions) if isinstance(lex, LexicalIndex) else None

    def __len__(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        """Approximate memory held: vectors (ours and FAISS's copy), keys, ids, BM25."""
        vec = int(self.dense.vectors.nbytes)
        text = sum(len(k) for k in self.keys) + sum(len(i) + 56 for i in self.ids)
        lexical = 0 if self._lexical is None else 3 * text
        return 2 * vec + 2 * text + lexical + 4096


def _digest(ids: list[str], keys: list[str], vectors_sha: str, version: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([version, ids, keys, vectors_sha]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


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
    """

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        directory: Path | None = None,
        batch_size: int = 64,
        ann: AnnSettings | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.store = store
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
        self._locks: dict[str, threading.Lock] = {}
        self._epochs: dict[str, int] = {}
        self._guard = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """Approximate memory held by the cached indexes."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._cache)

    def _user_lock(self, user_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(user_id, threading.Lock())

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
            t0 = time.perf_counter()
            if self._server is not None:  # searched on the database server: nothing to keep
                built = self._server.server_index(user_id, self.embedder)
            else:
                with self._guard:
                    epoch = self._epochs.get(user_id, 0)
                    stale = self._cache.get(user_id)
                built = self._load(user_id, version) or self._build(user_id, version, epoch, stale)
                if stale is not None and built.known_tokens is None:
                    # after a write (a turn added), BM25 tokenizes only the new keys
                    built.known_tokens = stale.key_tokens()
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
            meta = json.loads(fmeta.read_text())
            if (
                meta.get("version") != version
                or meta.get("model") != self.embedder.name
                or meta.get("user_id") != user_id
                or meta.get("dim") != self.embedder.dim
            ):
                return None
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
            vectors_sha = hashlib.sha256(np.ascontiguousarray(vectors).tobytes()).hexdigest()
            if vectors_sha != meta.get("vectors_sha256") or meta.get("digest") != _digest(
                ids, keys, vectors_sha, version
            ):
                raise ValueError("checksum mismatch: the files were changed after saving")
            dense = DenseIndex(vectors, index, self.ann)
            return UserIndex(user_id, version, ids, dense, keys)
        except Exception as exc:  # a damaged cache file is rebuilt, never trusted
            logger.warning("ignoring damaged index cache for user %s: %s", user_id, exc)
            return None

    def _build(
        self, user_id: str, version: int, epoch: int = 0, stale: UserIndex | None = None
    ) -> UserIndex:
        ids, keys, blobs, models = self.store.embeddings(user_id)
        dim = self.embedder.dim
        vectors = np.zeros((len(ids), dim), np.float32)
        missing: list[int] = []
        for i, (blob, model) in enumerate(zip(blobs, models, strict=True)):
            if blob is None or model != self.embedder.name or len(blob) != 4 * dim:
                missing.append(i)
            else:
                vectors[i] = np.frombuffer(blob, dtype=np.float32)
        if missing:
            logger.info("embedding %d memories of user %s", len(missing), user_id)
            for s in range(0, len(missing), 4096):
                chunk = missing[s : s + 4096]
                emb = self.embedder.encode([keys[i] for i in chunk])
                vectors[chunk] = emb
                self.store.set_embeddings(user_id, [ids[i] for i in chunk], emb, self.embedder.name)
        dense = self._appended(stale, ids, vectors) or build_dense_index(vectors, self.ann)
        built = UserIndex(user_id, version, ids, dense, keys)
        try:
            self._save(built, epoch)
        except (OSError, RuntimeError) as exc:  # derived data: a failed save costs a rebuild
            logger.warning("could not save the index cache of user %s: %s", user_id, exc)
        return built

    def _appended(
        self, stale: UserIndex | None, ids: list[str], vectors: np.ndarray
    ) -> DenseIndex | None:
        """The stale index with the new rows added, when the change only appended memories.

        A new turn adds one memory at the end: a copy of the previous FAISS index (an IVF keeps
        its trained lists; retraining one at 100K memories took 14 s) takes its vector instead
        of a rebuild. Anything else (a memory changed, deleted or reordered, another index
        kind) returns None: build from scratch.
        """
        if stale is None:
            return None
        old = stale.dense
        n = len(stale.ids)
        if (
            n == 0
            or n > len(ids)
            or old.kind != self.ann.kind_for(len(ids))
            or old.dim != vectors.shape[1]
            or stale.ids != ids[:n]
            or not np.array_equal(old.vectors, vectors[:n])
        ):
            return None
        index = faiss.clone_index(old.index)  # readers may still search the stale one
        if len(ids) > n:
            index.add(np.ascontiguousarray(vectors[n:], dtype=np.float32))
        return DenseIndex(vectors, index, self.ann)

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
        user_id = built.user_id
        if not self._current(user_id, built.version, epoch):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fidx, fmeta = self._files(user_id)
        vectors_sha = hashlib.sha256(
            np.ascontiguousarray(built.dense.vectors, dtype=np.float32).tobytes()
        ).hexdigest()
        meta = {
            "user_id": user_id,
            "version": built.version,
            "model": self.embedder.name,
            "dim": self.embedder.dim,
            "count": len(built.ids),
            "ids": built.ids,
            "keys": built.keys,
            "vectors_sha256": vectors_sha,
            "digest": _digest(built.ids, built.keys, vectors_sha, built.version),
        }
        # Unique temporary names: other threads or processes may save the same user at once.
        token = f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
        tmp_idx = fidx.with_name(f"{fidx.stem}.{token}.faiss.tmp")
        tmp_meta = fmeta.with_name(f"{fmeta.stem}.{token}.json.tmp")
        faiss.write_index(built.dense.index, str(tmp_idx))
        tmp_meta.write_text(json.dumps(meta))
        tmp_idx.replace(fidx)
        tmp_meta.replace(fmeta)
        if not self._current(user_id, built.version, epoch):
            for f in self._all_files(user_id):
                f.unlink(missing_ok=True)
