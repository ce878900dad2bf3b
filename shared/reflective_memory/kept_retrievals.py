"""Retrievals a surface showed a model, kept by id until the answer's feedback comes back.

`ReflectiveMemory.feedback` learns from the `Retrieval` the answer was written from (its
record of the shown turns, and the shown texts for the attribution fallback). A surface whose
caller sends the answer later, in another call, keeps the retrieval meanwhile: the LangChain
middleware between its hooks, the MCP server between `recall` and `feedback`, and the engine
keeps what feedback on a ranking by a caller's own reranker needs (`rmm.feedback`).
`RetrievalCache` is that one mechanism: a bounded map from retrieval ids to what is kept for
them (a `Retrieval`, or anything with a `retrieval_id` and a `user_id`), oldest dropped first,
optionally bounded per user too (so that one user's many retrievals never push another user's
out) and checked against the user who asks for one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Protocol, TypeVar

from reflective_memory.errors import InvalidInputError

__all__ = ["RetrievalCache", "Kept"]


class Kept(Protocol):
    """What a `RetrievalCache` keeps: a `Retrieval`, or anything naming one and its user."""

    @property
    def retrieval_id(self) -> str:
        """The retrieval's id."""
        ...

    @property
    def user_id(self) -> str:
        """Whose retrieval it is."""
        ...


K = TypeVar("K", bound=Kept)


class RetrievalCache(Generic[K]):
    """A small LRU map from retrieval ids to what is kept for later feedback (`Retrieval`s).

    Args:
        size: Retrievals kept in all (the oldest goes first).
        per_user: Retrievals kept per user (None: only `size` bounds them); past it the user's
            own oldest goes.

    Raises:
        InvalidInputError: `size` or `per_user` is not a positive integer.

    Example:
        >>> from reflective_memory.types import Retrieval
        >>> kept: RetrievalCache[Retrieval] = RetrievalCache(size=2)
        >>> rid = kept.put(Retrieval("ana", "where do I live", [], retrieval_id="r1"))
        >>> kept.get(rid, "bob") is None, kept.get(rid, "ana").query
        (True, 'where do I live')
    """

    def __init__(self, size: int = 256, per_user: int | None = None) -> None:
        for name, value in (("size", size), ("per_user", per_user)):
            ok = value is None and name == "per_user"
            if not ok and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        self.size, self.per_user = size, per_user
        self._items: OrderedDict[str, K] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, retrieval: K) -> str:
        """Keep a retrieval (the newest of its user's and of all); return its id."""
        rid = retrieval.retrieval_id
        with self._lock:
            self._items[rid] = retrieval
            self._items.move_to_end(rid)
            if self.per_user is not None:
                mine = [k for k, r in self._items.items() if r.user_id == retrieval.user_id]
                for old in mine[: len(mine) - self.per_user]:
                    del self._items[old]
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return rid

    def get(self, retrieval_id: str | None, user_id: str | None = None) -> K | None:
        """The retrieval with that id, if still kept (and, given `user_id`, that user's)."""
        if retrieval_id is None:
            return None
        with self._lock:
            found = self._items.get(retrieval_id)
        return found if found is not None and user_id in (None, found.user_id) else None

    def pop(self, retrieval_id: str | None, user_id: str | None = None) -> K | None:
        """Remove and return the retrieval with that id, if kept (and `user_id`'s, if given).

        Another user's retrieval is neither returned nor removed.
        """
        if retrieval_id is None:
            return None
        with self._lock:
            found = self._items.get(retrieval_id)
            if found is None or user_id not in (None, found.user_id):
                return None
            del self._items[retrieval_id]
            return found

    def forget(self, user_id: str) -> int:
        """Drop every retrieval of a user (e.g. when their memories are erased); how many."""
        with self._lock:
            gone = [k for k, r in self._items.items() if r.user_id == user_id]
            for key in gone:
                del self._items[key]
        return len(gone)
