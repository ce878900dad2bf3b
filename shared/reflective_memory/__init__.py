"""reflective-memory core: long-term conversational memory, framework-free.

Importing this package is light: it imports no LangChain, no LlamaIndex, and no torch, FAISS or
transformers. The public names below load their modules on first use (PEP 562), so
`import reflective_memory.errors` or `reflective_memory.config` stays fast; heavy libraries load
when a model or an index is first needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reflective_memory.config import MemoryConfig
    from reflective_memory.denoise import Denoiser, LLMLinguaDenoiser, OfflineDenoiser
    from reflective_memory.embed import (
        Embedder,
        HashingEmbedder,
        QueryEmbedder,
        SentenceTransformerEmbedder,
        default_embedder,
        encode_query,
    )
    from reflective_memory.engine import ReflectiveMemory
    from reflective_memory.errors import (
        ConfigError,
        EmbeddingError,
        InvalidInputError,
        LLMError,
        LLMOutputError,
        ModelLoadError,
        NoStoreError,
        ReflectiveMemoryError,
        StoreClosedError,
        StoreCorruptedError,
        StoreError,
        StoreUnavailableError,
        UnknownMemoryError,
        UnknownSessionError,
        UnknownUserError,
    )
    from reflective_memory.llm import LLM, LLMClient, as_llm, count_tokens
    from reflective_memory.recall import RecallConfig, calibrate_gate
    from reflective_memory.rmm.citations import register_instructions
    from reflective_memory.rmm.episodes import RankedTexts
    from reflective_memory.rmm.feedback import FeedbackResult
    from reflective_memory.rmm.reranker import Reranker
    from reflective_memory.segment import LabeledDialogue, Rubric, learn_rubric
    from reflective_memory.segment.base import FixedWindowSegmenter, Segmenter
    from reflective_memory.segment.embedding import EmbeddingSegmenter, TextTilingSegmenter
    from reflective_memory.segment.llm import LLMSegmenter
    from reflective_memory.types import Hit, Memory, RerankRecord, Retrieval, Turn, Usage

__version__ = "0.2.0"

#: Where each public name lives; imported on first access.
_EXPORTS: dict[str, str] = {
    "ReflectiveMemory": "reflective_memory.engine",
    "Reranker": "reflective_memory.rmm.reranker",
    "FeedbackResult": "reflective_memory.rmm.feedback",
    "RankedTexts": "reflective_memory.rmm.episodes",
    "register_instructions": "reflective_memory.rmm.citations",
    "MemoryConfig": "reflective_memory.config",
    "Denoiser": "reflective_memory.denoise",
    "OfflineDenoiser": "reflective_memory.denoise",
    "LLMLinguaDenoiser": "reflective_memory.denoise",
    "RecallConfig": "reflective_memory.recall",
    "calibrate_gate": "reflective_memory.recall",
    "Embedder": "reflective_memory.embed",
    "QueryEmbedder": "reflective_memory.embed",
    "encode_query": "reflective_memory.embed",
    "HashingEmbedder": "reflective_memory.embed",
    "SentenceTransformerEmbedder": "reflective_memory.embed",
    "default_embedder": "reflective_memory.embed",
    "LLM": "reflective_memory.llm",
    "LLMClient": "reflective_memory.llm",
    "as_llm": "reflective_memory.llm",
    "count_tokens": "reflective_memory.llm",
    "Segmenter": "reflective_memory.segment.base",
    "FixedWindowSegmenter": "reflective_memory.segment.base",
    "EmbeddingSegmenter": "reflective_memory.segment.embedding",
    "TextTilingSegmenter": "reflective_memory.segment.embedding",
    "LLMSegmenter": "reflective_memory.segment.llm",
    "Rubric": "reflective_memory.segment",
    "LabeledDialogue": "reflective_memory.segment",
    "learn_rubric": "reflective_memory.segment",
    "Turn": "reflective_memory.types",
    "Memory": "reflective_memory.types",
    "Hit": "reflective_memory.types",
    "Retrieval": "reflective_memory.types",
    "RerankRecord": "reflective_memory.types",
    "Usage": "reflective_memory.types",
    "ReflectiveMemoryError": "reflective_memory.errors",
    "InvalidInputError": "reflective_memory.errors",
    "UnknownUserError": "reflective_memory.errors",
    "UnknownSessionError": "reflective_memory.errors",
    "UnknownMemoryError": "reflective_memory.errors",
    "StoreClosedError": "reflective_memory.errors",
    "StoreCorruptedError": "reflective_memory.errors",
    "StoreError": "reflective_memory.errors",
    "StoreUnavailableError": "reflective_memory.errors",
    "LLMError": "reflective_memory.errors",
    "LLMOutputError": "reflective_memory.errors",
    "ConfigError": "reflective_memory.errors",
    "ModelLoadError": "reflective_memory.errors",
    "EmbeddingError": "reflective_memory.errors",
    "NoStoreError": "reflective_memory.errors",
}

__all__ = [
    "ReflectiveMemory",
    "Reranker",
    "FeedbackResult",
    "RankedTexts",
    "register_instructions",
    "MemoryConfig",
    "Denoiser",
    "OfflineDenoiser",
    "LLMLinguaDenoiser",
    "RecallConfig",
    "calibrate_gate",
    "Embedder",
    "QueryEmbedder",
    "encode_query",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
    "LLM",
    "LLMClient",
    "as_llm",
    "count_tokens",
    "Segmenter",
    "FixedWindowSegmenter",
    "EmbeddingSegmenter",
    "TextTilingSegmenter",
    "LLMSegmenter",
    "Rubric",
    "LabeledDialogue",
    "learn_rubric",
    "Turn",
    "Memory",
    "Hit",
    "Retrieval",
    "RerankRecord",
    "Usage",
    "ReflectiveMemoryError",
    "InvalidInputError",
    "UnknownUserError",
    "UnknownSessionError",
    "UnknownMemoryError",
    "StoreClosedError",
    "StoreCorruptedError",
    "StoreError",
    "StoreUnavailableError",
    "LLMError",
    "LLMOutputError",
    "ConfigError",
    "ModelLoadError",
    "EmbeddingError",
    "NoStoreError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'reflective_memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
