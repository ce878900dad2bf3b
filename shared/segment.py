"""Conversation segmenters: the protocol the engine uses and the fixed-window default.

A segmenter cuts a session's turns into contiguous, ordered, non-overlapping spans that cover
every turn. Spans are half-open `(start, end)` turn positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .errors import InvalidInputError
from .types import Turn

__all__ = ["Segmenter", "FixedWindowSegmenter", "check_spans"]


@runtime_checkable
class Segmenter(Protocol):
    """Cuts one session into topical segments."""

    def segment(self, turns: Sequence[Turn]) -> list[tuple[int, int]]:
        """Return half-open `(start, end)` spans over `turns`, in order, covering all of them."""
        ...


def check_spans(spans: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Validate that `spans` tile `range(n)` exactly; return them as a list of int pairs.

    Args:
        spans: Half-open spans.
        n: Number of turns.

    Raises:
        InvalidInputError: The spans leave a gap, overlap, are out of order or empty.
    """
    out: list[tuple[int, int]] = []
    expected = 0
    for start, end in spans:
        start, end = int(start), int(end)
        if start != expected or end <= start:
            raise InvalidInputError(
                f"segment spans must tile 0..{n} in order without gaps: got {list(spans)}"
            )
        out.append((start, end))
        expected = end
    if expected != n:
        raise InvalidInputError(f"segment spans cover 0..{expected}, expected 0..{n}")
    return out


class FixedWindowSegmenter:
    """Cuts a session into windows of `window` turns (the last one may be shorter).

    Args:
        window: Turns per segment.

    Example:
        >>> FixedWindowSegmenter(window=2).segment_count(5)
        [(0, 2), (2, 4), (4, 5)]
    """

    def __init__(self, window: int = 6) -> None:
        if window < 1:
            raise InvalidInputError("window must be >= 1")
        self.window = window

    def segment_count(self, n: int) -> list[tuple[int, int]]:
        """Spans for `n` turns."""
        return [(i, min(i + self.window, n)) for i in range(0, n, self.window)]

    def segment(self, turns: Sequence[Turn]) -> list[tuple[int, int]]:
        """See `Segmenter.segment`."""
        return self.segment_count(len(turns))
