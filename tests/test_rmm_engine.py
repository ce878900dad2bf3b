import pytest
from reflective_memory import (
    HashingEmbedder,
    MemoryConfig,
    RankedTexts,
    ReflectiveMemory,
    RerankRecord,
)
from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.rmm.turn_learning import PRIOR_OWNER, SHARED_STATE, USER_STATE
from reflective_memory.storage.state import FileStateStore

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
        rerank={"save_every": 1, "turn_learning_rate": 0.5, "turn_user_learning_rate": 0.5},
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


def _shown(mem, query="what do I do on weekends and evenings", user="u1"):
    r = mem.retrieve(user, query, budget_tokens=80)
    assert len(r.hits) >= 2, "the examples need two passages to tell apart"
    return r


def _margin(r, cited: int) -> float:
    """Log-score of passage `cited` over the best other shown passage (the record's scores)."""
    rec = r.rerank
    best: dict[int, float] = {}
    for g, score in zip(rec.groups, rec.prior, strict=True):
        best[g] = max(best.get(g, -1e9), score)
    return best[cited] - max(v for g, v in best.items() if g != cited)


def test_a_retrieval_records_its_shown_turns_for_feedback():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = _shown(mem)
        rec = r.rerank
        assert rec.scope == "turns" and rec.top_m == len(r.hits) and rec.updates == 0
        shown = {t for h in r.hits for t in h.memory.turn_ids}
        assert set(rec.candidates) <= shown and len(rec.groups) == len(rec.candidates)
        assert sorted(set(rec.groups)) == list(range(len(r.hits)))
        assert all(len(row) == len(FEATURES) for row in rec.features)
        assert r.diagnostics["rerank"]["groups"] == list(rec.groups)
        timings = r.diagnostics["timings_ms"]
        assert "shown" in timings and "rerank" not in timings  # no head reranker any more


def test_citations_move_the_cited_passage_up_for_the_next_question():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = _shown(mem)
        last = 1  # the second passage, cited as a reader would that found it useful
        before = _margin(r, last)
        f = mem.feedback(_shown(mem), cited=[last])
        assert f.learned and f.rewards[r.hits[last].memory.id] == 1.0
        assert not f.serving and _margin(_shown(mem), last) == before  # not proven yet
        rounds = 1
        while not f.serving and rounds < 150:
            f = mem.feedback(_shown(mem), cited=[last])
            rounds += 1
        assert f.serving, "consistent citations must come to rank within 150 rounds"
        after = _margin(_shown(mem), last)
        assert after > before + 0.1
        w = mem.ranker_weights("u1")
        assert w["episodes"] == rounds and w["user_episodes"] == rounds
        assert w["shared_gate"]["serves"] and w["shared_gate"]["mean_gain"] > 0
        assert w["weights"] != w["prior"] and any(w["user"].values())
        # the same question of another user: the shared offsets moved, the user's own did not
        _fill(mem, "u2")
        assert not any(mem.ranker_weights("u2")["user"].values())
        assert _margin(_shown(mem, user="u2"), last) > before


def test_feedback_no_cite_and_attribution_fallback():
    cfg = _cfg(rerank={"attribution_threshold": 0.3})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        r = _shown(mem, "what do I do on weekends")
        f = mem.feedback(r, "Sorry, I can't tell. [NO_CITE]")
        assert f.no_cite and f.cited == () and set(f.rewards.values()) == {-1.0}
        assert not f.learned and "nothing to tell apart" in f.reason
        f = mem.feedback(r, "You are learning Japanese on weekends.")
        assert f.inferred and f.learned
        assert any("Japanese" in r.hits[i].memory.text for i in f.cited)
        assert f.similarities is not None and len(f.similarities) == len(r.hits)
        f = mem.feedback(r, "Memory [1] and [1] and [42].")
        assert f.cited == (1,) and f.repeated == 1 and f.out_of_range == 1
        f = mem.feedback(r, "Zebra quartz xylophone.")
        assert f.inferred and not f.learned and f.reason.startswith("the answer has no citation")
    off = _cfg(rerank={"attribution_fallback": False})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=off) as mem:
        _fill(mem)
        f = mem.feedback(_shown(mem, "weekends"), "You study Japanese.")
        assert not f.learned and "fallback" in f.reason


def test_feedback_in_another_process_needs_only_the_record(tmp_path):
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = _shown(mem)
    info = r.diagnostics["rerank"]  # what a service would send back as JSON
    rec = RerankRecord.from_diagnostics(info, user_id="u1", retrieval_id="x", query=r.query)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=_cfg()) as again:
        assert again.feedback(r, cited=[0]).learned
        f = again.feedback(rec, cited=[0])
        assert f.learned and set(f.rewards) == {str(i) for i in range(len(r.hits))}
        assert again.ranker_weights("u1")["user_episodes"] == 2


def test_feedback_errors_and_learning_off():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        r = _shown(mem)
        with pytest.raises(InvalidInputError):
            mem.feedback(r)
        with pytest.raises(InvalidInputError):
            mem.feedback(r, cited=[99])
        with pytest.raises(InvalidInputError):
            mem.feedback("not a retrieval", cited=[0])  # type: ignore[arg-type]
        empty = mem.retrieve("nobody", "nurse")
        assert not mem.feedback(empty, cited=[]).learned
        units = mem.retrieve("u1", "nurse", views=["turn"])  # no passages: no shown turns
        assert units.rerank is None and not mem.feedback(units, cited=[0]).learned
    with ReflectiveMemory(
        embedder=HashingEmbedder(), config=_cfg(rerank={"enabled": False})
    ) as mem:
        _fill(mem)
        r = _shown(mem)
        assert r.rerank is None and "rerank" not in r.diagnostics
        off = mem.feedback(r, cited=[0])  # reported, not learned
        assert not off.learned and "learning is off" in off.reason
        assert off.cited == (0,) and list(off.rewards.values())[0] == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        {"turn_update": "sgd"},
        {"turn_learning_rate": -1.0},
        {"turn_pull": -0.1},
        {"save_every": 0},
        {"save_seconds": -1},
    ],
)
def test_bad_learning_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        MemoryConfig(rerank=bad)


