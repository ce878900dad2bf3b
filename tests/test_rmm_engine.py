import dataclasses

import numpy as np
import pytest
from reflective_memory import (
    HashingEmbedder,
    MemoryConfig,
    RankedTexts,
    ReflectiveMemory,
    RerankRecord,
)
from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.rmm.citations import build_answer_prompt
from reflective_memory.rmm.rerankers import PRIOR_OWNER, RERANKER_STATE

FACTS = [
    "I adopted a beagle called Rex last week",
    "My sister lives in Porto and teaches piano",
    "I am allergic to peanuts and shellfish",
    "I run every Tuesday along the river",
    "My favourite film is Spirited Away",
    "I work night shifts as a nurse",
    "We repainted the kitchen a pale green",
    "I am learning Japanese on weekends",
]


def _fill(mem, user="u1"):
    for i, fact in enumerate(FACTS):
        mem.add_turn(user, f"s{i}", "user", fact, timestamp=f"2024-03-0{i % 9 + 1}")
        mem.add_turn(user, f"s{i}", "assistant", "Thanks for telling me.")
        mem.end_session(user, f"s{i}")


def _cfg(**kw):
    base = MemoryConfig(
        units={"granularities": ("turn",)},
        search={"mode": "dense"},
        rerank={"top_k": 8, "top_m": 3},
        denoise={"kind": "none"},  # raw keys: these hashing-embedder examples match on stopwords
    )
    return base.replace(**kw)


class ScriptedLLM:
    def __init__(self, extraction, update=()):
        self.extraction, self.update, self.prompts = list(extraction), list(update), []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        queue = self.update if "Add()" in prompt else self.extraction
        if not queue:
            raise RuntimeError("script exhausted")
        return queue.pop(0)


def test_prospective_reflection_through_engine():
    llm = ScriptedLLM(
        extraction=[
            '```json\n{"extracted_memories": [{"summary": "The user has a beagle named Rex.",'
            ' "reference": [0]},]}\n```',
            "NO_TRAIT",
            '{"extracted_memories": [{"summary": "The user\'s beagle Rex is one year old.",'
            ' "reference": ["[0]"]}]}',
            "NO_TRAIT",
        ],
        update=["Merge(0, The user has a one-year-old beagle named Rex.)"],
    )
    cfg = _cfg(topics={"enabled": True}, units={"granularities": ("segment",)})
    with ReflectiveMemory(embedder=HashingEmbedder(), llm=llm, config=cfg) as mem:
        mem.add_turn("u1", "a", "user", "I adopted a beagle called Rex", timestamp="2024-01-02")
        mem.add_turn("u1", "a", "assistant", "Lovely!")
        out = mem.end_session("u1", "a")
        topics = [m for m in out if m.granularity == "topic"]
        assert len(topics) == 1 and topics[0].key == "The user has a beagle named Rex."
        assert "user: I adopted a beagle called Rex" in topics[0].text
        assert any(m.granularity == "segment" for m in out)  # segments are kept
        mem.add_turn("u1", "b", "user", "Rex turned one today", timestamp="2024-06-02")
        mem.add_turn("u1", "b", "assistant", "Happy birthday Rex!")
        out2 = mem.end_session("u1", "b")
        merged = [m for m in out2 if m.granularity == "topic"]
        assert len(merged) == 1 and merged[0].id == topics[0].id
        assert merged[0].turn_ids == ("a:0", "b:0")
        assert mem.stats("u1")["memories_by_granularity"]["topic"] == 1
        hit = mem.retrieve("u1", "How old is my beagle Rex?", k=1).hits[0]
        # the topic and segment keys found it; the reader gets the turn they were built from
        assert hit.memory.granularity == "passage" and hit.memory.turn_ids[0] in ("a:0", "b:0")
        assert set(hit.memory.metadata["sources"]) & {topics[0].id} | {
            m.id for m in out + out2 if m.granularity == "segment"
        }
        rep = mem.reflection_report("u1", "b")
        assert rep["merged"] == [topics[0].id] and rep["usage"]["llm_calls"] == 3


def test_reflection_failure_never_loses_the_session():
    def broken(prompt):
        return "total nonsense"

    cfg = _cfg(topics={"enabled": True})
    with ReflectiveMemory(embedder=HashingEmbedder(), llm=broken, config=cfg) as mem:
        mem.add_turn("u1", "a", "user", "I adopted a beagle called Rex")
        out = mem.end_session("u1", "a")
        assert [m.granularity for m in out] == ["turn"]
        rep = mem.reflection_report("u1", "a")
        assert rep["unusable_outputs"] == 1 and rep["usage"]["failures"] == 1


