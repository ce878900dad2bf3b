"""LlamaIndex embeddings: queries by `get_query_embedding`, texts by `get_text_embedding`."""

from __future__ import annotations

import asyncio

import numpy as np
from fakes import QueryDocEmbedder
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from reflective_memory import MemoryConfig, QueryEmbedder, ReflectiveMemory

from llamaindex_reflective import LlamaIndexEmbedder, ReflectiveEmbedding


class AsymmetricEmbedding(BaseEmbedding):
    """A LlamaIndex model whose query vectors differ from its text vectors (see fakes)."""

    _core: QueryDocEmbedder = PrivateAttr(default_factory=lambda: QueryDocEmbedder(64))

    @classmethod
    def class_name(cls) -> str:
        return "AsymmetricEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._core.encode_query(query).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._core.encode(text).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def test_llamaindex_embedder_embeds_each_side_with_its_method() -> None:
    model = AsymmetricEmbedding(model_name="asym")
    emb = LlamaIndexEmbedder(embed_model=model)
    assert isinstance(emb, QueryEmbedder) and emb.name == "llamaindex:AsymmetricEmbedding:asym"
    q = "which canine ate my footwear?"
    assert np.allclose(emb.encode_query(q), model._core.encode_query(q))
    assert np.allclose(emb.encode([q])[0], model._core.encode(q))
    assert emb.encode_query([q, q]).shape == (2, 64)


def test_a_memory_over_a_llamaindex_model_uses_its_query_side() -> None:
    model = AsymmetricEmbedding(model_name="asym")
    cfg = MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})
    with ReflectiveMemory(embedder=LlamaIndexEmbedder(embed_model=model), config=cfg) as mem:
        for text in (
            "Mia: He already chewed my red sneakers.",
            "Mia: I read an article about canine footwear trends.",
        ):
            mem.add_turn("mia", "s", "user", text)
        model._core.calls.clear()
        hits = mem.retrieve("mia", "which canine ate my footwear?", k=1, mode="dense").hits
        assert model._core.kinds() == ["query"]
        assert "sneakers" in hits[0].memory.text


def test_reflective_embedding_query_side_sync_and_async() -> None:
    core = QueryDocEmbedder(32)
    emb = ReflectiveEmbedding(embedder=core)
    q = "canine"
    assert np.allclose(emb.get_query_embedding(q), core.encode_query(q))
    assert np.allclose(emb.get_text_embedding(q), core.encode(q))
    assert np.allclose(asyncio.run(emb.aget_query_embedding(q)), core.encode_query(q))
    assert not np.allclose(emb.get_query_embedding(q), emb.get_text_embedding(q))


def test_a_text_instruction_is_part_of_the_name() -> None:
    class Instructed(AsymmetricEmbedding):
        text_instruction: str | None = None

    plain = LlamaIndexEmbedder(embed_model=Instructed(model_name="m"))
    told = LlamaIndexEmbedder(embed_model=Instructed(model_name="m", text_instruction="passage: "))
    assert plain.name == "llamaindex:AsymmetricEmbedding:m"
    assert told.name == "llamaindex:AsymmetricEmbedding:m|text_instruction='passage: '"
