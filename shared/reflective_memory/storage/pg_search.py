"""Search on the PostgreSQL server for `PostgresStore`: pgvector dense search and full-text.

`PgSearch` is the store's collaborator for everything about embeddings and search (the store
exposes it as `PostgresStore.search` and delegates its `vectors` and `set_embeddings` to it).

Dense search is exact for users up to `hnsw_threshold` memories (a scan of the user's rows via
the `(user_id, ...)` btree) and walks the HNSW index with pgvector 0.8's iterative scans above;
lexical search matches the library's tokens with a `tsvector` + GIN index;
`reflective_memory.storage.server_index` wraps both as the `UserIndex` the engine's algorithms
use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError
from reflective_memory.storage.bridge import TaskLock
from reflective_memory.storage.checksum import checked_keys
from reflective_memory.storage.pg_replicas import PgRoutes
from reflective_memory.storage.pg_schema import ensure_vector_index, vector_index_name
from reflective_memory.text import lexical_tokens

__all__ = ["PgSearch", "Snapshot", "to_vector", "tsquery_text"]

logger = logging.getLogger(__name__)


def to_vector(value: Any) -> np.ndarray:
    """A pgvector value as a float32 array."""
    return np.asarray(value if isinstance(value, np.ndarray) else value.to_numpy(), np.float32)


def tsquery_text(tokens: Sequence[str]) -> str:
    """An OR query of quoted lexemes for `to_tsquery('simple', ...)`."""
    quoted = ["'" + t.replace("\\", "").replace("'", "''") + "'" for t in dict.fromkeys(tokens)]
    return " | ".join(q for q in quoted if q != "''")


@dataclass(frozen=True)
class Snapshot:
    """A user's memories as `PgSearch.index_snapshot` read them.

    Attributes:
        version: The user's version the rows belong to.
        ids: Memory ids, in mark order.
        keys: Their keys.
        marks: Their marks (`seq`).
        stale: Positions (in `ids`) of the memories without an embedding of the model asked.
        appended: Only the memories marked above the earlier snapshot's newest were read.
        stale_models: The model stored with each `stale` memory (`None`: never embedded).
    """

    version: int
    ids: list[str]
    keys: list[str]
    marks: list[int]
    stale: list[int]
    appended: bool
    stale_models: list[str | None] = field(default_factory=list)


class PgSearch:
    """The embeddings of `PostgresStore`'s memories and the searches run over them on the server.

    Owns everything about the `embedding` column and the search indexes: stored vectors, the
    per-dimension HNSW indexes, dense and full-text search.

    Args:
        routes: The store's transactions (writes on the primary, reads on a replica); the
            schema is the primary's.
        hnsw_threshold: Users with more stored memories than this are searched through the
            HNSW index with iterative scans; smaller ones exactly (`None`: always exact).
        ef_search: HNSW search breadth (raised to the number of results asked for, at most
            1000).
        max_scan_tuples: Upper bound of rows an iterative HNSW scan visits.

    Raises:
        ConfigError: `hnsw_threshold` is neither None nor a non-negative int.
    """

    def __init__(
        self,
        routes: PgRoutes,
        *,
        hnsw_threshold: int | None = 50_000,
        ef_search: int = 64,
        max_scan_tuples: int = 50_000,
    ) -> None:
        if hnsw_threshold is not None and (
            not isinstance(hnsw_threshold, int) or hnsw_threshold < 0
        ):
            raise ConfigError(f"hnsw_threshold must be None or >= 0, got {hnsw_threshold!r}")
        self.routes = routes
        self.db = db = routes.primary
        self.hnsw_threshold = hnsw_threshold
        self.ef_search = int(ef_search)
        self.max_scan_tuples = int(max_scan_tuples)
        self._s = db.qualified
        self._lock = TaskLock()  # held across a query: see `TaskLock`
        self._dims: set[int] = set()

    def index_snapshot(
        self, user_id: str, model: str, dim: int, after: tuple[str, int, int, int] | None = None
    ) -> Snapshot:
        """A user's memories (ids, keys, marks), read in one consistent snapshot.

        A memory's mark (`seq`) comes from a sequence and is drawn again whenever its row is
        written (an upsert, a new key, restored times), so equal ids with equal marks are
        unchanged memories.

        With `after`, `(id, mark, count, mark_sum)` of an earlier snapshot (its newest memory
        and its mark, how many memories it held and the sum of their marks): when the memories
        marked up to `mark` are still those (the same count and sum, that memory among them),
        only the ones marked above it are read (`Snapshot.appended`): the earlier snapshot's
        lists followed by these are the current ones. Otherwise every memory is read. (A
        deletion or a rewrite changes the count; a deletion together with a row committed late
        under a lower mark changes the sum.) The rows read that have no embedding of `model`
        and size `dim` are listed in `Snapshot.stale`: the earlier snapshot listed its own.
        """

        def read(conn: Any) -> tuple[Any, bool, list[Any]]:
            row = conn.execute(
                f"SELECT version FROM {self._s}.user_state WHERE user_id=%s", (user_id,)
            ).fetchone()
            appended = False
            if after is not None:
                last, mark, count, total = after
                held = conn.execute(  # the count and sum from the (user_id, seq) index alone
                    f"SELECT count(*), coalesce(sum(seq), 0), (SELECT seq FROM {self._s}.memories"
                    f" WHERE user_id=%s AND id=%s) FROM {self._s}.memories"
                    " WHERE user_id=%s AND seq <= %s",
                    (user_id, last, user_id, mark),
                ).fetchone()
                appended = (int(held[0]), int(held[1]), held[2]) == (count, total, mark)
            rows = conn.execute(
                f"SELECT id, key, key_crc, seq, (embedding IS NULL OR embed_model IS DISTINCT"
                f" FROM %s OR embed_dim IS DISTINCT FROM %s), embed_model FROM {self._s}.memories"
                " WHERE user_id=%s" + (" AND seq > %s" if appended else "") + " ORDER BY seq",
                (model, dim, user_id, *((after[1],) if appended and after else ())),
            ).fetchall()
            return row, appended, rows

        row, appended, rows = self.routes.read(user_id, read, repeatable_read=True)
        return Snapshot(
            0 if row is None else int(row[0]),
            [r[0] for r in rows],
            checked_keys(user_id, [r[:3] for r in rows]),
            [int(r[3]) for r in rows],
            [i for i, r in enumerate(rows) if r[4]],
            appended,
            [r[5] for r in rows if r[4]],
        )

    def ensure_vector_index(self, dim: int) -> None:
        """Make sure the HNSW index for `dim`-sized embeddings exists (once per process)."""
        if dim in self._dims:
            return
        with self._lock:
            if dim not in self._dims:
                with self.db.connection() as conn:
                    if ensure_vector_index(conn, self.db.schema, dim):
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

        def read(conn: Any) -> list[Any]:
            with conn.cursor(binary=True) as cur:
                return list(cur.execute(sql, args).fetchall())

        return {r[0]: to_vector(r[1]) for r in self.routes.read(user_id, read)}

    def set_embeddings(self, user_id: str, ids: Sequence[str], emb: np.ndarray, model: str) -> None:
        """Store (re)computed embeddings without changing the user's version."""
        rows = []
        for i, v in zip(ids, emb, strict=True):
            v = np.asarray(v, dtype=np.float32).reshape(-1)
            rows.append((v, int(v.shape[0]), model, user_id, i))

        def write(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    f"UPDATE {self._s}.memories SET embedding=%s, embed_dim=%s, embed_model=%s "
                    "WHERE user_id=%s AND id=%s",
                    rows,
                )

        self.routes.write((user_id,), write)

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

        def read(conn: Any) -> list[Any]:
            with conn.cursor(binary=True) as cur:
                if approximate:
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
                return list(rows)

        if approximate:
            self.ensure_vector_index(dim)
        rows = self.routes.read(user_id, read)
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
        rows = self.routes.read(
            user_id,
            lambda conn: conn.execute(
                f"SELECT id, ts_rank(tsv, q, 1) AS r FROM {self._s}.memories,"
                " to_tsquery('simple', %s) AS q WHERE user_id=%s AND tsv @@ q"
                " ORDER BY r DESC, seq LIMIT %s",
                (tsq, user_id, n),
            ).fetchall(),
        )
        return [r[0] for r in rows], np.asarray([float(r[1]) for r in rows], np.float32)
