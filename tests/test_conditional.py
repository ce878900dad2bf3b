import json
from datetime import datetime

import pytest
from reflective_memory.conditional.notes import (
    NOTE_GRANULARITY,
    LLMNoteMaker,
    build_note_drafts,
    fused_response_prompt,
    heuristic_decisions,
    heuristic_note,
    note_key,
    note_text,
    parse_fused_response,
    parse_note_output,
)
from reflective_memory.errors import InvalidInputError, LLMOutputError
from reflective_memory.llm import LLMClient
from reflective_memory.types import Turn, Usage

from tests.fakes import Scripted

TS = datetime(2024, 3, 5, 10, 30)


def make_turns(pairs, session="s1", ts=TS):
    return [
        Turn("ana", session, role, text, f"{session}:{i}", i, ts)
        for i, (role, text) in enumerate(pairs)
    ]


SESSION = make_turns(
    [
        ("user", "Hi there!"),
        ("assistant", "Hello! How can I help you today?"),
        ("user", "What is the capital of Australia?"),
        ("assistant", "The capital of Australia is Canberra."),
        ("user", "I just adopted a beagle named Max. Any tips for feeding him?"),
        ("assistant", "Congratulations! Feed a beagle puppy three small meals a day."),
        ("user", "Your answers are too long. Please keep them under three sentences."),
        ("assistant", "Understood, I will keep it short."),
        ("user", "thanks"),
    ]
)
USER_POS = [0, 2, 4, 6, 8]


# -- heuristic ------------------------------------------------------------------------------------


def test_heuristic_keeps_facts_and_requirements_skips_questions_and_greetings():
    decisions = {d.position: d for d in heuristic_decisions(SESSION)}
    assert sorted(decisions) == USER_POS
    assert not decisions[0].keep  # greeting
    assert not decisions[2].keep  # plain question
    assert decisions[4].keep and "beagle named Max" in decisions[4].knowledge
    assert "Any tips" not in decisions[4].knowledge  # the question is context, not knowledge
    assert "tips for feeding" in decisions[4].context
    assert decisions[4].context_positions == [3]  # the assistant turn just before
    assert decisions[6].keep and "three sentences" in decisions[6].knowledge
    assert not decisions[8].keep  # thanks
    assert all(d.decided_by == "heuristic" for d in decisions.values())


@pytest.mark.parametrize(
    "text,keep",
    [
        ("I'm looking for some advice on running shoes.", False),
        ("Can you recommend a good book?", False),
        ("I'm visiting my sister Emily in Denver, and I was wondering about zoos?", True),
        ("My wife and I moved to Lisbon last year.", True),
        ("I prefer vegetarian recipes without mushrooms.", True),
        ("From now on, answer in Spanish.", True),
        ("That's not what I asked for.", True),
        ("ok", False),
        ("Write a poem about the sea.", False),
    ],
)
def test_heuristic_cases(text, keep):
    turns = make_turns([("user", text)])
    assert heuristic_note(turns, 0).keep is keep


def test_heuristic_ignores_pasted_long_sentences():
    pasted = "I " + "really think that the protocol " * 30 + "works."
    turns = make_turns([("user", pasted)])
    assert not heuristic_note(turns, 0).keep


def test_heuristic_bad_position():
    with pytest.raises(InvalidInputError):
        heuristic_note(SESSION, 99)


# -- LLM output parsing ---------------------------------------------------------------------------

TARGETS = {1: 0, 3: 2, 5: 4, 7: 6, 9: 8}


def test_parse_note_output_valid_and_lenient():
    out = "\n".join(
        [
            "Sure, here you go:",
            '{"turn": 1, "keep": false}',
            "{'turn': 3, 'keep': 'no'}",
            '{"turn": "5", "keep": "yes", "context": "Asked about feeding.", '
            '"knowledge": "The user has a beagle called Max.", "related": [4, 5, 99, "x"],}',
            '{"turn": 5, "keep": false}',  # a second answer about turn 5 is ignored
            '{"turn": 42, "keep": true, "knowledge": "not a target"}',
        ]
    )
    found = parse_note_output(out, TARGETS, len(SESSION))
    assert set(found) == {0, 2, 4}
    assert not found[0].keep and not found[2].keep
    assert found[4].keep and found[4].knowledge == "The user has a beagle called Max."
    assert found[4].context_positions == [3]  # 4 -> position 3; 5 is the turn itself; 99 dropped
    assert all(d.decided_by == "llm" for d in found.values())


def test_parse_note_output_keep_without_knowledge_is_unusable():
    found = parse_note_output(
        '{"turn": 1, "keep": true, "knowledge": "NaN"}\n{"turn": 3, "keep": false}',
        TARGETS,
        len(SESSION),
    )
    assert set(found) == {2}


@pytest.mark.parametrize("out", ["", "no JSON here", "[1, 2, 3]", '{"turn": 1, "keep": "maybe"}'])
def test_parse_note_output_malformed_raises(out):
    with pytest.raises(LLMOutputError):
        parse_note_output(out, TARGETS, len(SESSION))


# -- batched LLM path -----------------------------------------------------------------------------


def _answer(keep_knowledge):
    lines = []
    for n, know in keep_knowledge.items():
        if know is None:
            lines.append(json.dumps({"turn": n, "keep": False}))
        else:
            lines.append(
                json.dumps(
                    {
                        "turn": n,
                        "keep": True,
                        "context": f"context of {n}",
                        "knowledge": know,
                        "related": [n - 1],
                    }
                )
            )
    return "\n".join(lines)


