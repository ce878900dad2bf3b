"""LangChain adapters for reflective-memory.

Thin wrappers around `reflective_memory.ReflectiveMemory`.

Every adapter is built from the core object and the user it serves, as keyword arguments
(`memory=ReflectiveMemory(...)`, `user_id="..."`, plus `session_id` where a session is meant), so
one store serves many adapters and users.

Install with `pip install reflective-memory[langchain]`.
"""

try:
    import langchain.agents  # noqa: F401
    import langchain_classic.base_memory  # noqa: F401
    import langchain_core  # noqa: F401
    import langgraph.store.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "langchain_reflective needs LangChain (langchain-core, langchain-classic, langchain "
        "with langgraph); "
        "install them with: pip install reflective-memory[langchain]"
        f" (missing: {exc.name})"
    ) from exc

from ._common import CITATION_INSTRUCTION, format_memories
from .agent import (
    ReflectiveMemoryMiddleware,
    ReflectiveMemoryState,
    SearchMemoryInput,
    create_memory_tool,
)
from .chat_memory import ReflectiveChatMemory
from .compressor import CitationReranker, ReflectiveCompressor
from .embeddings import LangChainEmbedder, ReflectiveEmbeddings
from .history import ReflectiveChatMessageHistory
from .llm import LangChainLLM
from .retriever import ReflectiveRetriever, hit_to_document
from .store import ReflectiveStore, StoreNamespaceError, render_value

__all__ = [
    "LangChainLLM",
    "LangChainEmbedder",
    "ReflectiveEmbeddings",
    "ReflectiveRetriever",
    "hit_to_document",
    "ReflectiveChatMemory",
    "ReflectiveChatMessageHistory",
    "ReflectiveMemoryMiddleware",
    "ReflectiveMemoryState",
    "SearchMemoryInput",
    "create_memory_tool",
    "ReflectiveCompressor",
    "CitationReranker",
    "ReflectiveStore",
    "StoreNamespaceError",
    "render_value",
    "CITATION_INSTRUCTION",
    "format_memories",
]
