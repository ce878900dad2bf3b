"""Per-user memory credit (`rerank_memory_credit`): learned from citations, bounded, per user."""

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.rmm.memory_credit import (
    MAX_CREDITS,
    add_credit,
    hit_advantages,
    promote,
)
from reflective_memory.rmm.personal import UserAdapter

FACTS = [
    "my sister Lena moved to Lisbon to study marine biology",
    "I started training for the Berlin marathon in the spring",
    "our cat Miso knocked the plant off the kitchen shelf",
    "I switched jobs and now write firmware for heat pumps",
    "we planted tomatoes and basil on the balcony this year",
    "the band I play bass in has a gig at the harbour bar",
]


def _engine(tmp_path, credit=0.05, cap=0.3):
    cfg = MemoryConfig(
        passages={"budget_unit": "words"}, rerank_memory_credit=credit, rerank_memory_credit_cap=cap
    )
    return ReflectiveMemory(tmp_path, config=cfg, embedder=HashingEmbedder(dim=64))


def _ingest(mem, user):
    for n, fact in enumerate(FACTS):
        sid = f"s{n}"
        mem.add_turns(
            [
                {"user_id": user, "session_id": sid, "role": "user", "text": fact},
                {"user_id": user, "session_id": sid, "role": "assistant", "text": "nice!"},
            ]
        )
        mem.end_session(user, sid)


def _rank_of(mem, user, query, needle):
    r = mem.retrieve(user, query, k=len(FACTS) * 2)
    order = r.diagnostics["rerank"]["reranked_order"]
    units = {h.memory.id: h.memory.text for h in r.hits}
    for pos, mid in enumerate(order):
        if needle in units.get(mid, ""):
            return pos
    return None


def test_advantages_are_centered_and_empty_without_information():
    from datetime import datetime, timezone

    from reflective_memory.types import Hit, Memory, Retrieval

    now = datetime.now(timezone.utc)

    def hit(i, sources):
        m = Memory(f"p{i}", "u", "s", "passage", "t", "t", (f"s:{i}",), now, now)
        m.metadata["sources"] = sources
        return Hit(m, 1.0, i)

    r = Retrieval("u", "q", [hit(0, ["a", "b"]), hit(1, ["c"]), hit(2, ["b"])])
    adv = hit_advantages(r, [0])
    # rewards (+1, -1, -1), mean -1/3: advantages 4/3, -2/3, -2/3; "b" is behind hits 0 and 2
    assert adv == pytest.approx({"a": 4 / 3, "b": 2 / 3, "c": -2 / 3})
    assert hit_advantages(r, []) == {} and hit_advantages(r, [0, 1, 2]) == {}


def test_noise_is_bounded_by_the_cap_and_the_table_stays_small():
    rng = np.random.default_rng(0)
    table: dict[str, float] = {}
    for _ in range(300):
        adv = {f"u{int(i)}": float(rng.normal()) for i in rng.integers(0, 5000, 30)}
        add_credit(table, adv, rate=0.5, cap=0.05)
    assert len(table) <= MAX_CREDITS
    assert max(abs(v) for v in table.values()) <= 0.05 + 1e-9
    # a promoted unit moves by at most the cap on the cosine scale
    cos = np.linspace(0.9, 0.1, 50)
    new = promote({"x10": 0.05}, [f"x{i}" for i in range(50)], cos)
    assert new.index(10) == 7  # 0.737 + 0.05 passes 3 of the 10 above it, no more
    assert promote({}, ["a", "b"], np.array([0.5, 0.4])) == [0, 1]


def test_cited_memory_rises_for_an_unseen_question_of_the_same_user_only(tmp_path):
    with _engine(tmp_path) as mem:
        _ingest(mem, "ann")
        _ingest(mem, "bob")
        query = "where did my sister move"
        unseen = "any news from Portugal"  # never asked, no word in common with the fact
        before = _rank_of(mem, "ann", unseen, "Lisbon")
        assert before == _rank_of(mem, "bob", unseen, "Lisbon") and before > 5
        for _ in range(6):  # ann keeps citing the Lisbon passage
            r = mem.retrieve("ann", query, budget_tokens=60, explore=True)
            cited = [i for i, h in enumerate(r.hits) if "Lisbon" in h.memory.text]
            assert cited and len(cited) < len(r.hits)
            mem.feedback(r, cited=cited)
        credit = mem.rerank_stage.adapter("ann").credit_
        assert credit and max(credit.values()) > 0
        assert mem.rerank_stage.adapter("bob").credit_ == {}
        assert _rank_of(mem, "ann", unseen, "Lisbon") < before - 3
        assert _rank_of(mem, "bob", unseen, "Lisbon") == before  # bob's ranking is his own


def test_no_citations_change_nothing(tmp_path):
    with _engine(tmp_path) as mem:
        _ingest(mem, "ann")
        base = mem.retrieve("ann", "what about the cat", budget_tokens=60).hits
        for _ in range(5):
            r = mem.retrieve("ann", "what about the cat", budget_tokens=60, explore=True)
            mem.feedback(r, cited=[])
        assert mem.rerank_stage.adapter("ann").credit_ == {}
        again = mem.retrieve("ann", "what about the cat", budget_tokens=60).hits
        assert [h.memory.turn_ids for h in again] == [h.memory.turn_ids for h in base]


def test_credit_is_saved_with_the_user_and_erased_with_the_user(tmp_path):
    with _engine(tmp_path) as mem:
        _ingest(mem, "ann")
        r = mem.retrieve("ann", "marathon training", budget_tokens=60, explore=True)
        cited = [i for i, h in enumerate(r.hits) if "marathon" in h.memory.text]
        mem.feedback(r, cited=cited)
        state = mem.rerank_stage.user_state("ann")
        assert state is not None and b"credit" in state
        table = dict(mem.rerank_stage.adapter("ann").credit_)
        assert UserAdapter.from_bytes(state).credit_ == pytest.approx(table, abs=1e-6)
    with _engine(tmp_path) as mem:  # reopened: the credit came back from disk
        assert mem.rerank_stage.adapter("ann").credit_ == pytest.approx(table, abs=1e-6)
        mem.delete_user("ann")
        assert mem.rerank_stage.user_state("ann") is None
        assert not list((tmp_path / "rerankers").glob("user-*"))


def test_config_rejects_bad_credit_settings():
    with pytest.raises(ConfigError, match="rerank_memory_credit"):
        MemoryConfig(rerank_memory_credit=-1)
    with pytest.raises(ConfigError, match="rerank_memory_credit_cap"):
        MemoryConfig(rerank_memory_credit_cap=float("nan"))
