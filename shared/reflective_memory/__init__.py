"""reflective-memory core: long-term conversational memory, framework-free.

Importing this package imports no LangChain and no LlamaIndex.
"""

from reflective_memory.config import MemoryConfig
from reflective_memory.denoise import Denoiser, LLMLinguaDenoiser, OfflineDenoiser
from reflective_memory.embed import (
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    default_embedder,
)
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    LLMError,
    LLMOutputError,
    ModelLoadError,
    ReflectiveMemoryError,
    StoreClosedError,
    UnknownMemoryError,
    UnknownSessionError,
    UnknownUserError,
)
from reflective_memory.llm import LLM, LLMClient, as_llm, count_tokens
from reflective_memory.recall import RecallConfig, calibrate_gate
from reflective_memory.rmm.feedback import FeedbackResult
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.segment import LabeledDialogue, Rubric, learn_rubric
from reflective_memory.segment.base import FixedWindowSegmenter, Segmenter
from reflective_memory.segment.embedding import EmbeddingSegmenter, TextTilingSegmenter
from reflective_memory.segment.llm import LLMSegmenter
from reflective_memory.types import Hit, Memory, Retrieval, Turn, Usage

__version__ = "0.1.0"

__all__ = [
    "ReflectiveMemory",
    "Reranker",
    "FeedbackResult",
    "MemoryConfig",
    "Denoiser",
    "OfflineDenoiser",
    "LLMLinguaDenoiser",
    "RecallConfig",
    "calibrate_gate",
    "Embedder",
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
    "Usage",
    "ReflectiveMemoryError",
    "InvalidInputError",
    "UnknownUserError",
    "UnknownSessionError",
    "UnknownMemoryError",
    "StoreClosedError",
    "LLMError",
    "LLMOutputError",
    "ConfigError",
    "ModelLoadError",
    "__version__",
]
