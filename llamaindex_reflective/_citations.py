"""A tolerant parser for the citations LLMs write: `[1]`, `[1, 3]`, `[1][2]`, `Source 2`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["ParsedCitations", "parse_citations"]

_GROUP = re.compile(r"\[\s*(?:memory|source|mem)?\s*(\d+(?:\s*[,;]\s*\d+)*)\s*\]", re.IGNORECASE)
_WORD = re.compile(r"\b(?:source|memory)\s+(\d+)\b", re.IGNORECASE)
_NO_CITE = re.compile(r"\[\s*NO[_ ]CITE\s*\]", re.IGNORECASE)


@dataclass
class ParsedCitations:
    """Citations found in an answer.

    Attributes:
        numbers: Cited numbers, in order of first appearance, without repeats.
        found: Whether the answer cites at all (`[NO_CITE]` counts as citing nothing).
    """

    numbers: list[int] = field(default_factory=list)
    found: bool = False


def parse_citations(answer: str) -> ParsedCitations:
    """Find the cited numbers in an answer.

    Example:
        >>> parse_citations("Pixel [1][3], and see Source 2.").numbers
        [1, 3, 2]
        >>> parse_citations("No idea. [NO_CITE]")
        ParsedCitations(numbers=[], found=True)
    """
    numbers: list[int] = []
    for m in _GROUP.finditer(answer):
        numbers.extend(int(x) for x in re.split(r"[,;]", m.group(1)))
    numbers.extend(int(m.group(1)) for m in _WORD.finditer(answer))
    unique = list(dict.fromkeys(numbers))
    return ParsedCitations(unique, bool(unique) or bool(_NO_CITE.search(answer)))
