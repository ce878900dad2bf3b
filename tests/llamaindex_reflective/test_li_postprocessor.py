import asyncio
from typing import Any

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.base.response.schema import Response
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.query_engine import CitationQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_reflective import ReflectiveEmbedding, ReflectiveNodePostprocessor
from shared import ConfigError, InvalidInputError

TEXTS = [
    "The cat sleeps on the sofa all afternoon.",
    "My dog Pixel loves running on the beach.",
    "Paris is the capital of France.",
    "Pixel the dog barks at the mailman.",
    "I bought a new laptop for work.",
]


def _nodes():
    return [
        NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata={"i": i}), score=1.0 - i / 10)
        for i, t in enumerate(TEXTS)
    ]


class Recorder(BaseEventHandler):
    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event, **kwargs) -> None:
        self.events.append(event)


class FakeReranker:
    """Cosine scores plus a learned bonus per candidate vector; records episodes."""

    def __init__(self):
        self.episodes = []
        self.bonus = None

    def score(self, query, candidates, prior=None):
        s = candidates @ query
        if self.bonus is not None:
            s = s + candidates @ self.bonus
        return s

    def partial_fit(self, episode):
        self.episodes.append(episode)
        grad = sum(
            r * episode.candidates[p] for p, r in zip(episode.shown, episode.rewards, strict=True)
        )
        self.bonus = grad if self.bonus is None else self.bonus + grad
        return self


class ScriptedLLM(CustomLLM):
    outputs: list = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.outputs.pop(0))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
        raise NotImplementedError


def test_reranks_by_core_embedder_and_keeps_nodes(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=2)
    nodes = _nodes()
    out = pp.postprocess_nodes(nodes, query_str="Pixel the dog")
    assert {n.node.node_id for n in out} == {"n1", "n3"}
    assert out[0].score >= out[1].score
    by_id = {n.node.node_id: n.node for n in nodes}
    for n in out:
        assert n.node is by_id[n.node.node_id]  # same node: id, text and metadata untouched
        assert n.node.metadata == {"i": int(n.node.node_id[1:])}
    assert ReflectiveNodePostprocessor.class_name() == "ReflectiveNodePostprocessor"
    assert "memory" not in pp.to_dict() and pp.to_dict()["user_id"] == "ana"
    assert pp.postprocess_nodes([], query_str="x") == []


def test_candidate_k_limits_the_pool(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=3, candidate_k=2)
    out = pp.postprocess_nodes(_nodes(), query_str="Pixel the dog barks")
    assert {n.node.node_id for n in out} == {"n1", "n0"}  # n3 was not a candidate


def test_emits_rerank_events(mem):
    rec = Recorder(events=[])
    root = get_dispatcher()
    root.add_event_handler(rec)
    try:
        pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=1)
        out = pp.postprocess_nodes(_nodes(), query_str="dog")
    finally:
        root.event_handlers.remove(rec)
    starts = [e for e in rec.events if isinstance(e, ReRankStartEvent)]
    ends = [e for e in rec.events if isinstance(e, ReRankEndEvent)]
    assert len(starts) == 1 and starts[0].top_n == 1 and len(starts[0].nodes) == 5
    assert starts[0].model_name.startswith("reflective-reranker")
    assert len(ends) == 1 and [n.node.node_id for n in ends[0].nodes] == [
        n.node.node_id for n in out
    ]


def test_async_matches_sync(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=3)
    sync = pp.postprocess_nodes(_nodes(), query_str="capital of France")
    asyn = asyncio.run(
        pp.apostprocess_nodes(_nodes(), query_bundle=QueryBundle("capital of France"))
    )
    assert [n.node.node_id for n in sync] == [n.node.node_id for n in asyn]
    assert sync[0].node.node_id == "n2"


def test_denoised_keys_score_but_text_stays(mem):
    class DropDogWords:
        def denoise(self, texts):
            return [
                " ".join(w for w in t.split() if "Pixel" not in w and "dog" not in w) for t in texts
            ]

    plain = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=1)
    noisy = ReflectiveNodePostprocessor(
        memory=mem, user_id="ana", top_n=1, denoise=True, denoiser=DropDogWords()
    )
    assert plain.postprocess_nodes(_nodes(), query_str="Pixel dog")[0].node.node_id in {"n1", "n3"}
    out = noisy.postprocess_nodes(_nodes(), query_str="Pixel dog")
    assert out[0].node.node_id not in {"n1", "n3"}
    assert out[0].node.get_content() in TEXTS
    with pytest.raises(ConfigError):
        ReflectiveNodePostprocessor(memory=mem, user_id="ana", denoise=True)