def test_reflection_off_without_llm_or_option():
    assert (
        ReflectiveMemory(
            embedder=HashingEmbedder(), config=_cfg(topics={"enabled": True})
        ).reflector
        is None
    )
    assert (
        ReflectiveMemory(embedder=HashingEmbedder(), llm=lambda p: "", config=_cfg()).reflector
        is None
    )


def test_untrained_reranker_keeps_retriever_order_and_reports_it():
    with ReflectiveMemory(
        embedder=HashingEmbedder(), config=_cfg(search={"mode": "hybrid"})
    ) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "what dog did I adopt", k=6)
        with ReflectiveMemory(
            embedder=HashingEmbedder(),
            config=_cfg(search={"mode": "hybrid"}, rerank={"enabled": False}),
        ) as plain:
            _fill(plain)
            base = plain.retrieve("u1", "what dog did I adopt", k=6)
        assert [h.memory.text for h in r] == [h.memory.text for h in base]
        info = r.diagnostics["rerank"]
        assert info["retriever_order"] == info["reranked_order"] and not info["explored"]
        assert "rerank" in r.diagnostics["timings_ms"]


def test_ranking_continues_past_the_reranked_head():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg(rerank={"top_k": 4})) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "nurse", k=7)
        assert len(r.hits) == 7 and len(r.diagnostics["rerank"]["retriever_order"]) == 4
        # the assistant's "Thanks for telling me.", said in every session, takes one slot at most
        hits = mem.retrieve("u1", "nurse", k=16).hits
        assert sum("Thanks" in h.memory.text for h in hits) <= 1


def test_isolated_scope_learns_and_persists_per_user(tmp_path):
    cfg = _cfg(rerank={"scope": "isolated", "batch_size": 2, "seed": 0, "explore": True})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem, "u1")
        _fill(mem, "u2")
        # a question in the past: "what pet do I have" would lift the newer near-ties of this
        # hashing embedder above the beagle (present tense prefers newer sessions)
        r = mem.retrieve("u1", "what pet did I adopt", k=5)
        target = next(i for i, h in enumerate(r.hits) if "beagle" in h.memory.text)
        f1 = mem.feedback(r, f"You have a beagle named Rex. [{target}]")
        assert f1.learned and f1.cited == (target,) and not f1.inferred
        assert f1.updates == 0 and f1.pending == 1
        assert f1.rewards[r.hits[target].memory.id] == 1.0
        assert sorted(f1.rewards.values()).count(-1.0) == len(r.hits) - 1
        r2 = mem.retrieve("u1", "what pet do I have")
        f2 = mem.feedback(r2, cited=[0])
        assert f2.updates == 1 and f2.loss is not None
        assert not mem.rerank_stage.reranker("u1").is_identity
        assert mem.rerank_stage.reranker("u2").is_identity  # isolation
        state = mem.rerank_stage.rerankers.state
        assert state.names("u1") == [RERANKER_STATE] and state.names("u2") == []
        assert state.names(PRIOR_OWNER) == []  # no prior in scope isolated
        w = mem.rerank_stage.reranker("u1").w_m_.detach().clone()
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        rr = again.rerank_stage.reranker("u1")
        assert rr.n_updates_ == 1 and np.allclose(rr.w_m_.detach().numpy(), w.numpy())
        assert again.rerank_stage.reranker("u2").is_identity
        again.delete_user("u1")
        assert again.rerank_stage.rerankers.state.names("u1") == []
        left = sorted(p.name for p in (tmp_path / "rerankers").iterdir())
        assert left == [".clock", ".lock"]  # no state of anyone left (u2 learned nothing)


def test_isolated_stage_learn_trains_the_users_reranker_and_stores_every_episode(tmp_path):
    from reflective_memory.rmm.episodes import Episode

    dim = HashingEmbedder().dim
    rng = np.random.default_rng(0)
    cand = rng.normal(size=(4, dim)).astype(np.float32)
    feats = np.log1p(np.array([[3.0], [40.0], [7.0], [12.0]], np.float32))  # the cost feature
    ep = Episode(cand[0], cand, [1, 0], np.array([1.0, -1.0], np.float32), None, feats)
    cfg = _cfg(rerank={"scope": "isolated", "features": ("cost",), "batch_size": 2})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        first = stage.rerankers.learn("u1", ep)
        assert first.updates == 0 and first.pending == 1
        with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as other:
            assert len(other.rerank_stage.reranker("u1").pending_) == 1  # stored at once
        second = stage.rerankers.learn("u1", ep)
        assert second.updates == 1 and second.pending == 0
        assert stage.reranker("u1").n_updates_ == 1 and stage.reranker("u2").is_identity
        assert (
            stage.rerankers.state.names("u1") == [RERANKER_STATE]
            and stage.rerankers.state.names("u2") == []
        )
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        assert again.rerank_stage.reranker("u1").n_updates_ == 1


