import asyncio
from typing import Any

import numpy as np
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
from reflective_memory import (
    ConfigError,
    FeedbackResult,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)
from reflective_memory.rmm.episodes import RerankResult

from llamaindex_reflective import ReflectiveEmbedding, ReflectiveNodePostprocessor

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

    def rerank(self, query, candidates, prior=None, *, explore=False):
        s = candidates @ query
        if self.bonus is not None:
            s = s + candidates @ self.bonus
        return RerankResult([int(i) for i in np.argsort(-s, kind="stable")], s, False)

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
    mem.denoiser = None  # neither the postprocessor nor the memory has a denoiser
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
    report = pp.feedback(resp)
    assert isinstance(report, FeedbackResult)
    assert report.learned and not report.reason and report.cited == (1,)
    assert list(report.rewards.values()) == [-1.0, 1.0, -1.0] and list(report.rewards) == ids
    assert report.retrieval_id == pp.rankings[-1].ranking_id
    assert len(rr.episodes) == 1 and rr.episodes[0].shown == pp.rankings[-1].shown
    # the cited node now ranks first for the same query
    again = pp.postprocess_nodes(_nodes(), query_str="Pixel dog beach")
    assert again[0].node.node_id == ids[1]


def test_feedback_without_reranker_reports_only():
    cfg = MemoryConfig(units={"granularities": ("turn",)}, rerank={"enabled": False})
    mem = ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg)
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=2)
    assert pp._reranker() is None
    shown = pp.postprocess_nodes(_nodes(), query_str="Pixel dog")
    report = pp.feedback(Response(response="I do not know. [NO_CITE]", source_nodes=shown))
    assert list(report.rewards.values()) == [-1.0, -1.0] and report.no_cite
    assert report.learned is False and "learning is off" in report.reason
    none = pp.feedback(Response(response="no citations at all", source_nodes=shown))
    assert not none.learned and none.cited == () and none.rewards == {}
    assert "learning is off" in none.reason or "no citation" in none.reason
    given = pp.feedback(Response(response="x", source_nodes=shown), cited=[1])
    assert list(given.rewards.values()) == [1.0, -1.0] and given.cited == (0,)
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
    assert report.cited == (1,)
    # CitationQueryEngine re-chunks nodes under new ids; feedback still finds them
    cqe = CitationQueryEngine.from_args(
        index, llm=llm, similarity_top_k=5, node_postprocessors=[pp], citation_chunk_size=512
    )
    cresp = cqe.query("Who is Pixel?")
    assert all(n.node.node_id not in {"n0", "n1", "n2", "n3", "n4"} for n in cresp.source_nodes)
    creport = pp.feedback(cresp)
    assert creport.cited == (0,)
    assert Settings is not None


# -- the engine's reranker, denoiser and recall ---------------------------------------------------

PIXEL_QUERY = "Pixel dog beach"


def _learning_memory(path=None, **cfg) -> ReflectiveMemory:
    config = MemoryConfig(  # each feedback stored at once, steps large enough to see
        units={"granularities": ("turn",)},
        rerank={"save_every": 1, "turn_learning_rate": 0.5, "turn_user_learning_rate": 0.5},
    ).replace(**cfg)
    mem = ReflectiveMemory(path, embedder=HashingEmbedder(128), config=config)
    for user, texts in (("ana", TEXTS), ("bob", ["My bike is red.", "I like tea."])):
        mem.add_turns(
            [{"user_id": user, "session_id": "s1", "role": "user", "text": t} for t in texts]
        )
        mem.end_session(user, "s1")
    return mem


def _train_last_first(pp: ReflectiveNodePostprocessor, rounds: int = 30) -> str:
    """Cite the node ranked last until it ranks first; return its id."""
    last = pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)[-1].node.node_id
    for _ in range(rounds):
        shown = pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)
        if shown[0].node.node_id == last:
            break
        cited = [i + 1 for i, n in enumerate(shown) if n.node.node_id == last]
        pp.feedback(Response(response=f"Source {cited[0]} says so.", source_nodes=shown))
    return last


def test_default_is_the_memorys_turn_ranker(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana")
    assert pp._reranker() is None
    assert pp.model_name == "reflective-reranker:turn-ranker"


def test_feedback_trains_persists_and_isolates_the_memorys_turn_ranker(tmp_path):
    mem = _learning_memory(
        tmp_path / "store",
        rerank={
            "scope": "isolated",
            "save_every": 1,
            "turn_pull": 0.0,
            "turn_user_learning_rate": 0.5,
        },
    )
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=len(TEXTS))
    shown = pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)
    report = pp.feedback(Response(response="It runs there [2][1].", source_nodes=shown))
    assert report.learned and list(report.rewards.values())[:2] == [1.0, 1.0]
    start = [n.node.node_id for n in pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)]
    last = _train_last_first(pp, rounds=150)
    now = [n.node.node_id for n in pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)]
    assert now.index(last) < start.index(last)  # the cited node moved up
    ana = mem.ranker_weights("ana")
    assert ana["user_episodes"] >= 2 and ana["weights"] != ana["prior"]
    # bob's weights are untouched (scope isolated)
    assert mem.ranker_weights("bob")["weights"] == mem.ranker_weights("bob")["prior"]
    mem.close()

    reopened = ReflectiveMemory(
        tmp_path / "store", embedder=HashingEmbedder(128), config=mem.config
    )
    again = ReflectiveNodePostprocessor(memory=reopened, user_id="ana", top_n=len(TEXTS))
    assert reopened.ranker_weights("ana")["weights"] == pytest.approx(ana["weights"], abs=1e-7)
    again_ids = [n.node.node_id for n in again.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)]
    assert again_ids == now
    assert reopened.ranker_weights("bob")["weights"] == reopened.ranker_weights("bob")["prior"]
    reopened.close()