def test_recollection_hook_chooses_candidates(mem):
    seen = {}

    def recollector(q, vecs, k):
        seen["shape"], seen["k"] = vecs.shape, k
        return [4, 2, 4]  # duplicates are dropped

    pp = ReflectiveNodePostprocessor(
        memory=mem, user_id="ana", top_n=5, candidate_k=2, recollect=True, recollector=recollector
    )
    out = pp.postprocess_nodes(_nodes(), query_str="dog")
    assert {n.node.node_id for n in out} == {"n4", "n2"}
    assert seen == {"shape": (5, 128), "k": 2}


def test_bad_input(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana")
    with pytest.raises(InvalidInputError):
        pp.postprocess_nodes(_nodes())
    with pytest.raises(InvalidInputError):
        ReflectiveNodePostprocessor(memory=mem, user_id=" ")
    with pytest.raises(InvalidInputError):
        ReflectiveNodePostprocessor(memory=object(), user_id="ana")
    with pytest.raises(ValueError):
        ReflectiveNodePostprocessor(memory=mem, user_id="ana", unknown=1)


def test_feedback_maps_citations_and_trains(mem):
    rr = FakeReranker()
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=3, reranker=rr)
    shown = pp.postprocess_nodes(_nodes(), query_str="Pixel dog beach")
    ids = [n.node.node_id for n in shown]
    resp = Response(response="Pixel runs on the beach [2].", source_nodes=shown)
    pytest.importorskip("shared.rerank")
    report = pp.feedback(resp)
    assert report["signal"] == "citations" and report["trained"]
    assert report["rewards"] == [-1.0, 1.0, -1.0]
    assert len(rr.episodes) == 1 and rr.episodes[0].shown == report["shown"]
    # the cited node now ranks first for the same query
    again = pp.postprocess_nodes(_nodes(), query_str="Pixel dog beach")
    assert again[0].node.node_id == ids[1]


def test_feedback_without_reranker_reports_only(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=2)
    shown = pp.postprocess_nodes(_nodes(), query_str="Pixel dog")
    report = pp.feedback(Response(response="I do not know. [NO_CITE]", source_nodes=shown))
    assert report["rewards"] == [-1.0, -1.0] and report["signal"] == "citations"
    assert report["trained"] is False
    none = pp.feedback(Response(response="no citations at all", source_nodes=shown))
    assert none["signal"] == "none"
    given = pp.feedback(Response(response="x", source_nodes=shown), cited=[1])
    assert given["rewards"] == [1.0, -1.0] and given["signal"] == "given"
    with pytest.raises(InvalidInputError):
        pp.feedback(Response(response="[1]", source_nodes=[]))
    other = NodeWithScore(node=TextNode(text="never ranked", id_="zz"))
    with pytest.raises(InvalidInputError):
        pp.feedback(Response(response="[1]", source_nodes=[other]))


def test_query_engines_with_postprocessor(mem):
    embed = ReflectiveEmbedding(embedder=mem.embedder)
    index = VectorStoreIndex([n.node for n in _nodes()], embed_model=embed)
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=2)
    llm = ScriptedLLM(outputs=["Pixel barks [2].", "Pixel [1]."])
    qe = index.as_query_engine(llm=llm, similarity_top_k=5, node_postprocessors=[pp])
    resp = qe.query("What does Pixel the dog do?")
    assert len(resp.source_nodes) == 2
    assert {n.node.node_id for n in resp.source_nodes} <= {"n1", "n3", "n0", "n2", "n4"}
    report = pp.feedback(resp)
    assert report["cited"] == [report["shown"][1]]
    # CitationQueryEngine re-chunks nodes under new ids; feedback still finds them
    cqe = CitationQueryEngine.from_args(
        index, llm=llm, similarity_top_k=5, node_postprocessors=[pp], citation_chunk_size=512
    )
    cresp = cqe.query("Who is Pixel?")
    assert all(n.node.node_id not in {"n0", "n1", "n2", "n3", "n4"} for n in cresp.source_nodes)
    creport = pp.feedback(cresp)
    assert creport["cited"] == [creport["shown"][0]]
    assert Settings is not None
