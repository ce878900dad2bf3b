"""What RF-Mem searches: the `VectorIndex` protocol and an exact in-memory index."""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import numpy as np

from reflective_memory.errors import InvalidInputError

__all__ = ["VectorIndex", "ArrayIndex", "as_vector_index"]

logger = logging.getLogger(__name__)


@runtime_checkable
class VectorIndex(Protocol):
    """What RF-Mem needs from a dense index (see the module docstring)."""

    @property
    def ntotal(self) -> int:
        """Number of stored vectors."""
        ...

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` inner-product search; rows padded with position -1."""
        ...

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        """Stored vectors at `positions`, shape `(len(positions), d)`."""
        ...


class ArrayIndex:
    """Exact inner-product index over an in-memory matrix (faiss `IndexFlatIP` when available).

    Args:
        vectors: `(n, d)` matrix of L2-normalised rows (copied to contiguous float32).
    """

    def __init__(self, vectors: np.ndarray) -> None:
        mat = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        if mat.ndim != 2:
            raise InvalidInputError(f"vectors must be a 2-D matrix, got shape {mat.shape}")
        self._mat = mat
        self._faiss: Any = None
        try:
            import faiss

            self._faiss = faiss.IndexFlatIP(mat.shape[1])
            if len(mat):
                self._faiss.add(mat)
        except ImportError:  # pragma: no cover - faiss is a base dependency
            self._faiss = None

    @property
    def ntotal(self) -> int:
        """Number of stored vectors."""
        return int(self._mat.shape[0])

    @property
    def dim(self) -> int:
        """Vector size."""
        return int(self._mat.shape[1])

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-`n` inner-product search, padded with -1 past `ntotal`."""
        q = np.ascontiguousarray(np.atleast_2d(np.asarray(queries, dtype=np.float32)))
        m = q.shape[0]
        scores = np.full((m, n), -np.inf, dtype=np.float32)
        pos = np.full((m, n), -1, dtype=np.int64)
        take = min(n, self.ntotal)
        if take == 0 or m == 0:
            return scores, pos
        if self._faiss is not None:
            s, p = self._faiss.search(q, take)
        else:  # pragma: no cover
            sims = q @ self._mat.T
            p = np.argsort(-sims, axis=1, kind="stable")[:, :take]
            s = np.take_along_axis(sims, p, axis=1)
        scores[:, :take] = s
        pos[:, :take] = p
        return scores, pos

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        """Stored rows at `positions`."""
        return self._mat[np.asarray(positions, dtype=np.int64)]


class _VectorsAdapter:
    """Gives `vectors()` to an index that stores its rows some other way."""

    def __init__(self, index: Any, getter: Any) -> None:
        self._index = index
        self._get = getter

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self._index.search(queries, n)

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(self._get(np.asarray(positions, dtype=np.int64)), dtype=np.float32)


def as_vector_index(index: Any) -> VectorIndex:
    """Return `index` as a `VectorIndex`.

    Accepts an object that already has `vectors(positions)`, one with a `vectors` /
    `embeddings` / `matrix` array attribute (like `reflective_memory.storage.index.DenseIndex`), or
    one with
    `reconstruct_batch` (a faiss index).

    Raises:
        InvalidInputError: If the object cannot search or its vectors cannot be read.
    """
    if not hasattr(index, "search") or not hasattr(index, "ntotal"):
        raise InvalidInputError(
            f"{type(index).__name__} is not a vector index: it needs `search(queries, n)` "
            "and `ntotal`"
        )
    vecs = getattr(index, "vectors", None)
    if callable(vecs):
        return index
    if isinstance(vecs, np.ndarray):  # e.g. `reflective_memory.storage.index.DenseIndex`
        return _VectorsAdapter(index, lambda p, m=vecs: m[p])
    if callable(getattr(index, "reconstruct_batch", None)):
        return _VectorsAdapter(index, index.reconstruct_batch)
    for attr in ("embeddings", "matrix"):
        mat = getattr(index, attr, None)
        if isinstance(mat, np.ndarray):
            return _VectorsAdapter(index, lambda p, m=mat: m[p])
    raise InvalidInputError(
        f"{type(index).__name__} gives no access to its stored vectors "
        "(expected `vectors(positions)`, `reconstruct_batch` or an `embeddings` array)"
    )
