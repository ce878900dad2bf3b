"""SeCom segment memory: cut a session into topical segments.

- `base`: the `Segmenter` protocol, span checks and the fixed-window segmenter.
- `embedding`: offline segmenters (TextTiling and the trained boundary scorer).
- `llm`: SeCom's LLM segmenter (numbered exchanges, JSON lines, repair and fallback).
- `rubric` / `rubric_learning`: SeCom's reflection, a rubric learned from the worst dialogues.
- `metrics`: Pk, WindowDiff, boundary F1 and SeCom's Score.
- `factory`: the segmenter a `MemoryConfig` asks for.
- `train`: fits the offline boundary scorer's weights on annotated dialogues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.segment.base import (
        UNITS,
        FixedWindowSegmenter,
        Segmenter,
        boundaries_to_spans,
        check_spans,
        unit_spans,
        units_to_turn_spans,
    )
    from reflective_memory.segment.config import SegmentConfig
    from reflective_memory.segment.embedding import (
        EmbeddingSegmenter,
        TextTilingSegmenter,
        make_segmenter,
    )
    from reflective_memory.segment.factory import segmenter_from_config
    from reflective_memory.segment.llm import LLMSegmenter, SegmentationOutcome, parse_segmentation
    from reflective_memory.segment.rubric import LabeledDialogue, Rubric
    from reflective_memory.segment.rubric_learning import learn_rubric

_EXPORTS = {
    "UNITS": "reflective_memory.segment.base",
    "FixedWindowSegmenter": "reflective_memory.segment.base",
    "Segmenter": "reflective_memory.segment.base",
    "boundaries_to_spans": "reflective_memory.segment.base",
    "check_spans": "reflective_memory.segment.base",
    "unit_spans": "reflective_memory.segment.base",
    "units_to_turn_spans": "reflective_memory.segment.base",
    "EmbeddingSegmenter": "reflective_memory.segment.embedding",
    "TextTilingSegmenter": "reflective_memory.segment.embedding",
    "make_segmenter": "reflective_memory.segment.embedding",
    "segmenter_from_config": "reflective_memory.segment.factory",
    "LLMSegmenter": "reflective_memory.segment.llm",
    "SegmentationOutcome": "reflective_memory.segment.llm",
    "parse_segmentation": "reflective_memory.segment.llm",
    "LabeledDialogue": "reflective_memory.segment.rubric",
    "Rubric": "reflective_memory.segment.rubric",
    "learn_rubric": "reflective_memory.segment.rubric_learning",
    "SegmentConfig": "reflective_memory.segment.config",
}

__all__ = [
    "UNITS",
    "FixedWindowSegmenter",
    "Segmenter",
    "boundaries_to_spans",
    "check_spans",
    "unit_spans",
    "units_to_turn_spans",
    "EmbeddingSegmenter",
    "TextTilingSegmenter",
    "make_segmenter",
    "segmenter_from_config",
    "LLMSegmenter",
    "SegmentationOutcome",
    "parse_segmentation",
    "LabeledDialogue",
    "Rubric",
    "learn_rubric",
    "SegmentConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
