"""Search on the PostgreSQL server for `PostgresStore`: pgvector dense search and full-text.

Dense search is exact for users up to `hnsw_threshold` memories (a scan of the user's rows via
the `(user_id, ...)` btree) and walks the HNSW index with pgvector 0.8's iterative scans above;
lexical search matches the library's tokens with a `tsvector` + GIN index. `server_index` wraps
both as the `UserIndex` the engine's algorithms use (see `reflective_memory.storage.server_index`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from reflective_memory.storage.pg_schema import ensure_vector_index, vector_index_name
from reflective_memory.text import lexical_tokens

__all__ = ["PgSearchMixin", "to_vector", "tsquery_text"]

logger = logging.getLogger(__name__)


def to_vector(value: Any) -> np.ndarray:
    """A pgvector value as a float32 array."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, np.float32)


def tsquery_text(tokens: Sequence[str]) -> str:
    """An OR query of quoted lexemes for `to_tsquery('simple', ...)`."""
    quoted = ["'" + t.replace("\\", "").replace("'", "''") + "'" for t in dict.fromkeys(tokens)]
    return " | ".join(q for q in quoted if q != "''")


class PgSearchMixin:
    """Search methods of `PostgresStore` (needs its `_conn`, `_raw`, `_s`, `schema`, settings)."""

    _s: str
    schema: str
    hnsw_threshold: int | None
    ef_search: int
    max_scan_tuples: int
    _conn: Any
    _raw: Any
    _psycopg: Any
    _register_vector: Any
    _lock: threading.Lock
    _dims: set[int]

    def index_snapshot(self, user_id: str) -> tuple[int, list[str], list[str]]:
        """`(version, ids, keys)` of a user's memories, read in one consistent snapshot."""
        with self._raw() as conn:
            if conn.adapters.types.get("vector") is None:
                self._register_vector(conn)
                conn.commit()
            conn.isolation_level = self._psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    row = conn.execute(
                        f"SELECT version FROM {self._s}.user_state WHERE user_id=%s", (user_id,)
                    ).fetchone()
                    rows = conn.execute(
                        f"SELECT id, key FROM {self._s}.memories WHERE user_id=%s ORDER BY seq",
                        (user_id,),
                    ).fetchall()
            finally:
                conn.isolation_level = None
        return (0 if row is None else int(row[0])), [r[0] for r in rows], [r[1] for r in rows]

    def stale_embeddings(self, user_id: str, model: str, dim: int) -> tuple[list[str], list[str]]:
        """Ids and keys of a user's memories with no embedding of `model` and size `dim`."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT id, key FROM {self._s}.memories WHERE user_id=%s AND (embedding IS NULL"
                " OR embed_model IS DISTINCT FROM %s OR embed_dim IS DISTINCT FROM %s)"
                " ORDER BY seq",
                (user_id, model, dim),
            ).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]

    def ensure_vector_index(self, dim: int) -> None:
        """Make sure the HNSW index for `dim`-sized embeddings exists (once per process)."""
        if dim in self._dims:
            return
        with self._lock:
            if dim not in self._dims:
                with self._raw() as conn:
                    if ensure_vector_index(conn, self.schema, dim):
                        logger.info("created HNSW index %s", vector_index_name(dim))
                self._dims.add(dim)

    def vectors(
        self, user_id: str, ids: Sequence[str], model: str | None = None
    ) -> dict[str, np.ndarray]:
        """Stored embeddings of some of a user's memories, by id (missing ids left out).

        With `model`, only embeddings made by that model (the store contract's `vectors`).
        """
        sql = (
            f"SELECT id, embedding FROM {self._s}.memories WHERE user_id=%s AND id = ANY(%s) "
            "AND embedding IS NOT NULL"
        )
        args: tuple[Any, ...] = (user_id, list(ids))
        if model is not None:
            sql += " AND embed_model=%s"
            args = (*args, model)
        with self._conn() as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(sql, args).fetchall()
        return {r[0]: to_vector(r[1]) for r in rows}

    def dense_search(
        self, user_id: str, query: np.ndarray, n: int, model: str, *, approximate: bool
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The `n` memories of a user whose embeddings have the largest inner product.

        Exact (a scan of the user's rows through the `(user_id, ...)` btree) unless
        `approximate`, which walks the HNSW index with pgvector's iterative scan
        (`hnsw.iterative_scan = relaxed_order`) until `n` rows of this user are found or
        `max_scan_tuples` rows were visited, then orders the hits exactly.

        Returns:
            Ids, inner-product scores and the embeddings themselves (`(len(ids), dim)`; callers
            keep them so reranking needs no second round trip), best first.
        """
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        dim = int(q.shape[0])
        s = self._s
        with self._conn() as conn, conn.cursor(binary=True) as cur:
            if approximate:
                self.ensure_vector_index(dim)
                cur.execute(
                    "SELECT set_config('hnsw.ef_search', %s, true),"
                    " set_config('hnsw.iterative_scan', 'relaxed_order', true),"
                    " set_config('hnsw.max_scan_tuples', %s, true)",
                    (str(min(1000, max(self.ef_search, n))), str(self.max_scan_tuples)),
                )
                rows = cur.execute(
                    f"WITH hits AS MATERIALIZED (SELECT id, (embedding::vector({dim}) <#> %s)"
                    f" AS d, embedding FROM {s}.memories WHERE user_id=%s AND embed_dim={dim}"
                    " AND embed_model=%s"
                    f" ORDER BY embedding::vector({dim}) <#> %s LIMIT %s)"
                    " SELECT id, d, embedding FROM hits ORDER BY d, id",
                    (q, user_id, model, q, n),
                ).fetchall()
            else:
                rows = cur.execute(
                    f"SELECT id, embedding <#> %s AS d, embedding FROM {s}.memories"
                    " WHERE user_id=%s"
                    f" AND embed_dim={dim} AND embed_model=%s ORDER BY d, seq LIMIT %s",
                    (q, user_id, model, n),
                ).fetchall()
        vecs = np.zeros((len(rows), dim), np.float32)
        for i, r in enumerate(rows):
            vecs[i] = to_vector(r[2])
        return [r[0] for r in rows], np.asarray([-float(r[1]) for r in rows], np.float32), vecs

    def lexical_search(self, user_id: str, query: str, n: int) -> tuple[list[str], np.ndarray]:
        """Full-text search of a user's keys on the server (tsvector + GIN, `ts_rank`).

        Keys and query go through the library's tokenizer (`lexical_tokens`); a memory matches
        when it shares a token with the query, ranked by `ts_rank` normalised by key length.

        Returns:
            Ids and positive scores, best first.
        """
        tsq = tsquery_text(lexical_tokens(query))
        if not tsq or n <= 0:
            return [], np.zeros(0, np.float32)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT id, ts_rank(tsv, q, 1) AS r FROM {self._s}.memories,"
                " to_tsquery('simple', %s) AS q WHERE user_id=%s AND tsv @@ q"
                " ORDER BY r DESC, seq LIMIT %s",
                (tsq, user_id, n),
            ).fetchall()
        return [r[0] for r in rows], np.asarray([float(r[1]) for r in rows], np.float32)

    def server_index(self, user_id: str, embedder: Any) -> Any:
        """A `UserIndex` whose searches run on this server (see `storage.server_index`)."""
        from reflective_memory.storage.server_index import build_server_index

        return build_server_index(self, user_id, embedder)
