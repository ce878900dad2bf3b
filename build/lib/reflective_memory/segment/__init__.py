"""SeCom segment memory: cut a session into topical segments.

- `base`: the `Segmenter` protocol, span checks and the fixed-window segmenter.
- `embedding`: offline segmenters (TextTiling and the trained boundary scorer).
- `llm`: SeCom's LLM segmenter (numbered exchanges, JSON lines, repair and fallback).
- `rubric` / `rubric_learning`: SeCom's reflection, a rubric learned from the worst dialogues.
- `metrics`: Pk, WindowDiff, boundary F1 and SeCom's Score.
- `factory`: the segmenter a `MemoryConfig` asks for.
- `train`: fits the offline boundary scorer's weights on annotated dialogues.
"""

from reflective_memory.segment.base import (
    UNITS,
    FixedWindowSegmenter,
    Segmenter,
    boundaries_to_spans,
    check_spans,
    unit_spans,
    units_to_turn_spans,
)
from reflective_memory.segment.embedding import (
    EmbeddingSegmenter,
    TextTilingSegmenter,
    make_segmenter,
)
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.segment.llm import LLMSegmenter, SegmentationOutcome, parse_segmentation
from reflective_memory.segment.rubric import LabeledDialogue, Rubric
from reflective_memory.segment.rubric_learning import learn_rubric

__all__ = [
    "Segmenter",
    "FixedWindowSegmenter",
    "check_spans",
    "unit_spans",
    "units_to_turn_spans",
    "boundaries_to_spans",
    "UNITS",
    "TextTilingSegmenter",
    "EmbeddingSegmenter",
    "LLMSegmenter",
    "SegmentationOutcome",
    "parse_segmentation",
    "Rubric",
    "LabeledDialogue",
    "learn_rubric",
    "make_segmenter",
    "segmenter_from_config",
]
