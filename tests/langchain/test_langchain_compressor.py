from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from lc_helpers import populate
from reflective_memory import (
    FeedbackResult,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)

from langchain_reflective import CitationReranker, ReflectiveCompressor, ReflectiveRetriever
from langchain_reflective._common import CITATION_INSTRUCTION

DOCS = [
    Document(page_content="The museum opens at nine on weekdays.", id="a"),
    Document(page_content="Bread is baked fresh every morning at the bakery.", id="b"),
    Document(page_content="The bakery sells sourdough bread and croissants.", id="c"),
    Document(page_content="Trains to the airport leave every twenty minutes.", id="d"),
]


@dataclass
class _Result:
    order: list[int]
    scores: np.ndarray


class ReverseReranker:
    """Scripted reranker: reverses the cosine order and records feedback episodes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.episodes: list = []

    def rerank(self, query, candidates, prior=None, *, explore=False):
        self.calls.append((query, candidates, prior, explore))
        order = [int(i) for i in np.argsort(prior, kind="stable")]
        scores = -np.asarray(prior, dtype=np.float32)
        return _Result(order, scores)

    def partial_fit(self, episode):
        self.episodes.append(episode)
        return self


def test_cosine_order_when_engine_reranking_is_off():
    off = ReflectiveMemory(
        embedder=HashingEmbedder(), config=MemoryConfig(rerank={"enabled": False})
    )
    comp = ReflectiveCompressor(memory=off, user_id="ana", top_n=2)
    assert comp.get_reranker() is None
    out = comp.compress_documents(DOCS, "where can I buy sourdough bread at the bakery")
    assert [d.id for d in out] == ["c", "b"]
    assert out[0].metadata["relevance_score"] >= out[1].metadata["relevance_score"]
    assert out[0].metadata["cosine_score"] == out[0].metadata["relevance_score"]
    assert DOCS[2].metadata == {}  # inputs are not mutated
    assert comp.compress_documents([], "x") == []
    report = comp.feedback("q", out, "It is [0].")
    assert isinstance(report, FeedbackResult)
    assert report.cited == (0,) and list(report.rewards.values()) == [1.0, -1.0]
    assert not report.learned and "reranking is off" in report.reason
    echoed = comp.feedback("q", out, CITATION_INSTRUCTION + " It is [0].")
    assert not echoed.learned and "echoes" in echoed.reason


def test_reranker_hook_orders_and_learns_from_citations(mem):
    rr = ReverseReranker()
    comp = CitationReranker(memory=mem, user_id="ana", top_n=2, reranker=rr)
    query = "where can I buy sourdough bread at the bakery"
    out = comp.compress_documents(DOCS, query)
    q, m, prior, explore = rr.calls[0]
    assert m.shape == (4, mem.embedder.dim) and not explore
    np.testing.assert_allclose(prior, m @ q, rtol=1e-5)
    assert [d.id for d in out] == [DOCS[i].id for i in np.argsort(prior)[:2]]

    report = comp.feedback(query, out, "You can buy it there [1].")
    assert report.cited == (1,) and list(report.rewards.values()) == [-1.0, 1.0]
    assert report.learned and list(report.rewards) == [d.id for d in out]
    ep = rr.episodes[0]
    assert ep.candidates.shape == (4, mem.embedder.dim)  # all candidates, not only the shown
    assert ep.shown == [int(i) for i in np.argsort(prior)[:2]]
    np.testing.assert_array_equal(ep.rewards, [-1.0, 1.0])

    # documents never compressed here: learned from as given
    comp.feedback("other question", DOCS[:3], "[NO_CITE]")
    ep2 = rr.episodes[1]
    assert ep2.shown == [0, 1, 2] and ep2.rewards.tolist() == [-1.0, -1.0, -1.0]


def test_inside_contextual_compression_retriever(mem):
    from langchain_classic.retrievers import ContextualCompressionRetriever

    base = ReflectiveRetriever(memory=mem, user_id="ana", k=6)
    ccr = ContextualCompressionRetriever(
        base_compressor=ReflectiveCompressor(memory=mem, user_id="ana", top_n=2),
        base_retriever=base,
    )
    assert isinstance(ccr, BaseRetriever)
    docs = ccr.invoke("half marathon in Lyon")
    assert len(docs) == 2
    assert "marathon" in docs[0].page_content
    assert docs[0].metadata["memory_id"]  # retriever metadata survive


async def test_async_compress(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=1)
    out = await comp.acompress_documents(DOCS, "airport trains")
    assert [d.id for d in out] == ["d"]


def test_bad_input(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana")
    with pytest.raises(InvalidInputError):
        comp.compress_documents(DOCS, " ")
    with pytest.raises(InvalidInputError):
        comp.feedback("q", [], "[0]")
    with pytest.raises(ValueError):
        ReflectiveCompressor(memory=mem, user_id="ana", top_n=0)


# -- the engine's reranker ----------------------------------------------------------------------

BREAD_QUERY = "bread bakery"


def _learning_memory(path=None, **cfg) -> ReflectiveMemory:
    config = MemoryConfig(  # a full reranker per user (the per-user maps these tests inspect)
        units={"granularities": ("turn",)},
        rerank={"batch_size": 1, "learning_rate": 0.05, "scope": "isolated", "features": ("cost",)},
    ).replace(**cfg)
    return populate(ReflectiveMemory(path, embedder=HashingEmbedder(), config=config))


def _train_second_first(comp: ReflectiveCompressor, rounds: int = 60) -> str:
    """Cite the document ranked second until it ranks first; return its id."""
    second = comp.compress_documents(DOCS, BREAD_QUERY)[1].id
    for _ in range(rounds):
        shown = comp.compress_documents(DOCS, BREAD_QUERY)
        if shown[0].id == second:
            break
        cited = [i for i, d in enumerate(shown) if d.id == second]
        comp.feedback(BREAD_QUERY, shown, f"It is there {cited}." if cited else "[NO_CITE]")
    return second


def test_default_is_the_engines_reranker_for_the_user(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    assert comp.get_reranker() is mem.rerank_stage.reranker("ana")
    assert comp.get_reranker() is not mem.rerank_stage.reranker("bob")


def test_feedback_trains_persists_and_isolates_the_engines_reranker(tmp_path):
    mem = _learning_memory(tmp_path / "store")
    before = mem.retrieve("ana", "my cat Miso", k=3)
    assert before.diagnostics["rerank"]["updates"] == 0
    comp = CitationReranker(memory=mem, user_id="ana", top_n=2)
    report = comp.feedback(BREAD_QUERY, comp.compress_documents(DOCS, BREAD_QUERY), "Yes [1].")
    assert report.learned and report.updates == 1 and report.pending == 0
    second = _train_second_first(comp)
    assert comp.compress_documents(DOCS, BREAD_QUERY)[0].id == second
    ana = mem.rerank_stage.reranker("ana")
    n = ana.n_updates_
    assert n >= 2 and not ana.is_identity
    # memory.retrieve applies the reranker the compressor trained ...
    assert mem.retrieve("ana", "my cat Miso", k=3).diagnostics["rerank"]["updates"] == n
    # ... and bob's stays untouched (rerank_scope="user")
    assert mem.retrieve("bob", "my cat", k=1).diagnostics["rerank"]["updates"] == 0
    assert mem.rerank_stage.reranker("bob").is_identity
    w_q = ana.w_q_.detach().clone()
    mem.close()

    reopened = ReflectiveMemory(tmp_path / "store", embedder=HashingEmbedder(), config=mem.config)
    again = CitationReranker(memory=reopened, user_id="ana", top_n=2)
    assert again.get_reranker().n_updates_ == n
    assert bool((again.get_reranker().w_q_ == w_q).all())
    assert again.compress_documents(DOCS, BREAD_QUERY)[0].id == second
    assert reopened.retrieve("ana", "my cat Miso", k=3).diagnostics["rerank"]["updates"] == n
    assert reopened.rerank_stage.reranker("bob").is_identity
    reopened.close()


def test_shared_scope_feedback_reaches_every_user():
    mem = _learning_memory(rerank={"scope": "shared"})
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    comp.feedback(BREAD_QUERY, comp.compress_documents(DOCS, BREAD_QUERY), "[0]")
    assert mem.retrieve("bob", "my cat", k=1).diagnostics["rerank"]["updates"] == 1


def test_engine_reranker_buffers_until_a_batch_is_full(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)  # rerank_batch_size=4
    shown = comp.compress_documents(DOCS, BREAD_QUERY)
    first = comp.feedback(BREAD_QUERY, shown, "[0]")
    assert first.learned and first.updates == 0 and first.pending == 1
    assert mem.rerank_stage.reranker("ana").is_identity


def test_citations_parsed_by_the_core_parser(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=3)
    shown = comp.compress_documents(DOCS, BREAD_QUERY)
    report = comp.feedback(BREAD_QUERY, shown, "Memory [2] and [0-1], again [2], not [9].")
    assert report.cited == (2, 0, 1) and list(report.rewards.values()) == [1.0, 1.0, 1.0]
    assert report.repeated == 1 and report.out_of_range == 1
