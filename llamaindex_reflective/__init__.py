"""LlamaIndex adapters for reflective-memory (`pip install reflective-memory[llamaindex]`).

Thin adapters that convert LlamaIndex types and delegate to `reflective_memory.ReflectiveMemory`.
Each is
built from the core object and the user it serves (`memory=..., user_id=...`), so one store
serves many adapters and users.
"""

from ._compat import INSTALL_HINT, require_llama_index

require_llama_index()

from .chat_store import ReflectiveChatStore, ReflectiveDBChatStore  # noqa: E402
from .embeddings import LlamaIndexEmbedder, ReflectiveEmbedding  # noqa: E402
from .llm import LlamaIndexLLM  # noqa: E402
from .memory_block import ReflectiveMemoryBlock  # noqa: E402
from .postprocessor import ReflectiveNodePostprocessor  # noqa: E402

__all__ = [
    "LlamaIndexLLM",
    "ReflectiveEmbedding",
    "LlamaIndexEmbedder",
    "ReflectiveNodePostprocessor",
    "ReflectiveChatStore",
    "ReflectiveDBChatStore",
    "ReflectiveMemoryBlock",
    "INSTALL_HINT",
]