def test_shared_scope_uses_one_reranker(tmp_path):
    cfg = _cfg(rerank={"scope": "shared", "batch_size": 1})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem, "u1")
        _fill(mem, "u2")
        mem.feedback(mem.retrieve("u1", "nurse"), cited=[0])
        assert mem.rerank_stage.reranker("u2") is mem.rerank_stage.reranker("u1")
        state = mem.rerank_stage.rerankers.state
        assert state.names(PRIOR_OWNER) == [RERANKER_STATE]
        assert state.names("u1") == state.names("u2") == []


def test_feedback_no_cite_and_attribution_fallback():
    cfg = _cfg(rerank={"batch_size": 100, "attribution_threshold": 0.3})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "what do I do on weekends")
        f = mem.feedback(r, "Sorry, I can't tell. [NO_CITE]")
        assert f.no_cite and f.cited == () and set(f.rewards.values()) == {-1.0}
        f = mem.feedback(r, "You are learning Japanese on weekends.")
        assert f.inferred and f.learned
        cited_texts = [r.hits[i].memory.text for i in f.cited]
        assert any("Japanese" in t for t in cited_texts)
        assert f.similarities is not None and len(f.similarities) == len(r.hits)
        f = mem.feedback(r, "Memory [1] and [1] and [42].")
        assert f.cited == (1,) and f.repeated == 1 and f.out_of_range == 1
    off = _cfg(rerank={"attribution_fallback": False})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=off) as mem:
        _fill(mem)
        f = mem.feedback(mem.retrieve("u1", "weekends"), "You study Japanese.")
        assert not f.learned and "fallback" in f.reason


def test_feedback_from_a_rebuilt_context(tmp_path):
    cfg = _cfg(rerank={"batch_size": 1})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "nurse")
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        f = again.feedback(r, cited=[0])  # vectors come from the index, query re-embedded
        assert f.learned and f.updates == 1


def test_feedback_errors():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "nurse")
        with pytest.raises(InvalidInputError):
            mem.feedback(r)
        with pytest.raises(InvalidInputError):
            mem.feedback(r, cited=[99])
        with pytest.raises(InvalidInputError):
            mem.feedback("not a retrieval", cited=[0])  # type: ignore[arg-type]
        empty = mem.retrieve("nobody", "nurse")
        assert not mem.feedback(empty, cited=[]).learned
    with ReflectiveMemory(
        embedder=HashingEmbedder(), config=_cfg(rerank={"enabled": False})
    ) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "nurse")
        assert r.rerank is None and "rerank" not in r.diagnostics
        off = mem.feedback(r, cited=[0])  # reported, not learned
        assert not off.learned and "reranking is off" in off.reason
        assert off.cited == (0,) and list(off.rewards.values())[0] == 1.0


def test_citation_loop_end_to_end_moves_cited_memory_up():
    # the ranked units themselves, so the reranker's order is seen: in passages the learned
    # turn ranker weighs that order among its other cues (BENCHMARKS.md: RMM on the learned
    # prior), and here the words of "My sister ..." keep it first
    cfg = _cfg(
        passages={"enabled": False},
        rerank={
            "explore": True,
            "seed": 1,
            "batch_size": 4,
            "top_m": 3,
            "top_k": 16,
            "features": (),
            "learning_rate": 1e-3,
        },
    )
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        query = "about my weekends and evenings"

        def pos():
            r = mem.retrieve("u1", query, k=16, explore=False)
            return next(i for i, h in enumerate(r.hits) if "Spirited" in h.memory.text)

        start = pos()
        # Plain SGD at the paper's eta moves the embedding maps slowly: about 200 episodes here
        for _ in range(240):
            r = mem.retrieve("u1", query, k=3)
            prompt = build_answer_prompt(query, r.hits)
            assert "=== Memory [2] ===" in prompt
            cited = [i for i, h in enumerate(r.hits) if "Spirited" in h.memory.text]
            mem.feedback(r, cited=cited)
        assert pos() < start


