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


def test_the_fitted_rankers_order_when_learning_is_off():
    off = ReflectiveMemory(
        embedder=HashingEmbedder(), config=MemoryConfig(rerank={"enabled": False})
    )
    comp = ReflectiveCompressor(memory=off, user_id="ana", top_n=2)
    assert comp.get_reranker() is None
    out = comp.compress_documents(DOCS, "where can I buy sourdough bread at the bakery")
    assert [d.id for d in out] == ["c", "b"]
    assert out[0].metadata["relevance_score"] >= out[1].metadata["relevance_score"]
    assert out[0].metadata["cosine_score"] >= out[1].metadata["cosine_score"]
    assert DOCS[2].metadata == {}  # inputs are not mutated
    assert comp.compress_documents([], "x") == []
    report = comp.feedback("q", out, "It is [0].")
    assert isinstance(report, FeedbackResult)
    assert report.cited == (0,) and list(report.rewards.values()) == [1.0, -1.0]
    assert not report.learned and "learning is off" in report.reason
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
    config = MemoryConfig(  # each feedback stored at once, steps large enough to see
        units={"granularities": ("turn",)},
        rerank={"save_every": 1, "turn_learning_rate": 0.5, "turn_user_learning_rate": 0.5},
    ).replace(**cfg)
    return populate(ReflectiveMemory(path, embedder=HashingEmbedder(), config=config))


def _train_last_first(comp: ReflectiveCompressor, rounds: int = 60) -> str:
    """Cite the document ranked last until it ranks first; return its id."""
    last = comp.compress_documents(DOCS, BREAD_QUERY)[-1].id
    for _ in range(rounds):
        shown = comp.compress_documents(DOCS, BREAD_QUERY)
        if shown[0].id == last:
            break
        cited = [i for i, d in enumerate(shown) if d.id == last]
        comp.feedback(BREAD_QUERY, shown, f"It is there {cited}.")
    return last


def test_default_is_the_memorys_turn_ranker(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    assert comp.get_reranker() is None  # the memory's citation-taught turn ranker ranks


def test_feedback_trains_persists_and_isolates_the_memorys_turn_ranker(tmp_path):
    mem = _learning_memory(
        tmp_path / "store", rerank={"scope": "isolated", "save_every": 1, "turn_pull": 0.0}
    )
    comp = CitationReranker(memory=mem, user_id="ana", top_n=4)
    report = comp.feedback(BREAD_QUERY, comp.compress_documents(DOCS, BREAD_QUERY), "Yes [1].")
    assert report.learned and report.pending == 0
    second = _train_last_first(comp)
    assert comp.compress_documents(DOCS, BREAD_QUERY)[0].id == second
    ana = mem.ranker_weights("ana")
    n = ana["user_episodes"]
    assert n >= 2 and ana["weights"] != ana["prior"]
    # memory.retrieve ranks with the weights the compressor taught ...
    assert mem.retrieve("ana", "my cat Miso", budget_tokens=200).rerank.updates == 0  # isolated
    # ... and bob's stay untouched (scope isolated: no shared offsets)
    assert mem.ranker_weights("bob")["weights"] == mem.ranker_weights("bob")["prior"]
    mem.close()

    reopened = ReflectiveMemory(tmp_path / "store", embedder=HashingEmbedder(), config=mem.config)
    again = CitationReranker(memory=reopened, user_id="ana", top_n=4)
    assert reopened.ranker_weights("ana")["user_episodes"] == n
    assert reopened.ranker_weights("ana")["weights"] == pytest.approx(ana["weights"], abs=1e-7)
    assert again.compress_documents(DOCS, BREAD_QUERY)[0].id == second
    assert reopened.ranker_weights("bob")["weights"] == reopened.ranker_weights("bob")["prior"]
    reopened.close()


def test_shared_scope_feedback_reaches_every_user():
    mem = _learning_memory(rerank={"scope": "shared", "save_every": 1, "turn_learning_rate": 0.5})
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    first = comp.feedback(BREAD_QUERY, comp.compress_documents(DOCS, BREAD_QUERY), "[1]")
    assert first.learned and not first.serving  # taught, not yet proven
    assert mem.retrieve("bob", "my cat", budget_tokens=200).rerank.updates == 1
    assert mem.ranker_weights("bob")["weights"] == mem.ranker_weights("bob")["prior"]
    for _ in range(150):
        f = comp.feedback(BREAD_QUERY, comp.compress_documents(DOCS, BREAD_QUERY), "[1]")
        if f.serving:
            break
    assert f.serving  # consistent citations pass the gate: every user ranks with them
    assert mem.ranker_weights("bob")["weights"] != mem.ranker_weights("bob")["prior"]


def test_feedback_waits_in_memory_until_a_save(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=2)
    shown = comp.compress_documents(DOCS, BREAD_QUERY)
    first = comp.feedback(BREAD_QUERY, shown, "[0]")
    assert first.learned and first.pending == 1  # stored after `rerank.save_every` episodes
    assert mem.ranker_weights("ana")["user_episodes"] == 1


def test_citations_parsed_by_the_core_parser(mem):
    comp = ReflectiveCompressor(memory=mem, user_id="ana", top_n=3)
    shown = comp.compress_documents(DOCS, BREAD_QUERY)
    report = comp.feedback(BREAD_QUERY, shown, "Memory [2] and [0-1], again [2], not [9].")
    assert report.cited == (2, 0, 1) and list(report.rewards.values()) == [1.0, 1.0, 1.0]
    assert report.repeated == 1 and report.out_of_range == 1
