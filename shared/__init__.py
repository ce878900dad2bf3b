"""reflective-memory core: long-term conversational memory, framework-free.

Importing this package imports no LangChain and no LlamaIndex.
"""

from .compress import Denoiser, LLMLinguaDenoiser, OfflineDenoiser
from .config import MemoryConfig
from .embed import Embedder, HashingEmbedder, SentenceTransformerEmbedder, default_embedder
from .engine import ReflectiveMemory
from .errors import (
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
from .llm import LLM, LLMClient, as_llm, count_tokens
from .recall import RecallConfig, calibrate_gate
from .rerank import Reranker
from .retrospective import FeedbackResult
from .segment import FixedWindowSegmenter, Segmenter
from .segment_embedding import EmbeddingSegmenter, TextTilingSegmenter
from .segment_llm import LLMSegmenter
from .segment_rubric import LabeledDialogue, Rubric, learn_rubric
from .types import Hit, Memory, Retrieval, Turn, Usage

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