def test_reranker_options_reach_the_engine_reranker(tmp_path):
    cfg = _cfg(rerank={"scope": "isolated", "batch_size": 1, "tau": 0.7})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        mem.feedback(mem.retrieve("u1", "nurse"), cited=[0])
        rr = mem.rerank_stage.reranker("u1")
        assert rr.config.tau == 0.7 and rr.config.batch_size == 1 and not rr.is_identity
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        loaded = again.rerank_stage.reranker("u1")
        assert loaded.config.tau == 0.7 and loaded.n_updates_ == 1
    for bad in (
        {"rerank_weight_decay": 0.1},  # removed in 0.2
        {"rerank_memory_bias": True},
        {"rerank": {"baseline": "mean"}},
        {"rerank": {"baseline": True}},
        {"rerank": {"features": ("length",)}},
        {"rerank": {"features": ("cost", "cost")}},
    ):
        with pytest.raises(ConfigError):
            _cfg(**bad)


def test_cost_feature_flows_through_retrieval_feedback_and_config(tmp_path):
    """The default reranker scores the cost feature; feedback on short memories teaches it."""
    cfg = _cfg(
        rerank={
            "scope": "isolated",
            "features": ("cost",),
            "batch_size": 1,
            "explore": True,
            "seed": 0,
            "top_k": 16,
        }
    )
    cfg = cfg.replace(passages={"enabled": False})  # the reranker's scores on the units
    assert cfg.rerank.baseline == "episode"
    assert MemoryConfig.from_dict(cfg.to_dict()) == cfg
    assert MemoryConfig(rerank={"features": "cost"}).rerank.features == ("cost",)
    hobbies = ["chess", "pottery", "running", "choir", "baking", "climbing", "salsa", "poetry"]
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        for i, h in enumerate(hobbies):  # short personal facts and long generic musings
            mem.add_turn("u1", f"s{i}", "user", f"My evenings are for {h}.")
            mem.add_turn(
                "u1",
                f"t{i}",
                "user",
                f"I read that evenings can be spent on many things besides {h}: reading, "
                "walking, cooking, calling friends, learning a language, volunteering, or "
                "simply resting after a long day, and that a routine for your evenings helps.",
            )
            mem.end_session("u1", f"s{i}")
            mem.end_session("u1", f"t{i}")

        def facts_on_top(query):
            top = mem.retrieve("u1", query, k=8, explore=False).hits
            assert all("rerank" in h.scores for h in top)
            return sum(h.memory.key.startswith("user: My evenings") for h in top)

        before = facts_on_top("how do I spend evenings")
        for _ in range(40):
            r = mem.retrieve("u1", "what do I do in my evenings", k=3)
            short = [
                j for j, h in enumerate(r.hits) if h.memory.key.startswith("user: My evenings")
            ]
            mem.feedback(r, cited=short)
        rr = mem.rerank_stage.reranker("u1")
        assert rr.features == ("cost",) and float(rr.w_f_.detach()[0]) < 0
        assert facts_on_top("how do I spend evenings") > before  # another query, same lesson
    paper = _cfg(rerank={"scope": "isolated", "features": (), "baseline": 0.5})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=paper) as again:
        loaded = again.rerank_stage.reranker("u1")  # the config wins over the saved settings
        assert loaded.features == () and loaded.config.baseline == 0.5
        assert loaded.n_updates_ == 40


def test_buffered_feedback_survives_close_and_reopen(tmp_path):
    cfg = _cfg(rerank={"scope": "isolated", "batch_size": 4})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem, "u1")
        f = mem.feedback(mem.retrieve("u1", "what pet do I have"), cited=[0])
        assert f.updates == 0 and f.pending == 1
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        rr = again.rerank_stage.reranker("u1")
        assert rr.n_updates_ == 0 and len(rr.pending_) == 1


# -- one feedback path: the rerank record, texts from any retriever --------------------------------
def test_retrieval_carries_its_rerank_record():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "what pet do I have", k=3)
        rec = r.rerank
        assert isinstance(rec, RerankRecord) and rec.user_id == "u1"
        assert rec.retrieval_id == r.retrieval_id and rec.query == "what pet do I have"
        assert r.diagnostics["rerank"] == rec.as_diagnostics()
        assert set(r.diagnostics["rerank"]) == {
            "scope",
            "top_k",
            "top_m",
            "explored",
            "updates",
            "retriever_order",
            "reranked_order",
            "prior",
            "features",
        }
        assert len(rec.candidates) == rec.top_k == 8 and sorted(rec.reranked) == sorted(
            rec.candidates
        )
        again = RerankRecord.from_diagnostics(
            r.diagnostics["rerank"], user_id="u1", retrieval_id=r.retrieval_id, query=rec.query
        )
        assert again == rec


