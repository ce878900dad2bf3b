from __future__ import annotations

import gzip
import json

import pytest
from reflective_memory import InvalidInputError
from reflective_memory.io import load_conversations

LOCOMO = [
    {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group."},
                {
                    "speaker": "Melanie",
                    "dia_id": "D1:2",
                    "text": "How was it?",
                    "blip_caption": "a photo of a sunset",
                },
            ],
            "session_2_date_time": "7:00 pm on 9 June, 2023",
            "session_2": [
                {"speaker": "Melanie", "dia_id": "D2:1", "text": "I painted a lake."},
            ],
        },
        "qa": [
            {
                "question": "What did Melanie paint?",
                "answer": "a lake",
                "evidence": ["D2:1"],
                "category": 1,
            },
            {
                "question": "Adversarial?",
                "adversarial_answer": "no",
                "evidence": ["D9:9"],
                "category": 5,
            },
        ],
    }
]

LONGMEMEVAL = [
    {
        "question_id": "q1",
        "question_type": "single-session-user",
        "question": "What degree did I graduate with?",
        "answer": "Business Administration",
        "question_date": "2023/05/23 (Tue) 19:11",
        "haystack_dates": ["2023/05/21 (Sun) 11:54", "2023/05/22 (Mon) 09:00"],
        "haystack_session_ids": ["a", "a"],
        "answer_session_ids": ["a"],
        "haystack_sessions": [
            [
                {
                    "role": "user",
                    "content": "I graduated in Business Administration.",
                    "has_answer": True,
                },
                {"role": "assistant", "content": "Congratulations!"},
            ],
            [{"role": "user", "content": "Any tips for tomatoes?"}],
        ],
    }
]


def test_locomo(tmp_path) -> None:
    p = tmp_path / "locomo.json"
    p.write_text(json.dumps(LOCOMO))
    (conv,) = load_conversations(p)
    assert conv.user_id == "conv-1"
    assert [s.session_id for s in conv.sessions] == ["session_1", "session_2"]
    first = conv.sessions[0].turns
    assert first[0] == {
        "role": "Caroline",
        "text": "I went to a support group.",
        "turn_id": "D1:1",
        "timestamp": "1:56 pm on 8 May, 2023",
    }
    assert "a photo of a sunset" in first[1]["text"]
    assert conv.questions[0].evidence == ["D2:1"]
    assert conv.questions[0].evidence_sessions == ["session_2"]
    assert conv.questions[1].evidence == [] and conv.questions[1].answer == "no"


def test_longmemeval_gz_with_repeated_session_ids(tmp_path) -> None:
    p = tmp_path / "lme.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump(LONGMEMEVAL, fh)
    (conv,) = load_conversations(p)
    assert conv.user_id == "q1"
    assert [s.session_id for s in conv.sessions] == ["a", "a#2"]
    assert conv.questions[0].evidence == ["a:0"]
    assert conv.questions[0].evidence_sessions == ["a"]
    assert conv.sessions[0].turns[0]["timestamp"] == "2023/05/21 (Sun) 11:54"


def test_our_schema_and_default_user(tmp_path) -> None:
    data = {
        "format": "reflective-memory/v1",
        "sessions": [{"session_id": "s1", "turns": [{"role": "user", "text": "hi"}]}],
    }
    p = tmp_path / "ours.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="no user_id"):
        load_conversations(p)
    (conv,) = load_conversations(p, default_user="zoe")
    assert conv.user_id == "zoe" and conv.n_turns == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a readable JSON"),
        ('{"hello": 1}', "unknown format"),
        (
            '{"format": "reflective-memory/v1", "sessions": [{"turns": [{"text": "x"}]}]}',
            r"sessions\[0\]\.turns\[0\]: missing key 'role'",
        ),
    ],
)
def test_bad_files(tmp_path, content, message) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(InvalidInputError, match=message):
        load_conversations(p, default_user="u")
    with pytest.raises(InvalidInputError, match="no such file"):
        load_conversations(tmp_path / "missing.json")


def test_bundled_demo_conversation_is_consistent() -> None:
    from importlib import resources

    with resources.as_file(
        resources.files("reflective_memory") / "data" / "demo_conversation.json"
    ) as p:
        (conv,) = load_conversations(p)
    ids = [t["turn_id"] for s in conv.sessions for t in s.turns]
    assert len(conv.sessions) >= 5 and len(ids) >= 80 and len(set(ids)) == len(ids)
    assert len(conv.questions) >= 5
    for q in conv.questions:
        assert q.evidence and set(q.evidence) <= set(ids)
