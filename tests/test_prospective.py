from datetime import datetime, timezone

import pytest
import reflective_memory.rmm.topics as prospective
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import InvalidInputError, LLMOutputError
from reflective_memory.rmm.topic_prompts import (
    build_extraction_prompt,
    parse_extraction,
    parse_update,
)
from reflective_memory.rmm.topics import (
    InMemoryTopicBank,
    ProspectiveReflector,
    TopicDraft,
    merge_topic_memory,
    new_topic_memory,
)
from reflective_memory.types import Turn


def _turns(session="s1", texts=None, day=1):
    texts = texts or [
        ("user", "I adopted a beagle called Rex last week."),
        ("assistant", "Congratulations! Beagles are lovely."),
        ("user", "He hates the rain though, and I live in Bergen."),
        ("assistant", "Bergen is rainy indeed; a raincoat may help."),
    ]
    ts = datetime(2024, 3, day, 10, tzinfo=timezone.utc)
    return [
        Turn("u1", session, role, text, f"{session}:{i}", i, ts)
        for i, (role, text) in enumerate(texts)
    ]


class ScriptedLLM:
    """Answers by prompt kind from queues; records prompts."""

    def __init__(self, extraction=None, update=None):
        self.extraction = list(extraction or [])
        self.update = list(update or [])
        self.prompts = []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        queue = self.update if "Add()" in prompt else self.extraction
        out = queue.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


@pytest.mark.parametrize(
    "reply",
    [
        '{"extracted_memories": [{"summary": "The user has a beagle named Rex.", '
        '"reference": [0]}]}',
        '```json\n{"extracted_memories": [{"summary": "The user has a beagle named Rex.", '
        '"reference": ["[0]"]},]}\n```',
        "Sure! Here it is: {'extracted_memories': [{'summary': 'The user has a beagle named Rex.', "
        "'reference': [[0]]}]} Hope that helps.",
        '[{"summary": "The user has a beagle named Rex.", "references": "Turn 0"}]',
        '{"extracted_memories": [{"summary": "The user has a beagle named Rex.", "reference": [0]} '
        '{"summary": broken',
    ],
)
def test_parse_extraction_repairs(reply):
    items, _ = parse_extraction(reply, 4)
    assert items[0] == ("The user has a beagle named Rex.", (0,))


def test_parse_extraction_no_trait_and_skips():
    assert parse_extraction("NO_TRAIT", 4) == ([], 0)
    assert parse_extraction("  no trait.", 4) == ([], 0)
    items, skipped = parse_extraction(
        '{"extracted_memories": [{"summary": "a", "reference": [9]}, {"summary": "", '
        '"reference": [1]}, "junk", {"summary": "ok", "reference": [1, 1, 2]}]}',
        3,
    )
    assert items == [("ok", (1, 2))] and skipped == 3
    with pytest.raises(LLMOutputError):
        parse_extraction("I could not do it.", 3)


def test_parse_extraction_window_offset():
    items, skipped = parse_extraction('[{"summary": "x", "reference": [3, 41]}]', 40, offset=40)
    assert items == [("x", (41,))] and skipped == 0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Add()", [("add", None, None)]),
        ("add", [("add", None, None)]),
        (
            "Merge(1, The user has two dogs (Rex and Max).)",
            [("merge", 1, "The user has two dogs (Rex and Max).")],
        ),
        (
            'OUTPUT ACTION:\nMerge(index=0, merged_summary="Likes tea.")',
            [("merge", 0, "Likes tea.")],
        ),
        ("```\nMerge([0], Likes tea and coffee\n```", [("merge", 0, "Likes tea and coffee")]),
        ("Merge(0, A.)\nMerge(0, B.)\nAdd()", [("merge", 0, "A.")]),
        ("Merge(5, out of range)\nAdd()", [("add", None, None)]),
    ],
)
def test_parse_update_variants(reply, expected):
    actions, _ = parse_update(reply, 2)
    assert [(a.kind, a.index, a.merged_summary) for a in actions] == expected


def test_parse_update_unusable():
    with pytest.raises(LLMOutputError):
        parse_update("I think they are related.", 2)
    with pytest.raises(LLMOutputError):
        parse_update("Merge(7, nope)", 2)


def test_extraction_prompt_numbers_turns_and_date():
    prompt = build_extraction_prompt(_turns(), "user", offset=10, max_turn_chars=20)
    assert "Turn 10 | user: I adopted a beagle" in prompt and "Turn 13 | assistant" in prompt
    assert "(on 2024-03-01)" in prompt and "…" in prompt


