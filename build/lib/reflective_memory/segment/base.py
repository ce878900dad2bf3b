"""Conversation segmenters: the protocol the engine uses and the fixed-window default.

A segmenter cuts a session's turns into contiguous, ordered, non-overlapping spans that cover
every turn. Spans are half-open `(start, end)` turn positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from reflective_memory.errors import InvalidInputError
from reflective_memory.types import Turn

__all__ = [
    "Segmenter",
    "FixedWindowSegmenter",
    "check_spans",
    "unit_spans",
    "units_to_turn_spans",
    "boundaries_to_spans",
    "UNITS",
]

#: How a session is cut into the units a segmenter places boundaries between: `turn` (every
#: utterance) or `exchange` (a user turn together with the replies that follow it).
UNITS = ("turn", "exchange")


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


def unit_spans(turns: Sequence[Turn], unit: str = "exchange") -> list[tuple[int, int]]:
    """Group turns into the units a segmenter cuts between.

    With `unit="exchange"`, a new unit starts at every `user` turn that follows a turn of
    another role, so a question and the answers after it stay together; turns before the first
    user turn form their own unit. If no turn has the role `user`, every turn is a unit. With
    `unit="turn"`, every turn is a unit.

    Args:
        turns: The session's turns in order.
        unit: `"exchange"` or `"turn"`.

    Returns:
        Half-open turn spans of the units, tiling the session.

    Example:
        >>> from reflective_memory.types import Turn
        >>> roles = ["user", "assistant", "user", "user", "assistant", "assistant"]
        >>> ts = [Turn("u", "s", r, "x", f"s:{i}", i) for i, r in enumerate(roles)]
        >>> unit_spans(ts)
        [(0, 2), (2, 6)]
    """
    if unit not in UNITS:
        raise InvalidInputError(f"unit must be one of {UNITS}, got {unit!r}")
    n = len(turns)
    if unit == "turn" or not any(t.role == "user" for t in turns):
        return [(i, i + 1) for i in range(n)]
    starts = [0] + [
        i for i in range(1, n) if turns[i].role == "user" and turns[i - 1].role != "user"
    ]
    return [(a, b) for a, b in zip(starts, starts[1:] + [n], strict=False) if b > a]


def boundaries_to_spans(starts: Sequence[int], n: int) -> list[tuple[int, int]]:
    """Spans over `n` items from the set of indices where a segment starts.

    Out-of-range and duplicate starts are ignored; 0 is always a start.

    Example:
        >>> boundaries_to_spans([3, 1, 3, 9], 5)
        [(0, 1), (1, 3), (3, 5)]
    """
    if n <= 0:
        return []
    cuts = sorted({int(s) for s in starts if 0 < int(s) < n})
    edges = [0, *cuts, n]
    return list(zip(edges[:-1], edges[1:], strict=False))


def units_to_turn_spans(
    unit_segments: Sequence[tuple[int, int]], units: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Map segments over units back to spans over turns.

    Args:
        unit_segments: Half-open spans over unit positions, tiling `range(len(units))`.
        units: The units' turn spans (from `unit_spans`).

    Returns:
        Half-open turn spans, tiling the session.
    """
    check_spans(unit_segments, len(units))
    return [(units[a][0], units[b - 1][1]) for a, b in unit_segments]
