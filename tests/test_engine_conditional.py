import json

import pytest
from reflective_memory import (
    ConfigError,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)

from tests.fakes import Scripted

TURNS = [
    ("user", "Hi!"),
    ("assistant", "Hello, what can I do for you?"),
    ("user", "I just adopted a beagle named Max. What should he eat?"),
    ("assistant", "Beagle puppies do well on three small meals a day."),
    ("user", "What is the capital of Peru?"),
    ("assistant", "Lima."),
    ("user", "From now on, keep your answers under three sentences."),
    ("assistant", "Will do."),
]


def fill(mem, user="ana", session="s1", turns=TURNS):
    for role, text in turns:
        mem.add_turn(user, session, role, text, timestamp="2024-03-05 10:00")
    return mem.end_session(user, session)


def make(llm=None, path=None, **cfg):
    # Fixed-window segments: these tests count the conditional-memory LLM calls only (with an
    # LLM, the default segmenter="auto" would add one segmentation call per session).
    # Segment units ranked as units: these tests are about notes beside segments, not passages.
    base = MemoryConfig(
        segment={"kind": "fixed"},
        units={"granularities": ("segment",)},
        passages={"enabled": False},
    )
    config = base.replace(**cfg)
    return ReflectiveMemory(path, embedder=HashingEmbedder(), llm=llm, config=config)


def test_notes_off_by_default():
    with make() as mem:
        built = fill(mem)
        assert {m.granularity for m in built} == {"segment"}


def test_offline_notes_beside_segments_and_replaced_on_reend():
    with make(conditional={"notes": True}, segment={"window": 4}) as mem:
        built = fill(mem)
        notes = [m for m in built if m.granularity == "note"]
        assert len([m for m in built if m.granularity == "segment"]) == 2
        assert [n.metadata["source_turn_id"] for n in notes] == ["s1:2", "s1:6"]
        assert notes[0].turn_ids == ("s1:2", "s1:1")
        assert notes[0].text.startswith("[2024-03-05 (Tue) 10:00]\nContext: ")
        assert "beagle named Max" in notes[0].metadata["knowledge"]
        assert mem.stats("ana")["memories_by_granularity"]["note"] == 2
        old_ids = {n.id for n in notes}
        mem.add_turn("ana", "s1", "user", "My sister Jo lives in Oslo.")
        rebuilt = fill(mem, turns=[])  # re-end with the extra turn
        new_notes = [m for m in rebuilt if m.granularity == "note"]
        assert len(new_notes) == 3 and not old_ids & {n.id for n in new_notes}
        assert len([m for m in mem.memories("ana") if m.granularity == "note"]) == 3


def test_llm_notes_one_call_per_session_and_fallback_on_failure():
    answer = "\n".join(
        json.dumps(x)
        for x in [
            {"turn": 1, "keep": False},
            {
                "turn": 3,
                "keep": True,
                "context": "Asked about feeding a new dog.",
                "knowledge": "The user adopted a beagle puppy named Max.",
                "related": [],
            },
            {"turn": 5, "keep": False},
            {"turn": 7, "keep": True, "context": "Style request.", "knowledge": "Short answers."},
        ]
    )
    llm = Scripted(answer)
    with make(conditional={"notes": True}, llm=llm) as mem:
        notes = [m for m in fill(mem) if m.granularity == "note"]
        assert len(llm.prompts) == 1 and mem.llm.usage.llm_calls == 1
        assert [n.metadata["knowledge"] for n in notes] == [
            "The user adopted a beagle puppy named Max.",
            "Short answers.",
        ]
        assert all(n.metadata["decided_by"] == "llm" for n in notes)
    broken = Scripted(RuntimeError("LLM down"))
    with make(conditional={"notes": True}, llm=broken) as mem:
        built = fill(mem)
        notes = [m for m in built if m.granularity == "note"]
        assert len(notes) == 2 and all(n.metadata["decided_by"] == "heuristic" for n in notes)
        assert len(mem.turns("ana", "s1")) == len(TURNS)  # nothing lost
        assert any(m.granularity == "segment" for m in built)


