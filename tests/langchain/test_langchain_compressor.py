from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from langchain_reflective import CitationReranker, ReflectiveCompressor, ReflectiveRetriever
from shared import InvalidInputError

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


def _no_core_reranker(monkeypatch):
    import langchain_reflective.compressor as comp

    monkeypatch.setattr(comp, "_default_reranker", lambda dim, top_m: None)


def test_cosine_order_without_reranker(mem, monkeypatch):
    _no_core_reranker(monkeypatch)
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    out = comp.compress_documents(DOCS, "where can I buy sourdough bread at the bakery")
    assert [d.id for d in out] == ["c", "b"]
    assert out[0].metadata["relevance_score"] >= out[1].metadata["relevance_score"]
    assert out[0].metadata["cosine_score"] == out[0].metadata["relevance_score"]
    assert DOCS[2].metadata == {}  # inputs are not mutated
    assert comp.compress_documents([], "x") == []
    report = comp.feedback("q", out, "It is [0].")
    assert report == {"cited": [0], "rewards": [1.0, -1.0], "trained": False}


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
    assert report["cited"] == [1] and report["rewards"] == [-1.0, 1.0] and report["trained"]
    ep = rr.episodes[0]
    assert ep.candidates.shape == (4, mem.embedder.dim)  # all candidates, not only the shown
    assert ep.shown == [int(i) for i in np.argsort(prior)[:2]]
    np.testing.assert_array_equal(ep.rewards, [-1.0, 1.0])

    # documents never compressed here: learned from as given
    comp.feedback("other question", DOCS[:3], "[NO_CITE]")
    ep2 = rr.episodes[1]
    assert ep2.shown == [0, 1, 2] and ep2.rewards.tolist() == [-1.0, -1.0, -1.0]


def test_inside_contextual_compression_retriever(mem, monkeypatch):
    from langchain_classic.retrievers import ContextualCompressionRetriever

    _no_core_reranker(monkeypatch)
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


async def test_async_compress(mem, monkeypatch):
    _no_core_reranker(monkeypatch)
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


def test_core_rmm_reranker_learns_from_citations(mem):
    rerank = pytest.importorskip("shared.rerank")
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    assert isinstance(comp.get_reranker(), rerank.Reranker)
    comp.reranker = rerank.Reranker(mem.embedder.dim, top_m=2, learning_rate=0.05)
    query = "bread bakery"
    first, second = (d.id for d in comp.compress_documents(DOCS, query))
    for _ in range(60):
        shown = comp.compress_documents(DOCS, query)
        if shown[0].id == second:
            break
        cited = [i for i, d in enumerate(shown) if d.id == second]
        comp.feedback(query, shown, f"{cited}" if cited else "[NO_CITE]")
    assert comp.compress_documents(DOCS, query)[0].id == second
