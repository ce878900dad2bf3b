"""Query-focused excerpts: the part of a long turn that answers, in the room a budget gives it.

Long turns are common in chats with an assistant: a stat block, a list of refineries and their
processes, a user's message that mentions one fact in passing ("By the way, I'm now on page
220"). A small budget either drops such a turn or spends most of itself on it. An excerpt keeps
the turn in the reader's context at a fixed size: the contiguous run of its sentences that holds
most of the question's words, each word weighted by how rare it is inside the turn, widened with
what follows (then what precedes) while it fits, with `…` where the text is cut. The words are
the turn's own; nothing is rewritten or summarised.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property

from reflective_memory.text import STOPWORDS, stem

__all__ = ["CUT_MARK", "Pieces", "excerpt"]

#: Put where an excerpt cuts the turn's text.
CUT_MARK = "…"

_WORD = re.compile(r"[^\W_]+")  # what `lexical_tokens` reads as a word: `str.isalnum` characters
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_RUN = re.compile(r"\S+")
#: Lines longer than this (in words) are cut at sentence ends, and sentences into runs of it.
_PIECE_WORDS = 40
_SHORT = 2 * _PIECE_WORDS  # characters: a text this short cannot hold more words than that


def _few_words(text: str) -> bool:
    """`len(text.split()) <= _PIECE_WORDS`, splitting no further than it takes to tell."""
    return len(text.split(None, _PIECE_WORDS)) <= _PIECE_WORDS


@dataclass(frozen=True)
class Pieces:
    """A text cut into lines, sentences of long lines, and word runs of long sentences.

    Attributes:
        text: The text.
        spans: Character spans of the pieces, in order.
        count: The token counter the pieces' costs are counted with.
    """

    text: str
    spans: tuple[tuple[int, int], ...]
    count: Callable[[str], int]
    _costs: list[int | None] = field(default_factory=list, repr=False, compare=False)

    def cost(self, k: int) -> int:
        """What piece `k` costs (counted when first asked: most pieces never are)."""
        if not self._costs:
            self._costs.extend([None] * len(self.spans))
        got = self._costs[k]
        if got is None:
            a, b = self.spans[k]
            got = self._costs[k] = self.count(self.text[a:b])
        return got

    @cached_property
    def lower(self) -> str:
        """The text in lower case (same length: offsets of `spans` hold in it)."""
        low = self.text.lower()
        return low if len(low) == len(self.text) else self.text

    @classmethod
    def of(cls, text: str, count: Callable[[str], int]) -> Pieces:
        """Cut `text` into pieces and count each with `count`."""
        spans: list[tuple[int, int]] = []
        at = 0
        for line in text.split("\n"):
            a, at = at, at + len(line) + 1
            body = line.strip()
            if not body:
                continue
            a += len(line) - len(line.lstrip())
            if len(body) <= _SHORT or _few_words(body):  # a line is one piece
                spans.append((a, a + len(body)))
                continue
            cuts = [a, *(a + m.end() for m in _SENTENCE_END.finditer(body))]
            for x, y in zip(cuts, [*cuts[1:], a + len(body)], strict=True):
                sentence = text[x:y].rstrip()
                if len(sentence) <= _SHORT or _few_words(sentence):
                    spans.append((x, x + len(sentence)))
                    continue
                words = list(_RUN.finditer(sentence))
                for i in range(0, len(words), _PIECE_WORDS):
                    run = words[i : i + _PIECE_WORDS]
                    spans.append((x + run[0].start(), x + run[-1].end()))
        return cls(text, tuple(spans), count)

    def terms(self, query_terms: Collection[str]) -> list[set[str]]:
        """Which of the question's terms each piece holds (as `lexical_tokens` would find).

        Each term (and `y` as `ies`) is searched as a string in the lower-cased text; only the
        words it starts are stemmed and checked.
        """
        found: list[set[str]] = [set() for _ in self.spans]
        wanted = frozenset(query_terms)
        starts = [a for a, _ in self.spans]
        low = self.lower
        for form in wanted | {t[:-1] + "ies" for t in wanted if t.endswith("y")}:
            at = low.find(form)
            while at >= 0:
                if not (at and low[at - 1].isalnum()):  # the start of a word (as `_WORD` reads)
                    word = _WORD.match(low, at)[0]  # type: ignore[index]
                    term = stem(word)
                    if term in wanted and word not in STOPWORDS:
                        i = bisect_right(starts, at) - 1
                        if i >= 0 and at < self.spans[i][1]:
                            found[i].add(term)
                at = low.find(form, at + 1)
        return found


def excerpt(
    pieces: Pieces,
    query_terms: Collection[str],
    allowance: int,
    count: Callable[[str], int],
) -> str | None:
    r"""The run of a text's pieces that best covers a question within `allowance` tokens.

    Args:
        pieces: The text, cut (`Pieces.of`, with the same `count`).
        query_terms: The question's `lexical_tokens`.
        allowance: Most tokens (by `count`) the excerpt may cost, cut marks included.
        count: Token counter of the budget.

    Returns:
        The excerpt, `…` before and after where text is cut; the text's opening when no piece
        holds a word of the question; None when not even one piece fits.

    Example:
        >>> from reflective_memory.text import lexical_tokens
        >>> words = lambda s: len(s.split())
        >>> text = Pieces.of("Intro.\nThe temple has traps.\n* Mummies (4)\n* Skeletons (6)", words)
        >>> excerpt(text, lexical_tokens("How many mummies?"), 5, words)
        '… * Mummies (4) …'
        >>> excerpt(text, lexical_tokens("How many mummies?"), 9, words)
        '… * Mummies (4)\n* Skeletons (6)'
    """
    spans, cost = pieces.spans, pieces.cost
    if not spans:
        return None
    terms = pieces.terms(query_terms)
    df: dict[str, int] = {}
    for ts in terms:
        for t in ts:
            df[t] = df.get(t, 0) + 1
    weight = {t: math.log(1.0 + len(spans) / n) for t, n in df.items()}
    mark = count(CUT_MARK)
    # (score, -cost, i, j, cost): the tightest run wins a tie, so a run starts and ends with a
    # piece that holds a word of the question
    best: tuple[float, int, int, int, int] | None = None
    for i in (k for k, ts in enumerate(terms) if ts):
        seen: set[str] = set()
        score, spent = 0.0, 2 * mark
        for j in range(i, len(spans)):
            spent += cost(j)
            if spent > allowance:
                break
            if not terms[j]:
                continue
            new = terms[j] - seen
            seen |= new
            score += sum(weight[t] for t in sorted(new))  # one order: the same float sum
            if best is None or (score, -spent) > best[:2]:
                best = (score, -spent, i, j, spent)
    if best is None:  # no word of the question in the text: its opening; words only in
        # pieces too long for the allowance: the first piece that fits
        starts = range(len(spans)) if df else range(1)
        i = next((k for k in starts if cost(k) + 2 * mark <= allowance), None)
        if i is None:
            return None
        best = (0.0, 0, i, i, cost(i) + 2 * mark)
    _, _, i, j, spent = best
    while j + 1 < len(spans) and spent + cost(j + 1) <= allowance:  # what follows the match
        j += 1
        spent += cost(j)
    while i > 0 and spent + cost(i - 1) <= allowance:  # then what leads to it
        i -= 1
        spent += cost(i)
    head = f"{CUT_MARK} " if i > 0 else ""  # the pieces hold every word of the text
    while j >= i:  # the counts of pieces need not add up: check the whole, shorten if needed
        tail = f" {CUT_MARK}" if j < len(spans) - 1 else ""
        out = head + pieces.text[spans[i][0] : spans[j][1]] + tail
        if count(out) <= allowance:
            return out
        j -= 1
    return None
