"""The searchable view of one user's memories at one store version, whoever searches it.

`UserIndex` is the record the retrieval pipeline searches: positions into a list of memory ids
and keys, a dense index, a lexical index and what components derived from this version. It is
filled by `reflective_memory.storage.index.IndexCache` (FAISS and BM25 in this process) or by a
store that searches on its server (`reflective_memory.storage.base.ServerSearch`); `DenseSearch`
and `KeySearch` are what the pipeline needs of its two indexes, whichever runs them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from reflective_memory.storage.bm25 import LexicalIndex

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder

__all__ = [
    "Carried",
    "DenseSearch",
    "KeySearch",
    "UserIndex",
    "log_model_change",
    "text_bytes_of",
]

logger = logging.getLogger(__name__)


class DenseSearch(Protocol):
    """Dense search over one user's vectors (FAISS in process, or pgvector on a server)."""

    kind: str
    vectors: Any

    @property
    def ntotal(self) -> int:
        """Number of searchable vectors."""
        ...

    def search(self, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` `(scores, positions)` per query; missing results have position -1."""
        ...

    def set_search_params(self, ann: Any) -> None:
        """Apply search-breadth settings (approximate indexes)."""
        ...


class KeySearch(Protocol):
    """Lexical search over one user's keys (BM25 in process, or full text on a server)."""

    def search(self, query: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` `(scores, positions)` with a positive score, best first."""
        ...


@dataclass
class Carried:
    """What an index version takes over from the version before when it only appended.

    Attributes:
        appended_from: Positions before this one are the previous version's, unchanged.
        extras: The previous version's `UserIndex.extras` (read only: components copy what
            they take, since readers of the previous version may still use it).
        lexical: The newest earlier BM25 index built over a prefix of these keys (the previous
            version's, or the one it carried itself when it built none).
    """

    appended_from: int
    extras: dict[str, Any]
    lexical: LexicalIndex | None


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
    """

    user_id: str
    version: int
    ids: list[str]
    dense: DenseSearch
    keys: list[str]
    _lexical: KeySearch | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    carried: Carried | None = None

    @property
    def lexical(self) -> KeySearch:
        """BM25 index over the keys (built lazily, once per version).

        When this version only appended memories to the one before, its BM25 index is that
        one's extended by the new keys.
        """
        if self._lexical is None:
            before = self.carried.lexical if self.carried is not None else None
            if before is not None and self.carried is not None:
                # `before` may be older than the previous version: extend it by all it lacks
                self._lexical = before.extended(self.keys[before.size :])
                self.carried.lexical = None
            else:
                self._lexical = LexicalIndex(self.keys)
        return self._lexical

    def carry_from(self, before: UserIndex) -> None:
        """Take over what `before`, the previous version of this index, derived.

        The caller has checked that this version holds `before`'s memories unchanged at the
        same positions and only appends new ones after them.
        """
        lexical = before._lexical if isinstance(before._lexical, LexicalIndex) else None
        if lexical is None and before.carried is not None:
            lexical = before.carried.lexical
        self.carried = Carried(len(before.ids), before.extras, lexical)

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
        text = self.extras.get("text_bytes")
        if text is None:
            text = self.extras["text_bytes"] = text_bytes_of(self.ids, self.keys)
        lexical = 0 if self._lexical is None else 3 * text
        return 2 * vec + 2 * text + lexical + 4096


def text_bytes_of(ids: Sequence[str], keys: Sequence[str]) -> int:
    """Approximate memory of ids and keys."""
    return sum(len(k) for k in keys) + sum(len(i) + 56 for i in ids)


def log_model_change(user_id: str, models: Sequence[str | None], embedder: Embedder) -> None:
    """Say (WARNING) that memories embedded by another model are about to be re-embedded.

    Args:
        user_id: The user whose index is built.
        models: The model names stored with the memories about to be embedded (`None`: never
            embedded, e.g. a failed embed; those are not a model change).
        embedder: The embedder that will embed them.
    """
    others = Counter(m for m in models if m is not None and m != embedder.name)
    if not others:
        return
    was = ", ".join(f"{n} by {m!r}" for m, n in others.most_common())
    logger.warning(
        "user %s: the store holds vectors of another embedding model (%s); re-embedding %d "
        "memories with %r (the store was written with another embedder; the new model's "
        "vectors are written back)",
        user_id,
        was,
        sum(others.values()),
        embedder.name,
    )
