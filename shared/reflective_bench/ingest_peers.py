"""Reference rows of `bench ingest`: LlamaIndex and LangChain vector stores on the same MiniLM.

Each peer gets its own MiniLM embedder with no cache, encoding in batches of 32 (what
sentence-transformers, and so LangChain's `HuggingFaceEmbeddings`, use by default), wrapped in
the framework's embedding interface with its default batching (LlamaIndex hands over 10 texts
per call); a peer ingests one session's texts per call. Peers whose framework is not
installed are left out.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["ingest_peers"]

logger = logging.getLogger(__name__)


def _llamaindex(embedder: Any) -> Callable[[list[str]], None]:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import BaseEmbedding
    from llama_index.core.schema import TextNode

    class MiniLM(BaseEmbedding):  # type: ignore[misc]
        """The bench's MiniLM as a LlamaIndex embedding."""

        def _get_query_embedding(self, query: str) -> list[float]:
            return [float(x) for x in embedder.encode(query)]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return [float(x) for x in embedder.encode(text)]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return [list(map(float, row)) for row in embedder.encode(list(texts))]

    index = VectorStoreIndex([], embed_model=MiniLM())

    def ingest(texts: list[str]) -> None:
        index.insert_nodes([TextNode(text=t) for t in texts])

    return ingest


def _langchain(embedder: Any) -> Callable[[list[str]], None]:
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import InMemoryVectorStore

    class MiniLM(Embeddings):
        """The bench's MiniLM as a LangChain embedding."""

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [list(map(float, row)) for row in embedder.encode(list(texts))]

        def embed_query(self, text: str) -> list[float]:
            return [float(x) for x in embedder.encode(text)]

    store = InMemoryVectorStore(MiniLM())

    def ingest(texts: list[str]) -> None:
        store.add_texts(texts)

    return ingest


def ingest_peers(make_embedder: Callable[[], Any]) -> dict[str, Callable[[list[str]], None]]:
    """The installed reference systems, each with its own embedder from `make_embedder`.

    Returns:
        Name (`LlamaIndex VectorStoreIndex`, `LangChain InMemoryVectorStore`) to a function
        that ingests a list of texts.
    """
    out: dict[str, Callable[[list[str]], None]] = {}
    makers = {
        "LlamaIndex VectorStoreIndex": ("llama_index.core", _llamaindex),
        "LangChain InMemoryVectorStore": ("langchain_core", _langchain),
    }
    for name, (module, make) in makers.items():
        if importlib.util.find_spec(module) is None:
            logger.info("%s is not installed: no %s row", module, name)
            continue
        out[name] = make(make_embedder())
    return out
