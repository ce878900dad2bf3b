"""Build the segmenter a `SegmentConfig` asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.config import SegmentConfig
from reflective_memory.segment.embedding import EmbeddingSegmenter, make_segmenter
from reflective_memory.segment.llm import LLMSegmenter
from reflective_memory.segment.rubric import Rubric

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder

__all__ = ["segmenter_from_config"]


def segmenter_from_config(
    config: SegmentConfig, embedder: Embedder | None = None, llm: Any | None = None
) -> Segmenter:
    """The segmenter a `SegmentConfig` asks for.

    `auto` gives an `LLMSegmenter` (with the offline `EmbeddingSegmenter` as its fallback) when
    `llm` is given, else the `EmbeddingSegmenter`.

    Args:
        config: The segment settings.
        embedder: Embedder for the embedding-based segmenters.
        llm: The configured LLM, if any.

    Raises:
        ConfigError: `kind="llm"` without an LLM, or an unreadable rubric file.
    """
    kind = config.kind
    if kind == "auto":
        kind = "llm" if llm is not None else "embedding"
    if kind != "llm":
        return make_segmenter(kind, embedder=embedder, unit=config.unit, window=config.window)
    if llm is None:
        raise ConfigError("segment.kind='llm' needs an llm; pass llm=... or use 'auto'/'embedding'")
    rubric = None
    if config.rubric is not None:
        try:
            rubric = Rubric.load(config.rubric)
        except InvalidInputError as exc:
            raise ConfigError(f"segment.rubric: {exc}") from exc
    return LLMSegmenter(
        llm,
        fallback=EmbeddingSegmenter(embedder, unit=config.unit),
        rubric=rubric,
        unit=config.unit,
        window=config.llm_window,
        overlap=config.llm_overlap,
    )