def test_views_filter_and_shared_budget():
    with make(conditional={"notes": True}) as mem:
        fill(mem)
        r = mem.retrieve("ana", "my dog Max", k=5, views=["note"])
        assert r.hits and all(h.memory.granularity == "note" for h in r.hits)
        assert r.diagnostics["views"] == ["note"]
        both = mem.retrieve("ana", "my dog Max", k=10)
        assert {h.memory.granularity for h in both.hits} == {"note", "segment"}
        seg_only = mem.retrieve("ana", "my dog Max", budget_tokens=60, views=("segment",))
        assert all(h.memory.granularity == "segment" for h in seg_only.hits)
        with pytest.raises(InvalidInputError):
            mem.retrieve("ana", "x", views=["nope"])
    with make(conditional={"notes": True}, search={"views": ("note",)}) as mem:
        fill(mem)
        assert {h.memory.granularity for h in mem.retrieve("ana", "Max", k=5)} == {"note"}
    with pytest.raises(ConfigError):
        MemoryConfig(search={"views": ("bogus",)})
    with pytest.raises(ConfigError):
        MemoryConfig(conditional={"self_reflection_rounds": 0})
    with pytest.raises(ConfigError):
        MemoryConfig(conditional={"note_prompt_chars": 10})
    cfg = MemoryConfig(search={"views": ("note", "segment")}, conditional={"notes": True})
    assert MemoryConfig.from_dict(cfg.to_dict()) == cfg


def test_reflective_retrieve_through_engine():
    llm = Scripted("MISSING\nKeywords: Peru capital, none")
    with make(conditional={"notes": False}, segment={"window": 2}, llm=llm) as mem:
        # the notes-making LLM is off (conditional_memory=False), so only reflection calls it
        fill(mem)
        plain = mem.retrieve("ana", "beagle food", k=2)
        r = mem.retrieve("ana", "beagle food", k=2, reflect=True)
        assert len(llm.prompts) == 1 and r.usage.llm_calls == 1
        refl = r.diagnostics["reflection"]
        assert refl["rounds"][0]["hit_ids"] == [h.memory.id for h in plain.hits]
        assert refl["rounds"][1]["query"] == "beagle food Peru capital"
        assert len(r.hits) == 2 and len({h.memory.id for h in r.hits}) == 2
        assert "total" in r.diagnostics["timings_ms"]
        assert r.user_id == "ana"


def test_reflection_from_config_and_without_llm():
    llm = Scripted("ENOUGH\n[0] Max")
    with make(conditional={"self_reflection": True}, llm=llm) as mem:
        fill(mem)
        r = mem.retrieve("ana", "dog", k=3)
        assert r.diagnostics["reflection"]["stopped"] == "enough" and len(llm.prompts) == 1
        mem.retrieve("ana", "dog", k=3, reflect=False)
        assert len(llm.prompts) == 1
    with make(conditional={"self_reflection": True}) as mem:
        fill(mem)
        r = mem.retrieve("ana", "dog", k=3)
        plain = mem.retrieve("ana", "dog", k=3, reflect=False)
        assert r.diagnostics["reflection"]["stopped"] == "no_llm"
        assert [h.memory.id for h in r.hits] == [h.memory.id for h in plain.hits]


def test_notes_persist_and_are_deleted_with_session(tmp_path):
    with make(conditional={"notes": True}, path=tmp_path) as mem:
        fill(mem)
        fill(mem, user="bob", session="s1")
    with make(conditional={"notes": True}, path=tmp_path) as mem:
        assert mem.stats("ana")["memories_by_granularity"]["note"] == 2
        r = mem.retrieve("ana", "beagle", k=10, views=["note"])
        assert all(h.memory.user_id == "ana" for h in r.hits)
        mem.delete_session("ana", "s1")
        assert mem.memories("ana") == []
        assert mem.stats("bob")["memories_by_granularity"]["note"] == 2