def test_rerank_texts_and_retrieve_teach_the_same_weights(tmp_path):
    texts = ["My dog Rex loves the beach", "The tax office opens at nine", "Rex barks at cats"]
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        ranked = mem.rerank_texts("u1", "my dog Rex", texts, ids=["a", None, "c"], top_n=2)
        assert isinstance(ranked, RankedTexts) and len(ranked.order) == 2
        rec = ranked.record
        assert rec.scope == "turns" and rec.groups == (0, 1) and rec.top_m == 2
        assert rec.candidates == tuple(["a", "1", "c"][i] for i in ranked.order)
        f = mem.feedback(ranked, "Rex does. [1]")
        assert f.learned and f.cited == (1,)
        assert f.rewards == {rec.candidates[0]: -1.0, rec.candidates[1]: 1.0}
        assert mem.retrieve("u1", "nurse", budget_tokens=40).rerank.updates == 1
        assert mem.feedback(rec, cited=[0]).learned  # the record alone will do
        assert mem.feedback(_shown(mem), cited=[0]).learned
        assert mem.ranker_weights("u1")["user_episodes"] == 3
        with pytest.raises(InvalidInputError):
            mem.rerank_texts("u1", "q", "not a list")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            mem.feedback(ranked, cited=[2])  # two texts were shown
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=_cfg()) as again:
        assert again.feedback(ranked, cited=[0]).learned  # another process
        assert again.ranker_weights("u1")["user_episodes"] == 4


def test_texts_ranked_by_the_turn_ranker_follow_its_weights():
    with ReflectiveMemory(embedder=HashingEmbedder(), config=_cfg()) as mem:
        texts = ["dogs bark at night", "cats purr", "dogs and cats"]
        first = mem.rerank_texts("u1", "dogs", texts)
        assert first.order[0] != 1  # the text without the query's word is not first
        scores = dict(zip(first.order, first.scores, strict=True))
        assert scores[0] > scores[1] and scores[2] > scores[1]


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


def test_saves_are_batched_and_close_stores_the_rest(tmp_path):
    cfg = _cfg(rerank={"save_every": 3, "save_seconds": 3600.0})
    state = FileStateStore(tmp_path / "rerankers")
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        for n in range(1, 6):
            assert mem.feedback(_shown(mem), cited=[0]).learned
            stored = state.version(PRIOR_OWNER, SHARED_STATE) != 0
            assert stored == (n >= 3), n  # the third episode stored the first three
        assert mem.ranker_weights()["episodes"] == 5
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        assert mem.ranker_weights("u1")["user_episodes"] == 5  # close stored the last two


def test_a_crash_loses_at_most_the_save_window(tmp_path):
    cfg = _cfg(rerank={"save_every": 3, "save_seconds": 3600.0})
    mem = ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg)
    _fill(mem)
    for _ in range(5):
        mem.feedback(_shown(mem), cited=[0])
    # no close: a crash; the episodes since the last save are lost, no more
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        assert again.ranker_weights("u1")["user_episodes"] == 3


def test_saves_on_a_timer():
    cfg = _cfg(rerank={"save_every": 1000, "save_seconds": 0.0})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        _fill(mem)
        assert mem.feedback(_shown(mem), cited=[0]).pending == 0


def test_two_engines_on_one_directory_lose_no_feedback(tmp_path):
    """Each save adds its own change to what is stored: no engine overwrites the other's."""
    cfg = _cfg(rerank={"save_every": 2})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as a:
        _fill(a)
        with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as b:
            for _ in range(3):
                for mem in (a, b):
                    assert mem.feedback(_shown(mem), cited=[0]).learned
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as c:
        w = c.ranker_weights("u1")
        assert w["episodes"] == 6 and w["user_episodes"] == 6


def test_delete_user_erases_the_users_offsets_not_the_shared_ones(tmp_path):
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=_cfg()) as mem:
        _fill(mem)
        _fill(mem, "u2")
        for user in ("u1", "u2"):
            mem.feedback(_shown(mem, user=user), cited=[0])
        state = FileStateStore(tmp_path / "rerankers")
        assert state.version("u1", USER_STATE) != 0
        mem.delete_user("u1")
        assert state.version("u1", USER_STATE) == 0
        assert mem.ranker_weights("u1")["user_episodes"] == 0
        assert not any(mem.ranker_weights("u1")["user"].values())
        assert mem.ranker_weights("u2")["user_episodes"] == 1
        assert mem.ranker_weights()["episodes"] == 2


def test_scope_shared_keeps_no_user_offsets():
    with ReflectiveMemory(
        embedder=HashingEmbedder(), config=_cfg(rerank={"scope": "shared"})
    ) as mem:
        _fill(mem)
        last = 1
        fits = [mem.feedback(_shown(mem), cited=[last])]
        while not fits[-1].serving and len(fits) < 150:
            fits.append(mem.feedback(_shown(mem), cited=[last]))
        assert all(f.learned for f in fits) and fits[-1].serving
        w = mem.ranker_weights("u1")
        assert w["episodes"] == len(fits) and w["user_episodes"] == 0
        assert w["weights"] == {n: w["prior"][n] + w["shared"][n] for n in FEATURES}
