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
from dataclasses import dataclass
from functools import cached_property, lru_cache

from reflective_memory.text import STOPWORDS, stem

__all__ = ["CUT_MARK", "Pieces", "excerpt"]

#: Put where an excerpt cuts the turn's text.
CUT_MARK = "…"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
#: Lines longer than this (in words) are cut at sentence ends, and sentences into runs of it.
_PIECE_WORDS = 40


@dataclass(frozen=True)
class Pieces:
    """A text cut into lines, sentences of long lines, and word runs of long sentences.

    Attributes:
        text: The text.
        spans: Character spans of the pieces, in order.
        costs: Each piece's cost by the token counter it was made with.
    """

    text: str
    spans: tuple[tuple[int, int], ...]
    costs: tuple[int, ...]

    @cached_property
    def lower(self) -> str:
        """The text in lower case (same length: offsets of `spans` hold in it)."""
        low = self.text.lower()
        return low if len(low) == len(self.text) else self.text

    @classmethod
    def of(cls, text: str, count: Callable[[str], int]) -> Pieces:
        """Cut `text` into pieces and count each with `count`."""
        spans: list[tuple[int, int]] = []
        for line in re.finditer(r"[^\n]+", text):
            parts = [(line.start(), line.end())]
            if len(line[0].split()) > _PIECE_WORDS:
                ends = (line.start() + m.end() for m in _SENTENCE_END.finditer(line[0]))
                at = [line.start(), *ends]
                parts = list(zip(at, [*at[1:], line.end()], strict=True))
            for a, b in parts:
                seg = text[a:b]
                if len(seg.split()) <= _PIECE_WORDS:  # the common case: no word runs needed
                    a, b = a + len(seg) - len(seg.lstrip()), b - len(seg) + len(seg.rstrip())
                    if a < b:
                        spans.append((a, b))
                    continue
                words = list(re.finditer(r"\S+", seg))
                for i in range(0, len(words), _PIECE_WORDS):
                    run = words[i : i + _PIECE_WORDS]
                    spans.append((a + run[0].start(), a + run[-1].end()))
        return cls(text, tuple(spans), tuple(count(text[a:b]) for a, b in spans))

    def terms(self, query_terms: Collection[str]) -> list[set[str]]:
        """Which of the question's terms each piece holds (as `lexical_tokens` would find).

        One pass of a pattern of the terms over the text: only its matches are stemmed.
        """
        found: list[set[str]] = [set() for _ in self.spans]
        if not query_terms:
            return found
        wanted = frozenset(query_terms)
        starts = [a for a, _ in self.spans]
        for m in _matcher(wanted).finditer(self.lower):
            word = m[0]
            if word in STOPWORDS:
                continue
            term = stem(word)
            if term not in wanted:
                continue
            i = bisect_right(starts, m.start()) - 1
            if i >= 0 and m.start() < self.spans[i][1]:
                found[i].add(term)
        return found


@lru_cache(maxsize=256)
def _matcher(terms: frozenset[str]) -> re.Pattern[str]:
    """Words that may stem to one of `terms`: a term, or `y` to `ies`, plus any ending."""
    forms = set(terms) | {t[:-1] + "ies" for t in terms if t.endswith("y")}
    alts = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    return re.compile(rf"(?<![^\W_])(?:{alts})[^\W_]*")


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
    spans, costs = pieces.spans, pieces.costs
    if not spans:
        return None
    terms = pieces.terms(query_terms)
    df: dict[str, int] = {}
    for ts in terms:
        for t in ts:
            df[t] = df.get(t, 0) + 1
    weight = {t: math.log(1.0 + len(spans) / n) for t, n in df.items()}
    mark = count(CUT_MARK)
    # (score, -cost, i, j, cost): the tightest run wins a tie; without a word of the question
    # in reach, the opening
    best: tuple[float, int, int, int, int] | None = None
    for i in range(len(spans) if df else 1):
        seen: set[str] = set()
        score, spent = 0.0, 2 * mark
        for j in range(i, len(spans)):
            spent += costs[j]
            if spent > allowance:
                break
            new = terms[j] - seen
            seen |= new
            score += sum(weight[t] for t in new)
            key = (score, -spent if score > 0 else 0)
            if best is None or key > best[:2]:
                best = (*key, i, j, spent)
    if best is None:
        return None
    _, _, i, j, spent = best
    while j + 1 < len(spans) and spent + costs[j + 1] <= allowance:  # what follows the match
        j += 1
        spent += costs[j]
    while i > 0 and spent + costs[i - 1] <= allowance:  # then what leads to it
        i -= 1
        spent += costs[i]
    while j >= i:  # the counts of pieces need not add up: check the whole, shorten if needed
        a, b = spans[i][0], spans[j][1]
        head = f"{CUT_MARK} " if pieces.text[:a].strip() else ""
        tail = f" {CUT_MARK}" if pieces.text[b:].strip() else ""
        out = head + pieces.text[a:b] + tail
        if count(out) <= allowance:
            return out
        j -= 1
    return None
