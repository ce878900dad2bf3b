"""Embedding adapters, both ways.

* `ReflectiveEmbedding`: the core's `Embedder` as a LlamaIndex `BaseEmbedding`, so a LlamaIndex
  index and the memory store can share one model (and one vector space). Queries go through the
  core's `encode_query`, texts through `encode`.
* `LlamaIndexEmbedder`: any LlamaIndex embedding model as the core's `Embedder`
  (`name`, `dim`, `encode` for documents through `get_text_embedding(_batch)`, `encode_query`
  through `get_query_embedding`), so asymmetric models (e5, bge, nomic: a query instruction)
  embed each side as they should. It has no `aencode_query`: many local LlamaIndex models
  implement their async methods by calling the sync ones on the loop, so the core's async path
  runs `encode_query` in a worker thread instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from ._compat import require_llama_index

require_llama_index()

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.bridge.pydantic import ConfigDict, Field  # noqa: E402
from reflective_memory.embed import Embedder, check_texts, encode_query, normalise  # noqa: E402
from reflective_memory.errors import InvalidInputError  # noqa: E402

__all__ = ["ReflectiveEmbedding", "LlamaIndexEmbedder"]


class ReflectiveEmbedding(BaseEmbedding):
    """The core's embedder (e.g. `memory.embedder`) as a LlamaIndex embedding model.

    Vectors are the core's L2-normalised float32 rows, returned as lists of floats.

    Example:
        >>> from reflective_memory import HashingEmbedder
        >>> emb = ReflectiveEmbedding(embedder=HashingEmbedder(64))
        >>> len(emb.get_text_embedding("hello"))
        64
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    embedder: Any = Field(exclude=True, description="The core `Embedder` that computes vectors.")

    def __init__(self, *, embedder: Embedder, **kwargs: Any) -> None:
        if not callable(getattr(embedder, "encode", None)):
            raise InvalidInputError(
                f"embedder must have encode(texts) -> ndarray, got {type(embedder).__name__}"
            )
        kwargs.setdefault("model_name", str(getattr(embedder, "name", type(embedder).__name__)))
        super().__init__(embedder=embedder, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """Name used in LlamaIndex serialisation."""
        return "ReflectiveEmbedding"

    def _one(self, text: str) -> list[float]:
        return np.asarray(self.embedder.encode(text), dtype=np.float32).reshape(-1).tolist()

    def _query(self, query: str) -> list[float]:
        vec = encode_query(self.embedder, query)
        return np.asarray(vec, dtype=np.float32).reshape(-1).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._query(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._one(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return np.asarray(self.embedder.encode(list(texts)), dtype=np.float32).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._query, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._one, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


class LlamaIndexEmbedder:
    """Any LlamaIndex embedding model as the core's `Embedder`.

    Pass it as `ReflectiveMemory(embedder=LlamaIndexEmbedder(embed_model=...))`. Rows are
    L2-normalised float32 (so dot products are cosines, as the core expects); `dim` is found by
    embedding a probe text once.

    Args:
        embed_model: Any LlamaIndex `BaseEmbedding`.
        name: Identifies the model in the store (memories embedded under another name are
            re-embedded); defaults to `llamaindex:<class>:<model_name>`, plus the model's
            `text_instruction` when it has one (it changes the document vectors).

    Example:
        >>> from llama_index.core.embeddings import MockEmbedding
        >>> LlamaIndexEmbedder(embed_model=MockEmbedding(embed_dim=8)).encode(["a", "b"]).shape
        (2, 8)
    """

    def __init__(self, *, embed_model: BaseEmbedding, name: str | None = None) -> None:
        if not isinstance(embed_model, BaseEmbedding):
            raise InvalidInputError(
                f"embed_model must be a LlamaIndex BaseEmbedding, got {type(embed_model).__name__}"
            )
        self.embed_model = embed_model
        if name is None:
            name = f"llamaindex:{embed_model.class_name()}:{embed_model.model_name}"
            instruction = getattr(embed_model, "text_instruction", None)
            if instruction:  # a document instruction changes the stored vectors
                name += f"|text_instruction={instruction!r}"
        self.name = name
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        """Vector size (embeds a probe text on first use)."""
        if self._dim is None:
            self._dim = len(self.embed_model.get_text_embedding("dimension probe"))
        return self._dim

    @staticmethod
    def _rows(vectors: list[list[float]]) -> np.ndarray:
        return normalise(np.asarray(vectors, dtype=np.float32))

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed documents: one text (shape `(dim,)`) or a list (shape `(n, dim)`)."""
        items, single = check_texts(texts)
        if single:
            return self._rows([self.embed_model.get_text_embedding(items[0])])[0]
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        mat = self._rows(self.embed_model.get_text_embedding_batch(items))
        if self._dim is None:
            self._dim = int(mat.shape[1])
        return mat

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        """Embed queries with `get_query_embedding` (shape as `encode`)."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        mat = self._rows([self.embed_model.get_query_embedding(t) for t in items])
        return mat[0] if single else mat

    def __repr__(self) -> str:
        return f"LlamaIndexEmbedder(name={self.name!r})"
