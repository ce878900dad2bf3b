"""SeCom's LLM segmenter: numbered exchanges in, JSON lines between `<segmentation>` tags out.

The session is cut into units (exchanges by default, see
`reflective_memory.segment.base.unit_spans`), numbered
from 0 and shown to the LLM as `[Exchange k]` blocks. The answer is parsed leniently
(`parse_segmentation`): the tagged block is located (a missing closing tag, code fences and stray
prose are tolerated), every `{...}` object is read (single quotes, trailing commas and the usual
key spellings are accepted) and the first/last exchange numbers are recovered. The result is then
validated and repaired: numbers out of range are clipped, a wholly one-based answer is shifted,
overlaps are resolved by segment starts, gaps join the preceding segment, and a tail the answer
never reached is handed to the offline segmenter. When nothing usable comes back (or the LLM
raises), the window falls back to the offline segmenter. No exchange is ever dropped.

Sessions longer than `window` units are segmented in windows overlapping by `overlap` units, one
LLM call per window; in each overlap the cut points left of its middle come from the earlier
window and the rest from the later one.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reflective_memory.errors import ConfigError, LLMError
from reflective_memory.framing import defuse, frame_lines, speaker_label
from reflective_memory.llm import LLMClient, as_llm
from reflective_memory.segment.base import (
    UNITS,
    Segmenter,
    boundaries_to_spans,
    check_spans,
    unit_spans,
    units_to_turn_spans,
)
from reflective_memory.types import Turn, Usage

if TYPE_CHECKING:
    from reflective_memory.segment.rubric import Rubric

__all__ = [
    "LLMSegmenter",
    "SegmentationOutcome",
    "ParsedSegmentation",
    "parse_segmentation",
    "build_segmentation_prompt",
    "format_exchanges",
]

logger = logging.getLogger(__name__)

_INSTRUCTIONS = """\
You split a conversation into topical segments.

A segment is a run of consecutive exchanges about one topic. Begin a new segment where the
conversation moves to a different subject; keep follow-up questions, clarifications and answers
about the same subject together. The exchanges are numbered from 0 to {last}, each block
starting with "[Exchange N]:" at the start of a line. Within a block every turn starts a line
with its speaker in brackets; the further lines of a turn are indented and belong to it.

Answer with one JSON object per line, one line per segment, in order, wrapped in
<segmentation> and </segmentation>. Each object has these keys:
  "segment_id": 0, 1, 2, ... in order
  "start_exchange_number": number of the first exchange in the segment
  "end_exchange_number": number of the last exchange in the segment
  "num_exchanges": end_exchange_number - start_exchange_number + 1

For a conversation of 9 exchanges (0 to 8) the answer could be:
<segmentation>
{{"segment_id": 0, "start_exchange_number": 0, "end_exchange_number": 4, "num_exchanges": 5}}
{{"segment_id": 1, "start_exchange_number": 5, "end_exchange_number": 8, "num_exchanges": 4}}
</segmentation>

