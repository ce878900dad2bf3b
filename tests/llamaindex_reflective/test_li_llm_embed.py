import asyncio
from typing import Any

import numpy as np
import pytest
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from reflective_memory import (
    HashingEmbedder,
    InvalidInputError,
    LLMClient,
    LLMError,
    ReflectiveMemory,
    Usage,
)

from llamaindex_reflective import LlamaIndexEmbedder, LlamaIndexLLM, ReflectiveEmbedding
from llamaindex_reflective.llm import usage_from_response


class ScriptedLLM(CustomLLM):
    """Returns scripted outputs in order and reports token usage like OpenAI does."""

    outputs: list = []
    prompts: list = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return CompletionResponse(
            text=out, raw={"usage": {"prompt_tokens": 11, "completion_tokens": 3}}
        )

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
        raise NotImplementedError


def test_llm_adapter_sync_async_and_usage():
    llm = ScriptedLLM(outputs=["one", "two"], prompts=[])
    adapter = LlamaIndexLLM(llm=llm)
    client = LLMClient(adapter)
    usage = Usage()
    assert client.complete("p1", usage=usage) == "one"
    assert adapter.last_usage == {"prompt_tokens": 11, "completion_tokens": 3}
    assert asyncio.run(client.acomplete("p2", usage=usage)) == "two"
    assert usage.llm_calls == 2 and usage.prompt_tokens == 22 and usage.completion_tokens == 6
    assert llm.prompts == ["p1", "p2"]


def test_llm_adapter_failure_becomes_llm_error():
    client = LLMClient(LlamaIndexLLM(llm=ScriptedLLM(outputs=[RuntimeError("boom")], prompts=[])))
    with pytest.raises(LLMError):
        client.complete("p")
    assert client.usage.failures == 1


def test_mock_llm_without_usage_is_estimated():
    adapter = LlamaIndexLLM(llm=MockLLM())
    client = LLMClient(adapter)
    assert client.complete("three words here") == "three words here"
    assert adapter.last_usage is None
    assert client.usage.prompt_tokens == 3
    with pytest.raises(InvalidInputError):
        LlamaIndexLLM(llm=lambda p: p)


def test_usage_from_response_variants():
    anth = CompletionResponse(text="x", raw={"usage": {"input_tokens": 5, "output_tokens": 2}})
    kw = CompletionResponse(text="x", additional_kwargs={"prompt_tokens": 7})
    assert usage_from_response(anth) == {"prompt_tokens": 5, "completion_tokens": 2}
    assert usage_from_response(kw) == {"prompt_tokens": 7, "completion_tokens": 0}
    assert usage_from_response(CompletionResponse(text="x")) is None


def test_engine_accepts_llamaindex_llm():
    mem = ReflectiveMemory(embedder=HashingEmbedder(), llm=LlamaIndexLLM(llm=MockLLM()))
    assert mem.llm.complete("hi") == "hi"


def test_reflective_embedding_matches_core_embedder():
    core = HashingEmbedder(64)
    emb = ReflectiveEmbedding(embedder=core)
    v = emb.get_text_embedding("dogs bark")
    np.testing.assert_allclose(v, core.encode("dogs bark"), rtol=1e-6)
    np.testing.assert_allclose(emb.get_query_embedding("q"), core.encode("q"), rtol=1e-6)
    batch = emb.get_text_embedding_batch(["a b", "c d", "e"])
    np.testing.assert_allclose(batch, core.encode(["a b", "c d", "e"]), rtol=1e-6)
    assert asyncio.run(emb.aget_query_embedding("q")) == pytest.approx(emb.get_query_embedding("q"))
    assert len(asyncio.run(emb.aget_text_embedding_batch(["a", "b"]))) == 2
    assert (
        emb.model_name == "hashing:64" and ReflectiveEmbedding.class_name() == "ReflectiveEmbedding"
    )
    with pytest.raises(InvalidInputError):
        ReflectiveEmbedding(embedder=object())


def test_llamaindex_embedder_as_core_embedder():
    emb = LlamaIndexEmbedder(embed_model=MockEmbedding(embed_dim=8))
    assert emb.dim == 8
    one, many = emb.encode("x"), emb.encode(["x", "y"])
    assert one.shape == (8,) and many.shape == (2, 8) and many.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, rtol=1e-5)
    assert emb.encode([]).shape == (0, 8)
    with pytest.raises(InvalidInputError):
        emb.encode(3)
    # round trip: core -> LlamaIndex -> core keeps the vectors
    back = LlamaIndexEmbedder(embed_model=ReflectiveEmbedding(embedder=HashingEmbedder(32)))
    np.testing.assert_allclose(back.encode(["cat"]), HashingEmbedder(32).encode(["cat"]), rtol=1e-5)
    # and it drives the engine
    mem = ReflectiveMemory(embedder=back)
    mem.add_turn("u", "s", "user", "I adopted a cat named Miso")
    mem.end_session("u", "s")
    assert "Miso" in mem.retrieve("u", "cat name").hits[0].memory.text
