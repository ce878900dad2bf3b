"""BM25 over memory keys that grows with appends instead of being rebuilt.

A chat adds a turn, then asks: every question after a write meets a new store version. A
BM25 index whose weights are baked in at build time (they depend on the corpus size, the
document frequencies and the mean length) must be rebuilt over the whole history each time.
This one keeps only postings (which key holds which token, how often) and each key's length,
and weighs the query's tokens when it is asked, so a new version that only appends keys adds
a block of postings for them and shares the rest.

Scores are the Lucene variant of BM25 (`k1` = 1.5, `b` = 0.75), as in Kamphuis et al. (ECIR
2020): `idf = ln(1 + (N - df + 0.5) / (df + 0.5))` and
`tf / (tf + k1 * (1 - b + b * len / mean_len))`; a query token counts once per occurrence.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from reflective_memory.text import lexical_tokens

__all__ = ["LexicalIndex"]

K1 = 1.5
B = 0.75
_EMPTY = "\u2205"  # a key without tokens still counts as a one-token document
_MAX_BLOCKS = 8


class _Block:
    """Postings of a run of keys, sorted by token id then position.

    Args:
        start: Index position of the first key.
        docs: Token ids of each key.
    """

    def __init__(self, start: int, docs: Sequence[Sequence[int]]) -> None:
        self.start = start
        self.size = len(docs)
        lengths = np.fromiter((len(d) for d in docs), np.int64, self.size)
        flat = np.fromiter((t for d in docs for t in d), np.int64, int(lengths.sum()))
        where = np.repeat(np.arange(self.size, dtype=np.int64), lengths)
        pairs, tf = np.unique(flat * self.size + where, return_counts=True)
        self.terms = pairs // max(self.size, 1)
        self.docs = (pairs % max(self.size, 1) + start).astype(np.int64)
        self.tf = tf.astype(np.float64)

    @classmethod
    def merged(cls, blocks: Sequence[_Block]) -> _Block:
        """One block holding the postings of consecutive `blocks`."""
        out = cls.__new__(cls)
        out.start = blocks[0].start
        out.size = sum(b.size for b in blocks)
        terms = np.concatenate([b.terms for b in blocks])
        docs = np.concatenate([b.docs for b in blocks])
        tf = np.concatenate([b.tf for b in blocks])
        order = np.lexsort((docs, terms))
        out.terms, out.docs, out.tf = terms[order], docs[order], tf[order]
        return out

    def postings(self, term: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions and counts of the keys of this block holding token `term`."""
        lo, hi = np.searchsorted(self.terms, (term, term + 1))
        return self.docs[lo:hi], self.tf[lo:hi]


class LexicalIndex:
    """BM25 over memory keys, with the library's tokenizer.

    Args:
        keys: One text per memory, in index order.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self._vocab: dict[str, int] = {}
        self._vocab_lock = threading.Lock()  # versions extended in other threads share the vocab
        self._blocks: list[_Block] = []
        self._lengths = np.zeros(0, np.float64)
        self._extend(keys)

    @property
    def size(self) -> int:
        """How many keys are indexed."""
        return int(len(self._lengths))

    def extended(self, keys: Sequence[str]) -> LexicalIndex:
        """A new index of these keys appended after this index's (this one is unchanged).

        The two share their postings; the cost is that of indexing `keys` alone (plus, now
        and then, merging small blocks so that a question reads few of them).
        """
        out = LexicalIndex.__new__(LexicalIndex)
        out._vocab = self._vocab  # grows only; ids this index does not hold have no postings
        out._vocab_lock = self._vocab_lock
        out._blocks = list(self._blocks)
        out._lengths = self._lengths
        out._extend(keys)
        return out

    def _extend(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        vocab = self._vocab
        tokenized = [lexical_tokens(key) or [_EMPTY] for key in keys]
        with self._vocab_lock:  # a token's id is the vocabulary's size when it is first seen
            docs = [[vocab.setdefault(t, len(vocab)) for t in tokens] for tokens in tokenized]
        self._blocks.append(_Block(self.size, docs))
        self._lengths = np.concatenate(
            [self._lengths, np.fromiter((len(d) for d in docs), np.float64, len(docs))]
        )
        # binary-counter merging: a block never sits after a smaller or equal one for long
        while len(self._blocks) > 1 and (
            self._blocks[-1].size * 2 >= self._blocks[-2].size or len(self._blocks) > _MAX_BLOCKS
        ):
            self._blocks[-2:] = [_Block.merged(self._blocks[-2:])]

    def _postings(self, term: int) -> tuple[np.ndarray, np.ndarray]:
        parts = [b.postings(term) for b in self._blocks]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _term_ids(self, tokens: Sequence[str]) -> list[int]:
        return [i for i in (self._vocab.get(t) for t in tokens) if i is not None]

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every key for a tokenized query (zeros where nothing matches)."""
        n = self.size
        out = np.zeros(n, np.float32)
        if not n:
            return out
        norm = K1 * ((1 - B) + B * self._lengths / float(self._lengths.mean()))
        for term in self._term_ids(tokens):
            docs, tf = self._postings(term)
            if not len(docs):
                continue
            idf = np.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
            out[docs] += (idf * tf / (norm[docs] + tf)).astype(np.float32)
        return out

    def search(self, query: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-`n` positions with a positive BM25 score, best first."""
        tokens = lexical_tokens(query)
        if not self.size or not tokens or n <= 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        scores = self.scores(tokens)
        n = min(n, len(scores))
        top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")]
        top = top[scores[top] > 0]
        return scores[top], top.astype(np.int64)

    def overlap(self, query: str, positions: Sequence[int]) -> np.ndarray:
        """Share of the query's distinct tokens found in the key at each of `positions`.

        Reads the postings instead of tokenizing the keys again.
        """
        tokens = sorted(set(lexical_tokens(query)))
        if not self.size or not tokens or not len(positions):
            return np.zeros(len(positions), np.float32)
        found = np.zeros(self.size, np.float32)
        for term in self._term_ids(tokens):
            found[self._postings(term)[0]] += 1  # a term's postings name each key once
        return found[np.asarray(positions, dtype=np.int64)] / len(tokens)