def test_shared_scope_feedback_reaches_every_user():
    mem = _learning_memory(rerank={"scope": "shared", "save_every": 1})
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=2)
    shown = pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)
    assert pp.feedback(Response(response="[1]", source_nodes=shown)).learned
    assert mem.retrieve("bob", "bike", budget_tokens=100).rerank.updates == 1


def test_citations_parsed_by_the_core_parser(mem):
    pp = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=4)
    shown = pp.postprocess_nodes(_nodes(), query_str=PIXEL_QUERY)
    resp = Response(response="See [3], Source 1 and [1-2]; [7] is no source.", source_nodes=shown)
    report = pp.feedback(resp)
    assert list(report.rewards.values()) == [1.0, 1.0, 1.0, -1.0] and report.out_of_range == 1
    assert report.learned and report.pending == 1  # stored after `rerank.save_every` episodes


CHATTY = [
    "oh wow, yeah, I really really like that, honestly it is so so nice, like totally great, "
    "thanks so much!",
    "yeah so um I finally adopted a beagle puppy, I named him Rex, honestly I really love him",
    "okay cool, yeah, sure, that sounds great, I will think about it, thanks, really",
    "The train to Lyon leaves at 7:40 from platform 3",
]


def _chatty_nodes():
    return [
        NodeWithScore(node=TextNode(text=t, id_=f"c{i}"), score=1.0) for i, t in enumerate(CHATTY)
    ]


def test_denoise_uses_the_engines_denoiser_on_chatty_text():
    cfg = MemoryConfig(denoise={"kind": "offline", "rate": 0.4})  # the offline denoiser, opted in
    mem = ReflectiveMemory(embedder=HashingEmbedder(), config=cfg)
    query = "what's the name of my puppy?"
    raw = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=4)
    clean = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=4, denoise=True)
    assert clean._denoiser() is mem.denoiser
    raw_out = raw.postprocess_nodes(_chatty_nodes(), query_str=query)
    out = clean.postprocess_nodes(_chatty_nodes(), query_str=query)
    assert out[0].node.node_id == "c1"  # scored on its denoised key, the fact wins

    def cosine_of_fact(pp):
        ranked = pp.rankings[-1].ranked
        return dict(zip(ranked.order, ranked.cosines, strict=True))[1]

    assert cosine_of_fact(clean) > cosine_of_fact(raw)  # fillers no longer dilute its key
    assert raw_out[0].node.get_content() == CHATTY[1]
    assert {n.node.get_content() for n in out} == set(CHATTY)  # node text is not changed
    # feedback learns from the denoised keys that were scored
    report = clean.feedback(Response(response="Rex [1].", source_nodes=out))
    keys = mem.denoiser.denoise(list(CHATTY))
    assert report.cited == (0,) and clean.rankings[-1].shown[0] == 1
    assert report.learned and clean.rankings[-1].ranked.texts == tuple(keys)


def test_failing_denoiser_scores_raw_text(mem, caplog):
    class Broken:
        def denoise(self, texts):
            raise RuntimeError("model unavailable")

    plain = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=5)
    broken = ReflectiveNodePostprocessor(
        memory=mem, user_id="ana", top_n=5, denoise=True, denoiser=Broken()
    )
    expected = [
        (n.node.node_id, n.score) for n in plain.postprocess_nodes(_nodes(), query_str="dog")
    ]
    with caplog.at_level("WARNING"):
        got = [
            (n.node.node_id, n.score) for n in broken.postprocess_nodes(_nodes(), query_str="dog")
        ]
    assert got == expected and "denoiser failed" in caplog.text


def _buried_nodes():
    """A retriever's poor ranking: the three notes about the dog come last of fourteen."""
    texts = [
        f"Meeting notes {i}: budget review for the quarter, slides and spreadsheets"
        for i in range(6)
    ]
    texts += [f"Recipe {i}: pasta with tomato sauce, garlic and basil" for i in range(5)]
    texts += [
        "My beagle Rex chews every shoe in the house",
        "Rex the beagle loves the dog park on Sundays",
        "I take Rex to the vet for his vaccines in May",
    ]
    return [
        NodeWithScore(node=TextNode(text=t, id_=f"b{i}"), score=1.0) for i, t in enumerate(texts)
    ]


def test_recollect_uses_shared_recall_with_the_engines_settings(mem, monkeypatch):
    import llamaindex_reflective.postprocessor as mod

    query = "what does my beagle Rex do"
    dog = {"b11", "b12", "b13"}
    first = ReflectiveNodePostprocessor(memory=mem, user_id="ana", top_n=3, candidate_k=3)
    assert (
        not {n.node.node_id for n in first.postprocess_nodes(_buried_nodes(), query_str=query)}
        & dog
    )
    seen = []
    real = mod.recall

    def spy(index, q, k, config):
        seen.append((index.ntotal, k, config.mode, config.alpha))
        return real(index, q, k, config)

    monkeypatch.setattr(mod, "recall", spy)
    pp = ReflectiveNodePostprocessor(
        memory=mem, user_id="ana", top_n=3, candidate_k=3, recollect=True
    )
    out = pp.postprocess_nodes(_buried_nodes(), query_str=query)
    assert len({n.node.node_id for n in out} & dog) >= 2
    # the engine's familiarity default becomes recollection; other settings are the engine's
    assert seen == [(14, 3, "recollection", mem.config.recall.alpha)]
    mem.config = mem.config.replace(recall={"mode": "rfmem", "alpha": 0.3})
    pp.postprocess_nodes(_buried_nodes(), query_str=query)
    assert seen[-1] == (14, 3, "rfmem", 0.3)
