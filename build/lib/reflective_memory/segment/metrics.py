"""Segmentation metrics: Pk, WindowDiff, boundary F1 and the combined Score.

A segmentation of `n` units is given either as half-open spans that tile `range(n)` or as a
boundary label sequence of length `n` in which `labels[i] == 1` means "a segment ends after unit
`i`" (the last unit is always 0). This is the convention of the SuperDialseg evaluation code, which
SeCom (Table 4) follows:

* Pk and WindowDiff slide a window of `k` labels over the sequence (`n - k + 1` positions). Pk
  counts positions where reference and hypothesis disagree on whether the window holds any
  boundary; WindowDiff counts positions where they hold a different number of boundaries.
* `k` defaults to half the mean reference segment length, rounded (Python `round`), at least 2,
  and at most `n`.
* Boundary F1 is the binary F1 of the boundary labels (0 when there is nothing to find and nothing
  was predicted, as scikit-learn's `zero_division=0`).
* Score = (2·F1 + (1 − Pk) + (1 − WD)) / 4.

Corpus numbers are the mean of the per-dialogue numbers.

Example:
    >>> ref = [(0, 3), (3, 6)]
    >>> hyp = [(0, 2), (2, 6)]
    >>> round(pk(ref, hyp), 3), round(window_diff(ref, hyp), 3), boundary_f1(ref, hyp)
    (0.4, 0.4, 0.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reflective_memory.errors import InvalidInputError
from reflective_memory.segment.base import check_spans

__all__ = [
    "SegmentationScores",
    "spans_to_labels",
    "labels_to_spans",
    "window_size",
    "pk",
    "window_diff",
    "boundary_f1",
    "segment_score",
    "score_dialogue",
    "evaluate_segmentations",
]

Segmentation = Sequence[tuple[int, int]] | Sequence[int]


@dataclass(frozen=True)
class SegmentationScores:
    """Segmentation quality, per dialogue or averaged over a corpus.

    Attributes:
        pk: Pk (lower is better).
        wd: WindowDiff (lower is better).
        f1: Boundary F1 (higher is better).
        score: (2·F1 + (1 − Pk) + (1 − WD)) / 4 (higher is better).
        n: Number of dialogues averaged.
    """

    pk: float
    wd: float
    f1: float
    score: float
    n: int = 1

    def as_dict(self) -> dict[str, float]:
        """Return the scores as a plain dict."""
        return {"pk": self.pk, "wd": self.wd, "f1": self.f1, "score": self.score, "n": self.n}


def spans_to_labels(spans: Sequence[tuple[int, int]], n: int | None = None) -> list[int]:
    """Turn half-open spans into boundary labels (1 = a segment ends after this unit).

    Args:
        spans: Spans tiling `range(n)` in order.
        n: Number of units; defaults to the end of the last span.

    Returns:
        `n` labels; the last one is 0.

    Raises:
        InvalidInputError: The spans do not tile `range(n)`.

    Example:
        >>> spans_to_labels([(0, 2), (2, 3), (3, 5)])
        [0, 1, 1, 0, 0]
    """
    if n is None:
        n = int(spans[-1][1]) if spans else 0
    checked = check_spans(spans, n) if n > 0 else []
    labels = [0] * n
    for _, end in checked[:-1]:
        labels[end - 1] = 1
    return labels


def labels_to_spans(labels: Sequence[int]) -> list[tuple[int, int]]:
    """Inverse of `spans_to_labels` (a 1 on the last unit is ignored).

    Example:
        >>> labels_to_spans([0, 1, 1, 0, 0])
        [(0, 2), (2, 3), (3, 5)]
    """
    n = len(labels)
    spans: list[tuple[int, int]] = []
    start = 0
    for i, lab in enumerate(labels[:-1] if n else []):
        if int(lab) == 1:
            spans.append((start, i + 1))
            start = i + 1
    if n:
        spans.append((start, n))
    return spans


def _as_labels(seg: Segmentation, n: int | None = None) -> list[int]:
    seg = list(seg)
    if not seg:
        if n:
            raise InvalidInputError("empty segmentation for a non-empty dialogue")
        return []
    first = seg[0]
    if isinstance(first, (tuple, list)):
        return spans_to_labels([(int(a), int(b)) for a, b in seg], n)  # type: ignore[misc]
    labels = [int(x) for x in seg]  # type: ignore[arg-type]
    if any(x not in (0, 1) for x in labels):
        raise InvalidInputError("boundary labels must be 0 or 1")
    if n is not None and len(labels) != n:
        raise InvalidInputError(f"expected {n} labels, got {len(labels)}")
    labels[-1] = 0
    return labels


def _pair(ref: Segmentation, hyp: Segmentation) -> tuple[list[int], list[int]]:
    r = _as_labels(ref)
    h = _as_labels(hyp, len(r))
    return r, h


def window_size(ref: Segmentation) -> int:
    """Default window `k`: half the mean reference segment length, rounded, in `[2, n]`.

    A one-unit dialogue gets `k = 1`.
    """
    r = _as_labels(ref)
    n = len(r)
    if n == 0:
        raise InvalidInputError("empty dialogue")
    k = max(2, int(round(n / (sum(r) + 1) / 2)))
    return max(1, min(k, n))


def _windows(r: list[int], h: list[int], k: int | None, weighted: bool) -> float:
    n = len(r)
    if n == 0:
        raise InvalidInputError("empty dialogue")
    if k is None:
        k = window_size(r)
    if k < 1:
        raise InvalidInputError("window k must be >= 1")
    k = min(k, n)
    errors = 0
    count = n - k + 1
    for i in range(count):
        a, b = sum(r[i : i + k]), sum(h[i : i + k])
        if weighted:
            errors += a != b
        else:
            errors += (a > 0) != (b > 0)
    return errors / count


def pk(ref: Segmentation, hyp: Segmentation, k: int | None = None) -> float:
    """Pk of `hyp` against `ref` (spans or boundary labels); see the module doc."""
    r, h = _pair(ref, hyp)
    return _windows(r, h, k, weighted=False)


def window_diff(ref: Segmentation, hyp: Segmentation, k: int | None = None) -> float:
    """WindowDiff of `hyp` against `ref` (spans or boundary labels); see the module doc."""
    r, h = _pair(ref, hyp)
    return _windows(r, h, k, weighted=True)


def boundary_f1(ref: Segmentation, hyp: Segmentation) -> float:
    """Binary F1 of the boundary labels (0 when there are no true and no predicted boundaries)."""
    r, h = _pair(ref, hyp)
    tp = sum(1 for a, b in zip(r, h, strict=False) if a and b)
    fp = sum(1 for a, b in zip(r, h, strict=False) if b and not a)
    fn = sum(1 for a, b in zip(r, h, strict=False) if a and not b)
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def segment_score(pk_value: float, wd_value: float, f1_value: float) -> float:
    """Score = (2·F1 + (1 − Pk) + (1 − WD)) / 4."""
    return (2 * f1_value + (1 - pk_value) + (1 - wd_value)) / 4


def score_dialogue(
    ref: Segmentation, hyp: Segmentation, k: int | None = None
) -> SegmentationScores:
    """All four numbers for one dialogue.

    Args:
        ref: Reference segmentation (spans or labels).
        hyp: Predicted segmentation of the same units.
        k: Window size; `None` uses `window_size(ref)`.
    """
    r, h = _pair(ref, hyp)
    if k is None:
        k = window_size(r)
    p = _windows(r, h, k, weighted=False)
    w = _windows(r, h, k, weighted=True)
    f = boundary_f1(r, h)
    return SegmentationScores(pk=p, wd=w, f1=f, score=segment_score(p, w, f))


def evaluate_segmentations(
    pairs: Iterable[tuple[Segmentation, Segmentation]], k: int | None = None
) -> SegmentationScores:
    """Average the per-dialogue scores of `(reference, hypothesis)` pairs.

    Raises:
        InvalidInputError: No pairs were given.
    """
    rows = [score_dialogue(r, h, k) for r, h in pairs]
    if not rows:
        raise InvalidInputError("no dialogues to evaluate")
    m = len(rows)
    p = sum(x.pk for x in rows) / m
    w = sum(x.wd for x in rows) / m
    f = sum(x.f1 for x in rows) / m
    return SegmentationScores(pk=p, wd=w, f1=f, score=sum(x.score for x in rows) / m, n=m)
