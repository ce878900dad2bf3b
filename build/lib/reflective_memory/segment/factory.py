"""Build the segmenter a `MemoryConfig` asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.embedding import EmbeddingSegmenter, make_segmenter
from reflective_memory.segment.llm import LLMSegmenter
from reflective_memory.segment.rubric import Rubric

if TYPE_CHECKING:
    from reflective_memory.config import MemoryConfig
    from reflective_memory.embed import Embedder

__all__ = ["segmenter_from_config"]


def segmenter_from_config(
    config: MemoryConfig, embedder: Embedder | None = None, llm: Any | None = None
) -> Segmenter:
    """The segmenter a `MemoryConfig` asks for.

    `auto` gives an `LLMSegmenter` (with the offline `EmbeddingSegmenter` as its fallback) when
    `llm` is given, else the `EmbeddingSegmenter`.

    Args:
        config: Settings (`segmenter`, `segment_unit`, `segment_window`, `segment_llm_window`,
            `segment_llm_overlap`, `segment_rubric`).
        embedder: Embedder for the embedding-based segmenters.
        llm: The configured LLM, if any.

    Raises:
        ConfigError: `segmenter="llm"` without an LLM, or an unreadable rubric file.
    """
    kind = config.segmenter
    if kind == "auto":
        kind = "llm" if llm is not None else "embedding"
    if kind != "llm":
        return make_segmenter(
            kind, embedder=embedder, unit=config.segment_unit, window=config.segment_window
        )
    if llm is None:
        raise ConfigError("segmenter='llm' needs an llm; pass llm=... or use 'auto'/'embedding'")
    rubric = None
    if config.segment_rubric is not None:
        try:
            rubric = Rubric.load(config.segment_rubric)
        except InvalidInputError as exc:
            raise ConfigError(f"segment_rubric: {exc}") from exc
    return LLMSegmenter(
        llm,
        fallback=EmbeddingSegmenter(embedder, unit=config.segment_unit),
        rubric=rubric,
        unit=config.segment_unit,
        window=config.segment_llm_window,
        overlap=config.segment_llm_overlap,
    )
