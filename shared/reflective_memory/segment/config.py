"""`SegmentConfig`: how SeCom segment units are cut (owned by the segmenters)."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.settings import check_choice, check_int

__all__ = ["SegmentConfig", "SEGMENTERS", "SEGMENT_UNITS"]

#: `SegmentConfig.kind` values.
SEGMENTERS = ("auto", "embedding", "llm", "texttiling", "fixed")
#: What segments are made of.
SEGMENT_UNITS = ("exchange", "turn")


@dataclass(frozen=True)
class SegmentConfig:
    """How `segment` units are cut from a finished session.

    Attributes:
        kind: `auto` (the LLM segmenter when an LLM is configured, else `embedding`),
            `embedding` (learned offline segmenter over MiniLM features), `llm` (SeCom's LLM
            segmenter; falls back to `embedding` per window when the answer is unusable),
            `texttiling` (embedding TextTiling) or `fixed` (windows of `window` turns).
        unit: `exchange` (a user turn with the replies that follow; a question is never split
            from its answer) or `turn`.
        window: Turns per segment for the `fixed` segmenter.
        llm_window: Most exchanges per LLM segmentation call; longer sessions are cut into
            overlapping windows.
        llm_overlap: Exchanges shared by consecutive LLM windows.
        rubric: Path of a rubric JSON learned by `learn_rubric`, put in front of LLM
            segmentation prompts (`None`: zero-shot).
    """

    kind: str = "auto"
    unit: str = "exchange"
    window: int = 6
    llm_window: int = 40
    llm_overlap: int = 6
    rubric: str | None = None

    def __post_init__(self) -> None:
        check_choice("segment.kind", self.kind, SEGMENTERS)
        check_choice("segment.unit", self.unit, SEGMENT_UNITS)
        check_int("segment.window", self.window)
        check_int("segment.llm_window", self.llm_window)
        check_int("segment.llm_overlap", self.llm_overlap, 0)
        if not 2 * self.llm_overlap < self.llm_window:
            raise ConfigError("segment.llm_overlap must be < segment.llm_window / 2")
        if self.rubric is not None and not isinstance(self.rubric, str):
            raise ConfigError(f"segment.rubric must be None or a path, got {self.rubric!r}")