Rules: every exchange from 0 to {last} belongs to exactly one segment; segments do not overlap;
the num_exchanges values add up to {count}. Write nothing after </segmentation>.
"""

_TAG_RE = re.compile(r"<segmentation>(.*?)(?:</segmentation>|$)", re.DOTALL | re.IGNORECASE)
_OBJ_RE = re.compile(r"\{[^{}]*\}")
_RANGE_RE = re.compile(r"(\d+)\s*(?:-|–|to|through)\s*(\d+)")
_START_KEYS = ("start_exchange_number", "start_exchange", "start", "first", "from", "begin")
_END_KEYS = ("end_exchange_number", "end_exchange", "end", "last", "to", "stop")
_COUNT_KEYS = ("num_exchanges", "count", "n_exchanges", "length")
_EXCHANGE_MARK = re.compile(r"\[\s*exchange\b[^\]\n]*\]?", re.IGNORECASE)


def format_exchanges(
    turns: Sequence[Turn], units: Sequence[tuple[int, int]], offset: int = 0, max_chars: int = 2000
) -> str:
    """Render units as numbered blocks: `[Exchange k]:` then one `[role]: text` line per turn.

    Turn text is framed (`reflective_memory.framing`): its further lines are indented and any
    `[Exchange ...]` or `<segmentation>` marker in it is made inert, so a turn cannot open a
    block or close the answer.
    """
    blocks = []
    for k, (a, b) in enumerate(units):
        lines = [f"[Exchange {k + offset}]:"]
        for t in turns[a:b]:
            text = t.text if len(t.text) <= max_chars else t.text[:max_chars] + " ..."
            text = frame_lines(defuse(text, [_EXCHANGE_MARK], ["segmentation"]))
            lines.append(f"[{speaker_label(t.role)}]: {text}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def build_segmentation_prompt(data: str, count: int, rubric: Rubric | None = None) -> str:
    """The full segmentation prompt for `count` numbered exchanges rendered in `data`."""
    parts = []
    if rubric is not None and not rubric.is_empty():
        parts.append(rubric.to_prompt())
    parts.append(_INSTRUCTIONS.format(last=count - 1, count=count))
    parts.append("# Conversation\n" + data)
    parts.append("# Your segmentation")
    return "\n\n".join(parts)


@dataclass
class ParsedSegmentation:
    """What `parse_segmentation` recovered from one answer.

    Attributes:
        starts: Unit indices (within the window) where a segment starts, repaired and sorted.
        covered: One past the last unit the answer accounted for (a tail beyond it was never
            segmented by the LLM).
        status: `valid` (exact tiling with correct counts), `repaired` or `unusable`.
        problems: What had to be repaired.
    """

    starts: list[int]
    covered: int
    status: str
    problems: list[str] = field(default_factory=list)


def _to_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = re.search(r"-?\d+", value)
        return int(m.group()) if m else None
    return None


def _load_obj(raw: str) -> tuple[dict[str, Any] | None, bool]:
    """Read one `{...}` object; the flag tells whether lenient repairs were needed."""
    for strict, candidate in ((True, raw), (False, re.sub(r",\s*}", "}", raw.replace("'", '"')))):
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj, not strict
    # Last resort: key: number pairs with any quoting.
    pairs = re.findall(r"[\"']?(\w+)[\"']?\s*:\s*[\"']?(-?\d+)", raw)
    return ({k: int(v) for k, v in pairs} if pairs else None), True


def _pick(obj: dict[str, Any], keys: Sequence[str]) -> int | None:
    lowered = {str(k).lower(): v for k, v in obj.items()}
    for key in keys:
        if key in lowered:
            val = _to_int(lowered[key])
            if val is not None:
                return val
    return None


def parse_segmentation(text: str, n: int) -> ParsedSegmentation:
    r"""Parse and repair an LLM segmentation answer for `n` units numbered from 0.

    Args:
        text: The raw answer.
        n: Number of units shown.

    Returns:
        The repaired cut points; `status == "unusable"` when no segment could be read.

    Example:
        >>> out = parse_segmentation('<segmentation>{"start_exchange_number": 0, '
        ...     '"end_exchange_number": 1, "num_exchanges": 2}\\n{"start_exchange_number": 2, '
        ...     '"end_exchange_number": 3, "num_exchanges": 2}</segmentation>', 4)
        >>> out.starts, out.status
        ([0, 2], 'valid')
    """
    problems: list[str] = []
    if not isinstance(text, str) or not text.strip() or n <= 0:
        return ParsedSegmentation([0], 0, "unusable", ["empty answer"])
    body = text
    m = _TAG_RE.search(text)
    if m is None:
        problems.append("no <segmentation> tag")
    else:
        body = m.group(1)
        if not re.search(r"</segmentation>", text, re.IGNORECASE):
            problems.append("no closing tag")
    body = re.sub(r"```[a-zA-Z]*", "", body)
    raw_segments: list[tuple[int, int | None, int | None]] = []
    for raw in _OBJ_RE.findall(body):
        obj, lenient = _load_obj(raw)
        if lenient:
            problems.append("malformed JSON read leniently")
        if obj is None:
            problems.append(f"unreadable object {raw[:40]!r}")
            continue
        start, end, count = _pick(obj, _START_KEYS), _pick(obj, _END_KEYS), _pick(obj, _COUNT_KEYS)
        if start is None and end is None:
            problems.append(f"object without exchange numbers {raw[:40]!r}")
            continue
        if start is None:
            assert end is not None
            start = end - count + 1 if count is not None and count > 0 else None
        if start is None:
            raw_segments.append((-1, end, count))
        else:
            raw_segments.append((start, end, count))
    if not raw_segments:
        for a, b in _RANGE_RE.findall(body):
            raw_segments.append((int(a), int(b), None))
        if raw_segments:
            problems.append("ranges read from prose")
    if not raw_segments:
        return ParsedSegmentation([0], 0, "unusable", problems or ["no segments found"])

    # Fill in missing pieces and detect one-based numbering.
    segs: list[tuple[int, int]] = []
    prev_end = -1
    for start, end, count in raw_segments:
        if start < 0:
            start = prev_end + 1
        if end is None:
            end = start + count - 1 if count is not None and count > 0 else start
            problems.append("missing end_exchange_number")
        elif count is not None and count != end - start + 1:
            problems.append("num_exchanges disagrees with the range")
        if end < start:
            start, end = end, start
            problems.append("start after end")
        segs.append((start, end))
        prev_end = end
    lo = min(s for s, _ in segs)
    hi = max(e for _, e in segs)
    if lo >= 1 and hi == n:
        segs = [(s - 1, e - 1) for s, e in segs]
        problems.append("one-based numbering shifted")
        hi -= 1
    if hi >= n or lo < 0:
        problems.append("exchange numbers out of range clipped")
    segs = [(min(max(s, 0), n - 1), min(max(e, 0), n - 1)) for s, e in segs]
    segs.sort()

    # Coverage, order and overlap checks on the clipped segments.
    expected = 0
    exact = True
    for s, e in segs:
        if s != expected:
            exact = False
            problems.append("gap" if s > expected else "overlap")
        expected = max(expected, e + 1)
    covered = max(e for _, e in segs) + 1
    if covered < n:
        exact = False
        problems.append(f"answer stops at exchange {covered - 1} of {n - 1}")
    starts = sorted({0, *(s for s, _ in segs if 0 < s < covered)})
    # An end that is not followed by a start still marks a cut.
    starts = sorted(set(starts) | {e + 1 for _, e in segs if e + 1 < covered})
    status = "valid" if exact and not problems else "repaired"
    return ParsedSegmentation(starts, covered, status, _dedupe(problems))


def _dedupe(items: list[str]) -> list[str]:
    seen: list[str] = []
    for x in items:
        if x not in seen:
            seen.append(x)
    return seen


@dataclass
class SegmentationOutcome:
    """A segmentation with its provenance.

    Attributes:
        spans: Half-open turn spans tiling the session.
        unit_starts: Unit indices where segments start.
        windows: Per window: `(start_unit, end_unit, status)` where status is `valid`,
            `repaired`, `fallback` (unusable output or LLM error) or `offline` (no LLM call).
        problems: Repairs and failures, for logging.
        usage: LLM cost.
    """

    spans: list[tuple[int, int]]
    unit_starts: list[int]
    windows: list[tuple[int, int, str]]
    problems: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


class LLMSegmenter:
    r"""Topical segmentation by an LLM following SeCom's prompt protocol.

    Args:
        llm: Any LLM the core accepts (callable, object with `complete`, `LLMClient`).
        fallback: Offline segmenter for unusable answers and unreached tails; `None` builds an
            `EmbeddingSegmenter` with `embedder` (MiniLM by default) on first need.
        embedder: Embedder for the default fallback.
        rubric: A learned `Rubric` put in front of every prompt (`None`: zero-shot).
        unit: `exchange` (default) or `turn`.
        window: Most units per LLM call.
        overlap: Units shared by consecutive windows (must be < window / 2).
        max_chars: Each turn is cut to this many characters in the prompt.

    Example:
        >>> seg = LLMSegmenter(lambda p: '<segmentation>{"start_exchange_number": 0, '
        ...     '"end_exchange_number": 0}\\n{"start_exchange_number": 1, '
        ...     '"end_exchange_number": 1}</segmentation>', unit="turn")
        >>> from reflective_memory.types import Turn
        >>> seg.segment([Turn("u", "s", "user", t, f"s:{i}", i) for i, t in enumerate("ab")])
        [(0, 1), (1, 2)]
    """

    def __init__(
        self,
        llm: Any,
        *,
        fallback: Segmenter | None = None,
        embedder: Any | None = None,
        rubric: Rubric | None = None,
        unit: str = "exchange",
        window: int = 40,
        overlap: int = 6,
        max_chars: int = 2000,
    ) -> None:
        client = llm if isinstance(llm, LLMClient) else as_llm(llm)
        if client is None:
            raise ConfigError("LLMSegmenter needs an llm; use EmbeddingSegmenter offline")
        if unit not in UNITS:
            raise ConfigError(f"unit must be one of {UNITS}, got {unit!r}")
        if window < 2:
            raise ConfigError("window must be >= 2")
        if overlap < 0 or 2 * overlap >= window:
            raise ConfigError("overlap must be >= 0 and < window / 2")
        if max_chars < 1:
            raise ConfigError("max_chars must be >= 1")
        self.client: LLMClient = client
        self._fallback = fallback
        self._embedder = embedder
        self.rubric = rubric
        self.unit = unit
        self.window = window
        self.overlap = overlap
        self.max_chars = max_chars

    @property
    def fallback(self) -> Segmenter:
        """The offline segmenter used when the LLM's answer cannot be used."""
        if self._fallback is None:
            from reflective_memory.segment.embedding import EmbeddingSegmenter

            self._fallback = EmbeddingSegmenter(self._embedder, unit=self.unit)
        return self._fallback

    def windows(self, n: int) -> list[tuple[int, int]]:
        """Unit windows `[start, end)` covering `range(n)` with the configured overlap."""
        if n <= self.window:
            return [(0, n)]
        out = []
        start = 0
        while True:
            end = min(start + self.window, n)
            out.append((start, end))
            if end == n:
                return out
            start = end - self.overlap

    def segment(self, turns: Sequence[Turn]) -> list[tuple[int, int]]:
        """See `Segmenter.segment`."""
        return self.segment_detailed(turns).spans

    def _fallback_starts(self, turns: Sequence[Turn], units: Sequence[tuple[int, int]]) -> set[int]:
        """Unit starts from the offline segmenter over the whole session (snapped to units)."""
        spans = check_spans(self.fallback.segment(turns), len(turns))
        unit_of_turn = {a: k for k, (a, _) in enumerate(units)}
        return {unit_of_turn[a] for a, _ in spans if a in unit_of_turn and a > 0}

    def segment_detailed(
        self, turns: Sequence[Turn], usage: Usage | None = None
    ) -> SegmentationOutcome:
        """Segment and report how each window was handled.

        Args:
            turns: The session's turns.
            usage: An operation-level `Usage` to add the LLM calls to.
        """
        turns = list(turns)
        own = Usage()
        if not turns:
            return SegmentationOutcome([], [], [], usage=own)
        units = unit_spans(turns, self.unit)
        n = len(units)
        if n == 1:
            return SegmentationOutcome([(0, len(turns))], [0], [(0, 1, "offline")], usage=own)
        fallback_cache: list[set[int]] = []

        def fallback_starts() -> set[int]:
            if not fallback_cache:
                fallback_cache.append(self._fallback_starts(turns, units))
            return fallback_cache[0]

        wins = self.windows(n)
        per_window: list[tuple[int, int, set[int]]] = []
        statuses: list[tuple[int, int, str]] = []
        problems: list[str] = []
        for ws, we in wins:
            prompt = build_segmentation_prompt(
                format_exchanges(turns, units[ws:we], 0, self.max_chars), we - ws, self.rubric
            )
            called_ok = True
            try:
                answer = self.client.complete(prompt, usage=own)
            except LLMError as exc:  # already counted as a failure by the client
                problems.append(f"window {ws}-{we}: LLM error {exc}")
                answer, called_ok = "", False
            parsed = parse_segmentation(answer, we - ws)
            if parsed.status == "unusable":
                own.failures += int(called_ok)
                problems.append(f"window {ws}-{we}: unusable answer ({'; '.join(parsed.problems)})")
                starts = {s for s in fallback_starts() if ws < s < we}
                statuses.append((ws, we, "fallback"))
            else:
                starts = {ws + s for s in parsed.starts if s > 0}
                if parsed.covered < we - ws:
                    tail = ws + parsed.covered
                    starts |= {s for s in fallback_starts() if tail <= s < we}
                    if tail > ws:
                        starts.add(tail)
                if parsed.problems:
                    problems.append(f"window {ws}-{we}: {'; '.join(parsed.problems)}")
                statuses.append((ws, we, parsed.status))
            per_window.append((ws, we, starts))
        merged = self._stitch(per_window)
        unit_segs = boundaries_to_spans(sorted(merged), n)
        spans = check_spans(units_to_turn_spans(unit_segs, units), len(turns))
        if problems:
            logger.info("LLM segmentation repaired: %s", " | ".join(problems))
        if usage is not None:
            usage.add(own)
        return SegmentationOutcome(spans, [a for a, _ in unit_segs], statuses, problems, own)

    @staticmethod
    def _stitch(per_window: Sequence[tuple[int, int, set[int]]]) -> set[int]:
        """Join window cut points: in each overlap, the earlier window owns the left half.

        Windows that do not overlap meet at a forced cut.
        """
        out: set[int] = set()
        bounds = [per_window[0][0]]
        for (_, prev_end, _), (next_start, _, _) in zip(per_window, per_window[1:], strict=False):
            if prev_end <= next_start:
                bounds.append(next_start)
                out.add(next_start)
            else:
                bounds.append((next_start + prev_end + 1) // 2)
        bounds.append(per_window[-1][1])
        for (_, _, starts), lo, hi in zip(per_window, bounds, bounds[1:], strict=False):
            out |= {s for s in starts if lo <= s < hi}
        return out

    def __repr__(self) -> str:
        return (
            f"LLMSegmenter(unit={self.unit!r}, window={self.window}, overlap={self.overlap}, "
            f"rubric={'yes' if self.rubric is not None and not self.rubric.is_empty() else 'no'})"
        )
