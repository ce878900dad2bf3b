"""Query-focused excerpts: the part of an over-long turn that the budget left can hold.

A long answer (a stat block, a list of refineries and their processes) is often the clearest
match for a question and too long for a small budget. Rather than dropping it, the reader gets
the contiguous run of its sentences that holds most of the question's words, each word weighted
by how rare it is inside the turn, with `…` where the text is cut. The words are the turn's
own; nothing is rewritten or summarised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection

from reflective_memory.text import lexical_tokens

__all__ = ["CUT_MARK", "excerpt"]

#: Put where an excerpt cuts the turn's text.
CUT_MARK = "…"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_LONG_LINE_WORDS = 40


def _pieces(text: str, allowance: int) -> list[tuple[int, int]]:
    """Character spans of the text's lines, long lines cut into sentences and word runs.

    No span holds more than `allowance` words, so every piece fits the budget on its own.
    """
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        parts = [(line.start(), line.end())]
        if len(line.group().split()) > _LONG_LINE_WORDS:
            at = [line.start(), *(line.start() + m.end() for m in _SENTENCE_END.finditer(line[0]))]
            parts = list(zip(at, [*at[1:], line.end()], strict=True))
        for a, b in parts:
            words = list(re.finditer(r"\S+", text[a:b]))
            step = max(1, min(len(words), allowance))
            for i in range(0, len(words), step):
                chunk = words[i : i + step]
                spans.append((a + chunk[0].start(), a + chunk[-1].end()))
    return spans


def excerpt(
    text: str,
    query_terms: Collection[str],
    allowance: int,
    count: Callable[[str], int],
) -> str | None:
    r"""The run of a text's sentences that best covers a question within `allowance` tokens.

    Args:
        text: The turn's text.
        query_terms: The question's `lexical_tokens`.
        allowance: Most tokens (by `count`) the excerpt may cost, cut marks included.
        count: Token counter of the budget.

    Returns:
        The excerpt, `…` before and after where text is cut; the text's opening when no piece
        holds a word of the question; None when not even one piece fits.

    Example:
        >>> text = "Intro line.\nThe temple has traps.\n* Mummies (4)\n* Skeletons (6)"
        >>> words = lambda s: len(s.split())
        >>> excerpt(text, lexical_tokens("How many mummies?"), 5, words)
        '… * Mummies (4) …'
        >>> excerpt(text, lexical_tokens("How many mummies?"), 9, words)
        '… * Mummies (4)\n* Skeletons (6)'
    """
    spans = _pieces(text, allowance)
    if not spans:
        return None
    wanted = set(query_terms)
    terms = [set(lexical_tokens(text[a:b])) & wanted for a, b in spans]
    df: dict[str, int] = {}
    for ts in terms:
        for t in ts:
            df[t] = df.get(t, 0) + 1
    weight = {t: math.log(1.0 + len(spans) / n) for t, n in df.items()}
    costs = [count(text[a:b]) for a, b in spans]
    mark = count(CUT_MARK)
    best: tuple[float, int, int, int] | None = None  # (score, -cost, i, j): tightest wins ties
    for i in range(len(spans)):
        seen: set[str] = set()
        score, spent = 0.0, 0
        for j in range(i, len(spans)):
            spent += costs[j]
            if spent + 2 * mark > allowance:
                break
            new = terms[j] - seen
            seen |= new
            score += sum(weight[t] for t in new)
            if best is None or (score, -spent) > best[:2]:
                best = (score, -spent, i, j)
    if best is None:
        return None
    score, _, i, j = best
    if score == 0:  # nothing of the question in it: the turn's opening
        i = j = 0
    spent = sum(costs[i : j + 1]) + 2 * mark
    while j + 1 < len(spans) and spent + costs[j + 1] <= allowance:  # what follows the match
        j += 1
        spent += costs[j]
    while i > 0 and spent + costs[i - 1] <= allowance:  # then what leads to it
        i -= 1
        spent += costs[i]
    return _render(text, spans, i, j, allowance, count)


def _render(
    text: str,
    spans: list[tuple[int, int]],
    i: int,
    j: int,
    allowance: int,
    count: Callable[[str], int],
) -> str | None:
    """Spans `i..j` with cut marks, shortened from the end while they cost too much."""
    while j >= i:
        body = text[spans[i][0] : spans[j][1]]
        head = f"{CUT_MARK} " if text[: spans[i][0]].strip() else ""
        tail = f" {CUT_MARK}" if text[spans[j][1] :].strip() else ""
        out = head + body + tail
        if count(out) <= allowance:
            return out
        j -= 1
    return None