def test_reflect_adds_then_merges_with_provenance():
    emb = HashingEmbedder(128)
    bank = InMemoryTopicBank(emb)
    llm = ScriptedLLM(
        extraction=[
            '{"extracted_memories": [{"summary": "The user adopted a beagle named Rex.", '
            '"reference": [0]},'
            ' {"summary": "The user lives in Bergen.", "reference": [2]}]}',
            "NO_TRAIT",
        ]
    )
    r = ProspectiveReflector(llm)
    rep = r.reflect("u1", "s1", _turns(), bank)
    assert len(rep.added) == 2 and rep.merged == [] and rep.extracted == 2
    # first topic: no history -> no update call; second: one update call (history has the first)
    # two extraction calls (user, assistant); the 2nd topic sees the 1st: one update call, which
    # the script has no answer for -> LLM failure -> safe Add
    assert rep.usage.llm_calls == 3 and rep.fallback_adds == 1
    mem = bank.memories[rep.added[0]]
    assert mem.granularity == "topic" and mem.key == "The user adopted a beagle named Rex."
    assert mem.text.startswith("[2024-03-01] The user adopted a beagle named Rex.")
    assert "user: I adopted a beagle called Rex last week." in mem.text
    assert mem.turn_ids == ("s1:0",)

    turns2 = _turns(
        "s2", [("user", "Rex turned one today!"), ("assistant", "Happy birthday Rex!")], day=9
    )
    llm.extraction = [
        '{"extracted_memories": [{"summary": "The user\'s beagle Rex turned one.", '
        '"reference": [0]}]}',
        "NO_TRAIT",
    ]
    llm.update = ["Merge(0, The user adopted a beagle named Rex, who turned one on 2024-03-09.)"]
    rep2 = r.reflect("u1", "s2", turns2, bank)
    assert rep2.merged and not rep2.added
    merged = bank.memories[rep2.merged[0]]
    assert merged.id == mem.id and merged.created_at == mem.created_at
    assert merged.updated_at >= mem.updated_at
    assert merged.turn_ids == ("s1:0", "s2:0")
    assert merged.key.endswith("turned one on 2024-03-09.")
    assert "I adopted a beagle" in merged.text and "Rex turned one today!" in merged.text
    assert merged.metadata["rmm"]["sessions"] == ["s1", "s2"]
    assert merged.metadata["rmm"]["previous_summaries"] == ["The user adopted a beagle named Rex."]
    assert merged.start_time.day == 1 and merged.end_time.day == 9


def test_reflect_survives_failures_and_garbage():
    bank = InMemoryTopicBank(HashingEmbedder(64))
    bank.save_topic(
        new_topic_memory("u1", "s0", TopicDraft("The user has a dog.", "user", (0,)), _turns("s0"))
    )
    llm = ScriptedLLM(
        extraction=[
            '{"extracted_memories": [{"summary": "The user lives in Bergen.", "reference": [2]}]}',
            RuntimeError("timeout"),
        ],
        update=["I am not sure what to do here."],
    )
    rep = ProspectiveReflector(llm).reflect("u1", "s1", _turns(), bank)
    assert rep.llm_failures == 1 and rep.unusable_outputs == 1 and rep.fallback_adds == 1
    assert len(rep.added) == 1 and len(bank.memories) == 2
    assert rep.usage.llm_calls == 3 and rep.usage.failures == 2


def test_reflect_isolates_users():
    bank = InMemoryTopicBank(HashingEmbedder(64))
    other = new_topic_memory(
        "u2", "x", TopicDraft("The user lives in Bergen.", "user", (2,)), _turns("x")
    )
    bank.save_topic(other)
    llm = ScriptedLLM(
        extraction=['[{"summary": "The user lives in Bergen.", "reference": [2]}]', "NO_TRAIT"],
    )
    rep = ProspectiveReflector(llm).reflect("u1", "s1", _turns(), bank)
    # u2's topic was never shown: no update call, plain add
    assert len(rep.added) == 1 and len(llm.prompts) == 2
    assert bank.memories[other.id] == other


def test_windows_and_speakers():
    texts = [("user", f"fact number {i}") if i % 2 == 0 else ("assistant", "ok") for i in range(10)]
    llm = ScriptedLLM(extraction=["NO_TRAIT"] * 3)
    r = ProspectiveReflector(llm, speakers=["user"], window_turns=4)
    drafts = r.extract(_turns("s", texts))
    assert drafts == [] and len(llm.prompts) == 3
    assert "Turn 8 | user: fact number 8" in llm.prompts[2]


def test_merge_keeps_existing_sources():
    t = _turns()
    m = new_topic_memory("u1", "s1", TopicDraft("Dog.", "user", (0,)), t)
    m2 = merge_topic_memory(
        m, TopicDraft("Dog in rain.", "user", (0, 2)), "Dog hates rain.", "s1", t
    )
    assert m2.turn_ids == ("s1:0", "s1:2")
    assert m2.text.count("I adopted a beagle") == 1


def test_bad_args():
    with pytest.raises(InvalidInputError):
        ProspectiveReflector(None)
    with pytest.raises(InvalidInputError):
        ProspectiveReflector(lambda p: "", merge_k=0)


def test_all_exports():
    for name in prospective.__all__:
        assert hasattr(prospective, name)


def test_a_merged_topic_is_true_as_of_its_newest_source_and_keeps_its_history():
    """What is true now comes first; the LLM sees every summary with its date (issue 28)."""
    bank = InMemoryTopicBank(HashingEmbedder(128))
    llm = ScriptedLLM(
        extraction=[
            '{"extracted_memories": [{"summary": "The user lives in Lisbon.", "reference": [0]}]}',
            "NO_TRAIT",
        ]
    )
    r = ProspectiveReflector(llm)
    lisbon = _turns("s1", [("user", "I live in Lisbon, in Alfama."), ("assistant", "Lovely!")])
    first = r.reflect("u1", "s1", lisbon, bank).added[0]
    moved = _turns("s2", [("user", "We moved: I live in Porto now."), ("assistant", "Nice!")], 20)
    llm.extraction = [
        '{"extracted_memories": [{"summary": "The user moved to Porto.", "reference": [0]}]}',
        "NO_TRAIT",
    ]
    llm.update = ["Merge(0, The user lives in Porto; they moved there from Lisbon.)"]
    rep = r.reflect("u1", "s2", moved, bank)
    assert rep.merged == [first]
    update = next(p for p in llm.prompts if "Add()" in p)
    assert '"[2024-03-01] The user lives in Lisbon."' in update
    assert '"[2024-03-20] The user moved to Porto."' in update
    text = bank.memories[first].text
    head, earlier = text.splitlines()[:2]
    assert head == "[as of 2024-03-20] The user lives in Porto; they moved there from Lisbon."
    assert earlier == "Earlier: [2024-03-01] The user lives in Lisbon."
    assert "user: We moved: I live in Porto now." in text