def test_feedback_on_a_retrieval_without_a_record_reads_its_diagnostics(tmp_path):
    cfg = _cfg(rerank={"batch_size": 1})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        r = mem.retrieve("u1", "nurse")
    old = dataclasses.replace(r, rerank=None)  # as made before 0.2
    broken = dataclasses.replace(r, rerank=None, diagnostics={"rerank": {"scope": "user"}})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        f = again.feedback(old, cited=[0])
        assert f.learned and f.updates == 1
        nothing = again.feedback(broken, cited=[0])
        assert not nothing.learned and nothing.reason == "the retrieval was not reranked"


def test_rerank_texts_and_retrieve_share_the_users_reranker(tmp_path):
    cfg = _cfg(rerank={"scope": "isolated", "batch_size": 1, "features": ("cost",)})
    texts = ["My dog Rex loves the beach", "The tax office opens at nine", "Rex barks at cats"]
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        ranked = mem.rerank_texts("u1", "my dog Rex", texts, ids=["a", None, "c"], top_n=2)
        assert isinstance(ranked, RankedTexts) and len(ranked.order) == 2
        assert ranked.record.candidates == ("a", "1", "c") and ranked.record.top_m == 2
        assert [texts[i] for i in ranked.order] == [
            texts[ranked.record.candidates.index(x)] for x in ranked.record.reranked[:2]
        ]
        f = mem.feedback(ranked, "Rex does. [1]")
        shown_ids = [ranked.record.candidates[i] for i in ranked.order]
        assert f.learned and f.updates == 1 and f.cited == (1,)
        assert f.rewards == {shown_ids[0]: -1.0, shown_ids[1]: 1.0}
        assert f.retrieval_id == ranked.record.retrieval_id
        assert mem.retrieve("u1", "nurse").rerank.updates == 1  # the reranker retrieve applies
        assert mem.feedback(ranked.record, cited=[0]).updates == 1  # the record alone will do
        with pytest.raises(InvalidInputError):
            mem.rerank_texts("u1", "q", "not a list")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            mem.feedback(ranked, cited=[2])  # two texts were shown
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        # another process: the texts are embedded again; a bare record cannot be rebuilt
        assert again.feedback(ranked, cited=[0]).updates == 1
        assert again.reranker("u1").n_updates_ == 3
        lost = again.feedback(ranked.record, cited=[0])
        assert not lost.learned and "changed" in lost.reason


def test_feedback_numbering_names_shown_texts():
    """Sources numbered from 1, one of them not shown: the numbering maps them."""
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        ranked = mem.rerank_texts("u1", "dogs", ["dogs bark", "cats purr", "birds sing"])
        numbering = {1: 0, 2: None, 3: 2}
        f = mem.feedback(ranked, "See [1] and [2], [0] and [9].", numbering=numbering)
        assert f.cited == (0,) and f.out_of_range == 2 and f.learned
        assert list(f.rewards.values()) == [1.0, -1.0, -1.0]
        assert mem.feedback(ranked, cited=[3, 2], numbering=numbering).cited == (2,)
        with pytest.raises(InvalidInputError):
            mem.feedback(ranked, cited=[0], numbering=numbering)


def test_two_engines_on_one_directory_lose_no_feedback(tmp_path):
    """Embedded stores keep learned state in files under the same read-modify-write contract."""
    cfg = _cfg(rerank={"batch_size": 2, "scope": "isolated"})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as a:
        _fill(a)
        with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as b:
            for _ in range(3):
                for mem in (a, b):
                    mem.feedback(mem.retrieve("u1", "what pet do I have"), cited=[0])
            for mem in (a, b):
                rr = mem.reranker("u1")
                assert rr.n_episodes_ == 6 and rr.n_updates_ == 3


def test_an_uncited_answer_matching_nothing_teaches_nothing():
    cfg = _cfg(rerank={"batch_size": 1})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        f = mem.feedback(mem.retrieve("u1", "what do I do on weekends"), "Zebra quartz xylophone.")
        assert f.inferred and not f.learned and f.cited == () and f.rewards == {}
        assert f.reason.startswith("the answer has no citation")
        assert mem.reranker("u1").n_updates_ == 0
