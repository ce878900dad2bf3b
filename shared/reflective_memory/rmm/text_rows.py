"""Turn ranker feature rows for texts from any retriever (no conversation around them).

`ReflectiveMemory.rerank_texts` ranks documents another retriever found with the same weights
that rank a user's turns, so feedback on them teaches the one ranker. A text has no votes of
units, speakers or place in a conversation; it has what the turn features read from a turn's
own key: its place in the order given (as the fused rank of a turn key), its query cosine and
its BM25 over the best text's. Every other column is 0, the value a turn takes without that
cue. Columns are filled by name, so a feature added to `FEATURES` starts at 0 here too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reflective_memory.retrieval.features import FEATURES
from reflective_memory.storage.bm25 import LexicalIndex

__all__ = ["text_rows", "RRF_K"]

#: The fusion constant the rank columns are read with (`SearchConfig.rrf_k`'s default).
RRF_K = 60


def text_rows(
    query: str, texts: Sequence[str], cosines: np.ndarray, *, rrf_k: int = RRF_K
) -> np.ndarray:
    """One feature row per text (`FEATURES` columns), in the order given.

    Args:
        query: The query text.
        texts: The texts, best first as their retriever ranked them.
        cosines: Each text's cosine with the query.
        rrf_k: The fusion constant of the rank columns.

    Returns:
        `(len(texts), len(FEATURES))` rows.

    Example:
        >>> import numpy as np
        >>> rows = text_rows("dogs", ["dogs bark", "cats"], np.array([0.8, 0.1]))
        >>> round(float(rows[0, FEATURES.index("bm25")]), 2), rows.shape[1] == len(FEATURES)
        (1.0, True)
    """
    k = len(texts)
    rows = np.zeros((k, len(FEATURES)))
    if k == 0:
        return rows
    col = {name: i for i, name in enumerate(FEATURES)}
    rank = np.arange(k, dtype=np.float64)
    cos = np.asarray(cosines, dtype=np.float64).reshape(k)
    bm25 = np.zeros(k)
    scores, pos = LexicalIndex(list(texts)).search(query, k)
    bm25[np.asarray(pos, dtype=np.int64)] = scores
    best = bm25.max()
    values = {
        "log_vote": np.log((rrf_k + 1) / (rrf_k + rank + 1)),
        "own_rank": rrf_k / (rrf_k + rank + 1),
        "cosine": cos,
        "cosine_gap": cos - cos.max(),
        "bm25": bm25 / best if best > 0 else bm25,
    }
    for name, v in values.items():
        if name in col:
            rows[:, col[name]] = v
    return rows
