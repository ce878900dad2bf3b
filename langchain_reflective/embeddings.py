"""Embedding adapters, both ways.

* `LangChainEmbedder`: any LangChain `Embeddings` (`OpenAIEmbeddings`, `HuggingFaceEmbeddings`,
  `OllamaEmbeddings`, ...) as the core's `Embedder`: documents through `embed_documents`,
  queries through `embed_query` (so asymmetric models such as e5, bge or nomic embed each side
  as they should), and the async twins through `aembed_documents` / `aembed_query`.
* `ReflectiveEmbeddings`: the core's embedder (e.g. `memory.embedder`) as a LangChain
  `Embeddings`, so a LangChain vector store and the memory share one model and one vector space.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings
from reflective_memory.embed import (
    Embedder,
    aencode_query,
    check_texts,
    encode_query,
    normalise,
)
from reflective_memory.errors import InvalidInputError

__all__ = ["LangChainEmbedder", "ReflectiveEmbeddings"]

#: Attributes that name the model of a LangChain `Embeddings` (the first ones set are used).
_MODEL_FIELDS = ("model", "model_name", "model_id", "repo_id", "deployment")
#: Attributes that change the vectors of one model (output size, a document instruction).
_SHAPE_FIELDS = ("dimensions", "size", "embed_instruction", "document_instruction")


def langchain_embedder_name(embeddings: Embeddings) -> str:
    """A stable name for `embeddings`: its class and the fields that identify its vectors.

    Args:
        embeddings: A LangChain `Embeddings`.

    Returns:
        `langchain:<class>:<field>=<value>,...`, e.g.
        `langchain:OpenAIEmbeddings:model=text-embedding-3-small`.

    Raises:
        InvalidInputError: The object has none of the usual model fields (`model`,
            `model_name`, ...), so two of its models could not be told apart: pass `name=`.

    Example:
        >>> from langchain_core.embeddings import DeterministicFakeEmbedding
        >>> langchain_embedder_name(DeterministicFakeEmbedding(size=8))
        'langchain:DeterministicFakeEmbedding:size=8'
    """
    parts = []
    for field in _MODEL_FIELDS + _SHAPE_FIELDS:
        value = getattr(embeddings, field, None)
        if value is not None and isinstance(value, (str, int)) and not isinstance(value, bool):
            parts.append(f"{field}={value}")
    if not parts:
        raise InvalidInputError(
            f"cannot tell which model {type(embeddings).__name__} runs (it has none of "
            f"{', '.join(_MODEL_FIELDS + _SHAPE_FIELDS)}): pass name='<model>' to "
            "LangChainEmbedder, so a store knows when its vectors came from another model"
        )
    return f"langchain:{type(embeddings).__name__}:{','.join(parts)}"


class LangChainEmbedder:
    """Any LangChain `Embeddings` as the core's `Embedder` (and `QueryEmbedder`).

    Pass it as `ReflectiveMemory(embedder=LangChainEmbedder(OpenAIEmbeddings(...)))`. Rows are
    L2-normalised float32 (dot products are cosines, as the core expects); `dim` is found by
    embedding a probe document once.

    Args:
        embeddings: Any LangChain `Embeddings`.
        name: Identifies the model in the store (memories embedded under another name are
            re-embedded); defaults to `langchain_embedder_name(embeddings)`.

    Raises:
        InvalidInputError: `embeddings` is not a LangChain `Embeddings`, or its model cannot be
            told (see `langchain_embedder_name`) and no `name` is given.

    Example:
        >>> from langchain_core.embeddings import DeterministicFakeEmbedding
        >>> emb = LangChainEmbedder(DeterministicFakeEmbedding(size=8))
        >>> emb.encode(["a", "b"]).shape, emb.encode_query("a").shape
        ((2, 8), (8,))
    """

    def __init__(self, embeddings: Embeddings, *, name: str | None = None) -> None:
        if not isinstance(embeddings, Embeddings):
            raise InvalidInputError(
                f"embeddings must be a LangChain Embeddings, got {type(embeddings).__name__}"
            )
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidInputError(f"name must be a non-empty str, got {name!r}")
        self.embeddings = embeddings
        self.name = langchain_embedder_name(embeddings) if name is None else name
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        """Vector size (embeds a probe document on first use)."""
        if self._dim is None:
            self._dim = len(self.embeddings.embed_documents(["dimension probe"])[0])
        return self._dim

    def _rows(self, vectors: list[list[float]], n: int, what: str) -> np.ndarray:
        mat = np.asarray(vectors, dtype=np.float32)
        if mat.ndim != 2 or mat.shape[0] != n:
            raise InvalidInputError(
                f"{type(self.embeddings).__name__}.{what} returned an array of shape "
                f"{mat.shape} for {n} texts (expected {n} rows of equal length)"
            )
        if self._dim is None:
            self._dim = int(mat.shape[1])
        return normalise(mat)

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed documents with `embed_documents` (shape `(dim,)` for a `str`, else `(n, dim)`)."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        mat = self._rows(self.embeddings.embed_documents(items), len(items), "embed_documents")
        return mat[0] if single else mat

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        """Embed queries with `embed_query`, one by one (shape as `encode`)."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = [self.embeddings.embed_query(t) for t in items]
        mat = self._rows(vecs, len(items), "embed_query")
        return mat[0] if single else mat

    async def aencode(self, texts: str | list[str]) -> np.ndarray:
        """Async twin of `encode` (`aembed_documents`: the model's own, or LangChain's executor)."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, await asyncio.to_thread(lambda: self.dim)), dtype=np.float32)
        vecs = await self.embeddings.aembed_documents(items)
        mat = self._rows(vecs, len(items), "aembed_documents")
        return mat[0] if single else mat

    async def aencode_query(self, texts: str | list[str]) -> np.ndarray:
        """Async twin of `encode_query` (`aembed_query`: the model's own, or an executor)."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, await asyncio.to_thread(lambda: self.dim)), dtype=np.float32)
        vecs = await asyncio.gather(*(self.embeddings.aembed_query(t) for t in items))
        mat = self._rows(list(vecs), len(items), "aembed_query")
        return mat[0] if single else mat

    def __repr__(self) -> str:
        return f"LangChainEmbedder(name={self.name!r})"


class ReflectiveEmbeddings(Embeddings):
    """The core's embedder as a LangChain `Embeddings`.

    Documents go through the embedder's `encode`, queries through `encode_query` (the
    embedder's own, or `encode`); the async methods run them in a worker thread (or the
    embedder's `aencode_query`), never on the event loop.

    Args:
        embedder: The core `Embedder` (e.g. `memory.embedder`).

    Raises:
        InvalidInputError: `embedder` has no `encode`.

    Example:
        >>> from reflective_memory import HashingEmbedder
        >>> emb = ReflectiveEmbeddings(embedder=HashingEmbedder(16))
        >>> len(emb.embed_query("hello")), len(emb.embed_documents(["a", "b"]))
        (16, 2)
    """

    def __init__(self, *, embedder: Embedder) -> None:
        if not callable(getattr(embedder, "encode", None)):
            raise InvalidInputError(
                f"embedder must have encode(texts) -> ndarray, got {type(embedder).__name__}"
            )
        self.embedder = embedder

    @staticmethod
    def _texts(texts: Any, what: str) -> list[str]:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise InvalidInputError(f"{what} takes a list of str, got {type(texts).__name__}")
        return check_texts(list(texts))[0]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (the embedder's `encode`)."""
        items = self._texts(texts, "embed_documents")
        if not items:
            return []
        mat = np.asarray(self.embedder.encode(items), dtype=np.float32)
        return mat.reshape(len(items), -1).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed a query (the embedder's `encode_query`, else `encode`)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"embed_query takes a str, got {type(text).__name__}")
        return np.asarray(encode_query(self.embedder, text), dtype=np.float32).reshape(-1).tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async twin of `embed_documents` (in a worker thread)."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """Async twin of `embed_query` (off the event loop)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"aembed_query takes a str, got {type(text).__name__}")
        vec = await aencode_query(self.embedder, text)
        return np.asarray(vec, dtype=np.float32).reshape(-1).tolist()

    def __repr__(self) -> str:
        return f"ReflectiveEmbeddings(embedder={self.embedder!r})"