def test_llm_path_one_call_per_session_and_records():
    llm = Scripted(
        _answer({1: None, 3: None, 5: "The user owns a beagle, Max.", 7: "Short answers.", 9: None})
    )
    usage = Usage()
    drafts, diag = build_note_drafts(SESSION, LLMClient(llm), usage=usage)
    assert len(llm.prompts) == 1 and usage.llm_calls == 1 and diag["calls"] == 1
    assert "Decide for turns: 1, 3, 5, 7, 9" in llm.prompts[0]
    assert diag == {
        "user_turns": 5,
        "calls": 1,
        "failed_calls": 0,
        "kept": 2,
        "by_llm": 5,
        "by_heuristic": 0,
    }
    d = drafts[0]
    assert d.granularity == NOTE_GRANULARITY
    assert d.turn_ids == ("s1:4", "s1:3")
    know = "The user owns a beagle, Max."
    assert d.text == note_text("context of 5", know, "2024-03-05 (Tue) 10:30")
    assert d.text.startswith("[2024-03-05 (Tue) 10:30]\nContext: context of 5\nKnowledge: ")
    assert d.key == note_key("context of 5", "The user owns a beagle, Max.")
    assert d.metadata["source_turn_id"] == "s1:4"
    assert d.metadata["context_turn_ids"] == ["s1:3"]
    assert d.metadata["decided_by"] == "llm"
    assert d.metadata["positions"] == [4, 5]


def test_llm_missing_turns_fall_back_to_heuristic():
    # the LLM only answers about turns 1 and 3; 5, 7, 9 get the offline decision
    llm = Scripted(_answer({1: None, 3: None}))
    drafts, diag = build_note_drafts(SESSION, LLMClient(llm))
    assert diag["by_llm"] == 2 and diag["by_heuristic"] == 3
    assert [d.metadata["source_turn_id"] for d in drafts] == ["s1:4", "s1:6"]
    assert all(d.metadata["decided_by"] == "heuristic" for d in drafts)


@pytest.mark.parametrize("bad", ["", "I cannot help with that.", RuntimeError("boom"), "{"])
def test_llm_misbehaving_loses_no_turn(bad):
    llm = Scripted(bad)
    usage = Usage()
    drafts, diag = build_note_drafts(SESSION, LLMClient(llm), usage=usage)
    offline, _ = build_note_drafts(SESSION, None)
    assert diag["failed_calls"] == 1 and usage.failures == 1
    assert diag["by_heuristic"] == len(USER_POS)  # every user turn still decided
    assert [(d.text, d.turn_ids) for d in drafts] == [(d.text, d.turn_ids) for d in offline]


def test_llm_empty_context_gets_offline_context():
    out = '{"turn": 5, "keep": true, "context": "", "knowledge": "Has a beagle."}'
    drafts, _ = build_note_drafts(SESSION, LLMClient(Scripted(out)))
    by_src = {d.metadata["source_turn_id"]: d for d in drafts}
    assert by_src["s1:4"].metadata["context"]  # filled, never empty
    assert by_src["s1:4"].metadata["knowledge"] == "Has a beagle."


def test_long_session_is_chunked_with_every_user_turn_asked_once():
    turns = make_turns([("user" if i % 2 == 0 else "assistant", "word " * 150) for i in range(20)])
    maker = LLMNoteMaker(LLMClient(Scripted("")), max_prompt_chars=2000)
    spans = maker.chunks(turns)
    assert len(spans) > 1
    asked = []
    for a, b in spans:
        _, targets = maker.prompt(turns, a, b)
        asked.extend(targets.values())
    assert asked == [i for i in range(20) if i % 2 == 0]


def test_given_decisions_skip_and_force():
    llm = Scripted(_answer({1: None, 3: None, 5: None, 7: None, 9: None}))
    drafts, diag = build_note_drafts(
        SESSION, LLMClient(llm), decisions={"s1:2": True, "s1:6": False}
    )
    ids = [d.metadata["source_turn_id"] for d in drafts]
    assert "s1:2" in ids and "s1:6" not in ids  # forced keep; forced skip
    everything_skipped = {t.turn_id: False for t in SESSION if t.role == "user"}
    llm2 = Scripted("unused")
    drafts2, diag2 = build_note_drafts(SESSION, LLMClient(llm2), decisions=everything_skipped)
    assert drafts2 == [] and llm2.prompts == [] and diag2["calls"] == 0


def test_no_date_prefix_and_no_timestamp():
    turns = make_turns([("user", "My cat is called Tom.")], ts=None)
    drafts, _ = build_note_drafts(turns)
    assert drafts[0].text.startswith("Context: ")
    turns = make_turns([("user", "My cat is called Tom.")])
    drafts, _ = build_note_drafts(turns, date_prefix=False)
    assert drafts[0].text.startswith("Context: ")


# -- fused reply + decision -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "out,reply,decision",
    [
        ("<Reply>: Noted.\n<Remember>: yes", "Noted.", True),
        ("<reply> Sure thing <remember>: NO", "Sure thing", False),
        ("<Respond>: x <Decision>: yes", "<Respond>: x", True),
        ("Just a reply.", "Just a reply.", None),
        ("<Reply>: Hm.\n<Remember>: perhaps", "Hm.", None),
        ("", "", None),
    ],
)
def test_parse_fused_response(out, reply, decision):
    assert parse_fused_response(out) == (reply, decision)


def test_fused_prompt_mentions_input_and_memories():
    p = fused_response_prompt("I hate cilantro.", ["The user is vegan."])
    assert "I hate cilantro." in p and "- The user is vegan." in p and "<Remember>:" in p
