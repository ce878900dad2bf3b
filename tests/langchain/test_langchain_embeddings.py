"""LangChain embeddings both ways: any `Embeddings` as the core's embedder, ours as `Embeddings`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from fakes import QueryDocEmbedder
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests
from reflective_memory import HashingEmbedder, InvalidInputError, MemoryConfig, ReflectiveMemory

from langchain_reflective import LangChainEmbedder, ReflectiveEmbeddings

TESTS = Path(__file__).resolve().parents[1]


class AsymmetricEmbeddings(Embeddings):
    """A LangChain model whose query vectors differ from its document vectors (see fakes)."""

    model = "asymmetric-fake"

    def __init__(self) -> None:
        self.core = QueryDocEmbedder(64)
        self.async_queries: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.core.encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.core.encode_query(text).tolist()

    async def aembed_query(self, text: str) -> list[float]:
        self.async_queries.append(text)
        return self.embed_query(text)


class TestReflectiveEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[ReflectiveEmbeddings]:
        return ReflectiveEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"embedder": HashingEmbedder(32)}


class TestReflectiveEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[ReflectiveEmbeddings]:
        return ReflectiveEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"embedder": QueryDocEmbedder(32)}


def test_reflective_embeddings_embed_each_side_as_the_core_does() -> None:
    core = QueryDocEmbedder(32)
    emb = ReflectiveEmbeddings(embedder=core)
    q = "which canine is mine"
    assert np.allclose(emb.embed_query(q), core.encode_query(q))
    assert np.allclose(emb.embed_documents([q])[0], core.encode(q))
    assert not np.allclose(emb.embed_query(q), emb.embed_documents([q])[0])
    with pytest.raises(InvalidInputError):
        emb.embed_documents("not a list")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        ReflectiveEmbeddings(embedder=object())  # type: ignore[arg-type]


async def test_reflective_embeddings_async_query_side() -> None:
    core = QueryDocEmbedder(32)
    emb = ReflectiveEmbeddings(embedder=core)
    assert np.allclose(await emb.aembed_query("canine"), core.encode_query("canine"))
    assert np.allclose((await emb.aembed_documents(["canine"]))[0], core.encode("canine"))


def test_langchain_embedder_names_are_stable_and_distinct_per_model() -> None:
    assert LangChainEmbedder(DeterministicFakeEmbedding(size=8)).name == (
        "langchain:DeterministicFakeEmbedding:size=8"
    )
    assert (
        LangChainEmbedder(DeterministicFakeEmbedding(size=8)).name
        != LangChainEmbedder(DeterministicFakeEmbedding(size=16)).name
    )
    assert LangChainEmbedder(AsymmetricEmbeddings()).name == (
        "langchain:AsymmetricEmbeddings:model=asymmetric-fake"
    )

    class Anonymous(Embeddings):
        def embed_documents(self, texts):  # type: ignore[no-untyped-def]
            return [[1.0, 0.0] for _ in texts]

        def embed_query(self, text):  # type: ignore[no-untyped-def]
            return [1.0, 0.0]

    with pytest.raises(InvalidInputError, match="pass name="):
        LangChainEmbedder(Anonymous())
    assert LangChainEmbedder(Anonymous(), name="mine:v1").name == "mine:v1"
    with pytest.raises(InvalidInputError, match="LangChain Embeddings"):
        LangChainEmbedder(HashingEmbedder(8))  # type: ignore[arg-type]


def test_langchain_embedder_rows_are_normalised_and_shaped() -> None:
    emb = LangChainEmbedder(DeterministicFakeEmbedding(size=8))
    mat = emb.encode(["a", "b", "c"])
    assert mat.shape == (3, 8) and emb.dim == 8
    assert np.allclose(np.linalg.norm(mat, axis=1), 1.0)
    assert emb.encode("a").shape == (8,) and emb.encode([]).shape == (0, 8)
    assert emb.encode_query(["a", "b"]).shape == (2, 8)


def test_a_memory_over_a_langchain_embeddings_uses_its_query_side() -> None:
    lc = AsymmetricEmbeddings()
    cfg = MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})
    with ReflectiveMemory(embedder=LangChainEmbedder(lc), config=cfg) as mem:
        mem.add_turns(
            [
                {"user_id": "mia", "session_id": "s", "role": "user", "text": text}
                for text in (
                    "Mia: He already chewed my red sneakers.",
                    "Mia: I read an article about canine footwear trends.",
                )
            ]
        )
        lc.core.calls.clear()
        hits = mem.retrieve("mia", "which canine ate my footwear?", k=1, mode="dense").hits
        assert lc.core.kinds() == ["query"]
        assert "sneakers" in hits[0].memory.text


async def test_langchain_embedder_async_twins_use_the_models_async_methods() -> None:
    lc = AsymmetricEmbeddings()
    emb = LangChainEmbedder(lc)
    vec = await emb.aencode_query("canine")
    assert lc.async_queries == ["canine"]
    assert np.allclose(vec, emb.encode_query("canine"))
    docs = await emb.aencode(["canine", "footwear"])
    assert np.allclose(docs, emb.encode(["canine", "footwear"]))


def test_an_agent_over_a_langchain_embeddings_remembers_across_processes(tmp_path) -> None:
    """Two processes: the first tells the agent, the second (a new agent) is reminded."""
    script = textwrap.dedent(
        """
        import sys
        sys.path[:0] = [{tests!r}, {tests_lc!r}]
        from langchain.agents import create_agent
        from lc_helpers import recording_model
        from test_langchain_embeddings import AsymmetricEmbeddings
        from reflective_memory import ReflectiveMemory
        from langchain_reflective import LangChainEmbedder, ReflectiveMemoryMiddleware

        step = sys.argv[1]
        embedder = LangChainEmbedder(AsymmetricEmbeddings())
        with ReflectiveMemory({path!r}, embedder=embedder) as memory:
            if step == "tell":
                model = recording_model("Noted.")
                text = "My beagle Pixel chewed my red sneakers."
            else:
                model = recording_model("Pixel [0].")
                text = "Which canine ate my footwear?"
            mw = ReflectiveMemoryMiddleware(memory=memory, user_id="mia", session_id=step)
            agent = create_agent(model, middleware=[mw])
            agent.invoke({{"messages": [("user", text)]}})
            if step == "ask":
                print(model.seen[0][0].text)
        """
    ).format(tests=str(TESTS), tests_lc=str(TESTS / "langchain"), path=str(tmp_path / "mem"))
    (tmp_path / "agent.py").write_text(script)

    def run(step: str) -> str:
        done = subprocess.run(
            [sys.executable, str(tmp_path / "agent.py"), step],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("tell")
    assert "sneakers" in run("ask")
