"""A `UserIndex` whose searches run on the database server (PostgreSQL + pgvector).

The engine's algorithms (RF-Mem, fusion, the reranker, topic merging) work on a `UserIndex`:
positions into a list of memory ids, a dense index with `search` and stored `vectors`, a lexical
index with `search`. Here the lists of ids and keys are read from the server in one snapshot at
the user's current version; dense search is a pgvector query (exact for users up to the store's
`hnsw_threshold`, HNSW with iterative scans above), lexical search a full-text query, and
vectors are fetched on demand. The process keeps nothing that outlives the user's version:
`IndexCache` drops the snapshot as soon as `version(user_id)` moves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from reflective_memory.storage.base import MemoryVectors
from reflective_memory.storage.user_index import UserIndex, log_model_change, text_bytes_of

if TYPE_CHECKING:
    from reflective_memory.storage.pg_search import PgSearch

__all__ = ["ServerDenseIndex", "ServerLexicalIndex", "build_server_index"]

logger = logging.getLogger(__name__)


class _Rows:
    """Stored vectors by position, fetched from the server on first use and kept per snapshot.

    Callable (`rows(positions)`, what RF-Mem's `VectorIndex.vectors` is) and indexable
    (`rows[positions]`, what `DenseIndex.vectors` offers as an array).
    """

    def __init__(self, owner: ServerDenseIndex) -> None:
        self._owner = owner
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __call__(self, positions: Any) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        o = self._owner
        with self._lock:
            need = sorted({int(p) for p in pos if int(p) not in self._cache})
        if need:
            got = o.server.vectors(o.user_id, [o.ids[p] for p in need])
            with self._lock:
                for p in need:
                    v = got.get(o.ids[p])
                    # deleted since the snapshot: a zero vector scores 0 and is dropped later
                    self._cache[p] = v if v is not None else np.zeros(o.dim, np.float32)
        with self._lock:
            rows = [self._cache[int(p)] for p in pos]
        if not rows:
            return np.zeros((0, o.dim), np.float32)
        return np.vstack(rows).astype(np.float32)

    def keep(self, position: int, vector: np.ndarray) -> None:
        """Remember a row the server already sent (e.g. with a search result)."""
        with self._lock:
            self._cache[int(position)] = vector

    @property
    def nbytes(self) -> int:
        """Bytes of the rows fetched so far (what `UserIndex.nbytes` charges to the cache)."""
        with self._lock:
            return sum(int(v.nbytes) for v in self._cache.values())

    def __getitem__(self, positions: Any) -> np.ndarray:
        if isinstance(positions, (int, np.integer)):
            return self([positions])[0]
        return self(positions)

    def __len__(self) -> int:
        return len(self._owner.ids)


class ServerDenseIndex:
    """Dense search over one user's stored embeddings, run by pgvector.

    Args:
        server: The store's server-side search (`PostgresStore.search`).
        user_id: Owner.
        ids: Memory ids by position (the snapshot).
        dim: Embedding size.
        model: Embedder name (only embeddings of this model are searched).
        approximate: Use the HNSW index (iterative scan) instead of an exact per-user scan.
    """

    def __init__(
        self,
        server: PgSearch,
        user_id: str,
        ids: Sequence[str],
        dim: int,
        model: str,
        *,
        approximate: bool,
    ) -> None:
        self.server = server
        self.user_id = user_id
        self.ids = list(ids)
        self.dim = int(dim)
        self.model = model
        self.approximate = approximate
        self.kind = "pg-hnsw" if approximate else "pg-exact"
        self._where = {mid: p for p, mid in enumerate(self.ids)}
        self.vectors = _Rows(self)

    @property
    def ntotal(self) -> int:
        """Number of memories in the snapshot."""
        return len(self.ids)

    def set_search_params(self, ann: Any) -> None:
        """Search breadth is the server's (`PgSearch.ef_search`); nothing to set here."""

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` positions per query (see `DenseIndex.search`).

        Memories added after the snapshot are not returned (their positions are unknown);
        deleted ones simply do not come back from the server.
        """
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        m = q.shape[0]
        width = max(n, 0)
        scores = np.full((m, width), -np.inf, np.float32)
        pos = np.full((m, width), -1, np.int64)
        if width == 0 or self.ntotal == 0:
            return scores, pos
        take = min(width, self.ntotal)
        for i in range(m):
            ids, sc, vecs = self.server.dense_search(
                self.user_id, q[i], take, self.model, approximate=self.approximate
            )
            j = 0
            for mid, s, v in zip(ids, sc.tolist(), vecs, strict=True):
                p = self._where.get(mid)
                if p is None:
                    continue
                scores[i, j], pos[i, j] = s, p
                self.vectors.keep(p, v)
                j += 1
        return scores, pos


class ServerLexicalIndex:
    """Full-text search over one user's keys, run by PostgreSQL (tsvector + GIN)."""

    def __init__(self, server: PgSearch, user_id: str, ids: Sequence[str]) -> None:
        self.server = server
        self.user_id = user_id
        self._where = {mid: p for p, mid in enumerate(ids)}
        self.size = len(self._where)

    def search(self, query: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` positions with a positive score, best first (see `LexicalIndex.search`)."""
        if n <= 0 or self.size == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        ids, sc = self.server.lexical_search(self.user_id, query, n)
        keep = [
            (self._where[m], s) for m, s in zip(ids, sc.tolist(), strict=True) if m in self._where
        ]
        if not keep:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        return (
            np.asarray([s for _, s in keep], np.float32),
            np.asarray([p for p, _ in keep], np.int64),
        )


def build_server_index(
    server: PgSearch,
    user_id: str,
    embedder: Any,
    vectors: MemoryVectors | None = None,
    before: UserIndex | None = None,
) -> UserIndex:
    """Snapshot a user's memories on the server and wrap them as a `UserIndex`.

    Memories without an embedding of `embedder` (new keys, another model) are embedded and
    written back first, so every memory is searchable: by `vectors` when given, else from
    their keys. With `before`, an earlier snapshot of the user, only the memories written
    since are read when `before`'s are unchanged (`PgSearch.index_snapshot`).
    """
    dim, model = int(embedder.dim), str(embedder.name)
    old = before.extras.get("row_marks") if before is not None else None
    total = before.extras.get("mark_sum") if before is not None else None
    after = None
    if before is not None and old and len(old) == len(before.ids) and total is not None:
        after = (before.ids[-1], old[-1], len(old), total)
    snap = server.index_snapshot(user_id, model, dim, after)
    if snap.stale:
        log_model_change(user_id, snap.stale_models, embedder)
        logger.info("embedding %d memories of user %s", len(snap.stale), user_id)
        for s in range(0, len(snap.stale), 4096):
            chunk = [snap.ids[i] for i in snap.stale[s : s + 4096]]
            texts = [snap.keys[i] for i in snap.stale[s : s + 4096]]
            emb = embedder.encode(texts) if vectors is None else vectors(user_id, chunk, texts)
            server.set_embeddings(user_id, chunk, emb, model)
    ids, keys, marks, mark_sum = snap.ids, snap.keys, snap.marks, sum(snap.marks)
    text_bytes = None
    if snap.appended and before is not None and old is not None and total is not None:
        text_bytes = before.extras.get("text_bytes")
        if text_bytes is not None:
            text_bytes += text_bytes_of(ids, keys)
        ids, keys, marks = before.ids + ids, before.keys + keys, old + marks
        mark_sum += total
    threshold = server.hnsw_threshold
    approximate = threshold is not None and len(ids) > threshold
    dense = ServerDenseIndex(server, user_id, ids, dim, model, approximate=approximate)
    lexical = ServerLexicalIndex(server, user_id, ids)
    built = UserIndex(user_id, snap.version, ids, dense, keys, _lexical=lexical)  # type: ignore[arg-type]
    built.extras["row_marks"] = marks
    built.extras["mark_sum"] = mark_sum
    if text_bytes is not None:  # what the cache charges for ids and keys, carried
        built.extras["text_bytes"] = text_bytes
    return built
