"""`bench retrieval --roles`, the top-k table and session recall of the systems path (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from reflective_bench import systems as systems_module
from reflective_bench.retrieval import coverage_at_budget, session_recall
from reflective_bench.roles import as_chat, declared_user_sides, store_roles, user_side
from reflective_bench.systems import (
    ABLATIONS,
    BASELINES,
    DEFAULT,
    FOLDS,
    SystemsResult,
    format_systems,
    run_systems,
)
from reflective_memory import HashingEmbedder
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.io import (
    Conversation,
    SessionData,
    ingest_conversations,
    load_conversations,
)

# Two named speakers; speaker_b (Ben) opens the chat, so the declared speaker_a (Ana) and the
# first speaker differ.
CHAT = [
    {
        "sample_id": "chat-1",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Ben",
            "session_1_date_time": "10:42 PM on 29 December, 2023",
            "session_1": [
                {"speaker": "Ben", "dia_id": "D1:1", "text": "Hey Ana, how was the trip?"},
                {"speaker": "Ana", "dia_id": "D1:2", "text": "Great, I hiked the Lofoten ridge."},
                {"speaker": "Ben", "dia_id": "D1:3", "text": "Wow, and the weather?"},
                {"speaker": "Ana", "dia_id": "D1:4", "text": "Cold rain, but worth it."},
            ],
            "session_2_date_time": "9:10 AM on 2 January, 2024",
            "session_2": [
                {"speaker": "Ana", "dia_id": "D2:1", "text": "My sister adopted a beagle."},
                {"speaker": "Ben", "dia_id": "D2:2", "text": "What is the beagle called?"},
                {"speaker": "Ana", "dia_id": "D2:3", "text": "Her name is Pretzel."},
            ],
        },
        "qa": [
            {"question": "Where did Ana hike?", "answer": "Lofoten", "evidence": ["D1:2"]},
            {
                "question": "What is the name of the beagle?",
                "answer": "Pretzel",
                "evidence": ["D2:3"],
            },
        ],
    }
]


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    f = tmp_path / "chat.json"
    f.write_text(json.dumps(CHAT))
    return f


def _turns(conv: Conversation) -> list[tuple[str, str]]:
    return [(t["role"], t["text"]) for s in conv.sessions for t in s.turns]


def test_ua_stores_the_declared_speaker_a_as_user_and_keeps_names_in_the_text(
    chat_file: Path,
) -> None:
    convs = load_conversations(chat_file)
    assert declared_user_sides(chat_file) == {"chat-1": "Ana"}
    chat, sides = store_roles(convs, "ua", chat_file)
    assert sides == {"chat-1": "Ana"}  # speaker_a, although Ben speaks first
    assert _turns(chat[0])[:2] == [
        ("assistant", "Ben: Hey Ana, how was the trip?"),
        ("user", "Ana: Great, I hiked the Lofoten ridge."),
    ]
    assert {r for r, _ in _turns(chat[0])} == {"user", "assistant"}
    # ids, sessions, dates and questions are kept, so evidence is scored the same way
    orig, new = convs[0], chat[0]
    assert [t["turn_id"] for s in new.sessions for t in s.turns] == [
        t["turn_id"] for s in orig.sessions for t in s.turns
    ]
    assert [(s.session_id, s.date) for s in new.sessions] == [
        (s.session_id, s.date) for s in orig.sessions
    ]
    assert new.questions == orig.questions
    assert _turns(orig)[0] == ("Ben", "Hey Ana, how was the trip?")  # the input is not changed
    # names: as loaded
    same, none = store_roles(convs, "names", chat_file)
    assert same is convs and none == {}


def test_ua_falls_back_to_the_first_speaker_and_leaves_user_assistant_chats_alone() -> None:
    named = Conversation(
        "u",
        [SessionData("s1", [{"role": "Kim", "text": "hi"}, {"role": "Lee", "text": "yo"}])],
    )
    assert user_side(named) == "Kim"
    assert user_side(named, {"u": "Lee"}) == "Lee"
    assert user_side(named, {"u": "Nobody"}) == "Kim"  # a declared name that never speaks
    assert _turns(as_chat(named, "Kim")) == [("user", "Kim: hi"), ("assistant", "Lee: yo")]
    chat = Conversation(
        "v",
        [
            SessionData(
                "s1", [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "hello"}]
            )
        ],
    )
    assert user_side(chat) is None and as_chat(chat, None) is chat
    out, sides = store_roles([chat], "ua", "never-read.json")  # nothing to convert, no read
    assert out[0] is chat and sides == {}
    with pytest.raises(ConfigError):
        store_roles([chat], "speakers", "never-read.json")


def test_ua_turns_reach_the_store_as_user_and_assistant(chat_file: Path) -> None:
    chat, _ = store_roles(load_conversations(chat_file), "ua", chat_file)
    with ReflectiveMemory(None, embedder=HashingEmbedder(64)) as mem:
        ingest_conversations(mem, chat, progress=False)
        stored = [(t.role, t.text) for t in mem.turns("chat-1")]
    assert ("user", "Ana: Her name is Pretzel.") in stored
    assert ("assistant", "Ben: What is the beagle called?") in stored
    assert {r for r, _ in stored} == {"user", "assistant"}


def _bench(chat_file: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """Run `bench retrieval` on `chat_file` with the hashing embedder; the JSON summary."""
    from reflective_memory.cli import main

    out_json = tmp_path / "summary.json"
    argv = ["bench", "retrieval", "--data", str(chat_file), "--embedder", "hashing"]
    argv += ["--cache", "none", "--budgets", "10,50", "--json", str(out_json), *extra]
    assert main(argv) == 0
    return json.loads(out_json.read_text())


def _spy_ingest(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[list[tuple[str, str]]]:
    """Record the `(role, text)` turns of every conversation `module` ingests."""
    seen: list[list[tuple[str, str]]] = []
    real = module.ingest_conversations

    def spy(mem: Any, convs: Any, **kw: Any) -> Any:
        seen.append(_turns(convs[0]))
        return real(mem, convs, **kw)

    monkeypatch.setattr(module, "ingest_conversations", spy)
    return seen


def test_every_system_of_a_ua_run_stores_the_same_user_assistant_turns(
    chat_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    seen = _spy_ingest(monkeypatch, systems_module)
    summary = _bench(chat_file, tmp_path, "--roles", "ua")
    printed = capsys.readouterr().out
    # every system (but the cross-validated one, which needs fold models), and a second
    # default as shipped for the adapters' default call
    folds = [a for a in ABLATIONS if a.config.get("passages", {}).get("ranker") == FOLDS]
    assert len(seen) == 2 + len(BASELINES) + len(ABLATIONS) - len(folds)
    assert all(s == seen[0] for s in seen)
    assert seen[0][-1] == ("user", "Ana: Her name is Pretzel.")
    assert "roles: ua (user side, the rest as assistant; texts as `Name: text`): chat-1: Ana" in (
        printed
    )
    assert summary["roles"] == "ua"


def test_topk_table_and_session_recall_are_printed_after_the_budget_tables(
    chat_file: Path, tmp_path: Path, capsys: Any
) -> None:
    summary = _bench(chat_file, tmp_path, "--ablations", "none")
    printed = capsys.readouterr().out
    assert "roles:" not in printed  # the default prints no roles line
    lines = printed.splitlines()
    budget = lines.index("| system | cov@10 | cov@50 | p50 ms | p95 ms | ingest turns/s |")
    top = lines.index("what `retrieve(k=5)` returns, and the adapters' default call `retrieve()`:")
    assert lines[top + 1] == "| system | cov@k=5 | mean words | p50 ms |"
    rows = lines[top + 3 : top + 3 + 5]
    assert [r.split(" | ")[0] for r in rows] == [
        *("| " + s.name for s in (DEFAULT, *BASELINES)),
        "| default · retrieve()",
    ]
    head = "| system | recall_any@5 | recall_all@5 | recall_any@10 | recall_all@10 | ndcg@10 |"
    assert budget < top < lines.index(head)
    topk = summary["topk"]
    assert set(topk) == {s.name for s in (DEFAULT, *BASELINES)} | {"default · retrieve()"}
    for got in topk.values():
        assert got["k"] == 5 and 0.0 <= got["coverage"] <= 1.0
        assert got["mean_words"] > 0 and got["p50_ms"] > 0
    # a plain turn baseline returns 5 of the 7 turns, each as "[date] Name: text"
    # (3 words of date header, 1 of name)
    words = sorted(
        len(t["text"].split()) + 4
        for s in load_conversations(chat_file)[0].sessions
        for t in s.turns
    )
    assert sum(words[:5]) <= topk["turn dense"]["mean_words"] <= sum(words[-5:])
    # two sessions: the first 5 distinct sessions hold every answer session
    assert summary["session_recall"]["default/any@5"] == 1.0
    assert summary["session_recall"]["turn dense+BM25/all@5"] == 1.0
    assert summary["roles"] == "names"


def test_topk_zero_leaves_the_table_out_and_negative_is_refused(
    chat_file: Path, tmp_path: Path, capsys: Any
) -> None:
    summary = _bench(chat_file, tmp_path, "--ablations", "none", "--topk", "0")
    assert "retrieve(k=" not in capsys.readouterr().out and summary["topk"] == {}
    from reflective_memory.cli import main

    argv = ["bench", "retrieval", "--data", str(chat_file), "--embedder", "hashing", "--topk"]
    assert main([*argv, "-1"]) == 2
    assert "--topk must be 0 (off) or more" in capsys.readouterr().err


def test_new_measurements_do_not_move_the_budget_numbers(chat_file: Path) -> None:
    """The same run without the top-k and session-recall calls gives the same coverage."""
    convs = load_conversations(chat_file)
    systems = [DEFAULT, *BASELINES]

    def run(**kw: Any) -> SystemsResult:
        return run_systems(
            convs,
            systems,
            embedder=HashingEmbedder(64),
            budgets=(10, 50),
            coverage_fn=coverage_at_budget,
            progress=False,
            **kw,
        )

    bare = run(topk=0)
    full = run(topk=5, session_recall_fn=session_recall)
    assert not bare.topk_coverage and not bare.recall
    assert full.topk_coverage and full.recall
    assert bare.summary()["coverage"] == full.summary()["coverage"]
    assert bare.summary()["coverage_by_type"] == full.summary()["coverage_by_type"]
    assert bare.over_budget == full.over_budget and bare.questions == full.questions == 2


def _result() -> SystemsResult:
    r = SystemsResult(questions=3, over_budget=1)
    for i, s in enumerate([DEFAULT, BASELINES[1], ABLATIONS[0]]):
        for b in (10, 100):
            r.coverage[(s.name, b)] += [0.5, 0.25 * i, 1.0]
            r.by_type[(s.name, "knowledge-update", b)] += [0.5]
        r.latency_ms[s.name] += [1.0, 2.0, 3.0 + i]
        r.ingest[s.name][0] += 0.5
        r.ingest[s.name][1] += 100
        r.paths[s.name] += ["familiarity", "recollection" if i == 1 else "familiarity"]
    return r


#: `format_systems` of `_result()` before the top-k and session-recall tables existed (main at
#: 2caa5b5), character for character.
BEFORE = """questions: 3 (passage answers over budget: 1)

| system | cov@10 | cov@100 | p50 ms | p95 ms | ingest turns/s |
|---|---|---|---|---|---|
| default | 0.500 | 0.500 | 2.0 | 2.9 | 200 |
| turn dense+BM25 | 0.583 | 0.583 | 2.0 | 3.8 | 200 |

| system | cov@10 | cov@100 | p50 ms | p95 ms | ingest turns/s |
|---|---|---|---|---|---|
| default | 0.500 | 0.500 | 2.0 | 2.9 | 200 |
| - segment keys | 0.667 | 0.667 | 2.0 | 4.7 | 200 |

question type knowledge-update:
| system | cov@10 | cov@100 |
|---|---|---|
| default | 0.500 | 0.500 |
| turn dense+BM25 | 0.500 | 0.500 |
| - segment keys | 0.500 | 0.500 |

| system | dense path shares |
|---|---|
| turn dense+BM25 | familiarity 50%, recollection 50%"""


def test_existing_tables_are_unchanged_and_the_new_ones_follow_them() -> None:
    main, ablations = [DEFAULT, BASELINES[1]], [ABLATIONS[0]]
    r = _result()
    assert format_systems(r, main, ablations, (10, 100)) == BEFORE
    r.topk = 5
    for i, s in enumerate([DEFAULT, BASELINES[1], ABLATIONS[0]]):
        r.topk_coverage[s.name] += [1.0, 0.5 * i]
        r.topk_words[s.name] += [100.0, 120.0 + i]
        r.topk_latency_ms[s.name] += [1.0, 3.0]
        r.recall[(s.name, "any@5")] += [1.0, 1.0]
        r.recall[(s.name, "all@5")] += [1.0, 0.0]
    out = format_systems(r, main, ablations, (10, 100))
    assert out.startswith(BEFORE + "\n\n")
    assert out[len(BEFORE) :].splitlines()[2:] == [
        "what `retrieve(k=5)` returns, and the adapters' default call `retrieve()`:",
        "| system | cov@k=5 | mean words | p50 ms |",
        "|---|---|---|---|",
        "| default | 0.500 | 110 | 2.0 |",
        "| turn dense+BM25 | 0.750 | 110 | 2.0 |",
        "| - segment keys | 1.000 | 111 | 2.0 |",
        "",
        "session recall (first k distinct sessions of the whole ranking):",
        "| system | recall_any@5 | recall_all@5 |",
        "|---|---|---|",
        "| default | 1.000 | 0.500 |",
        "| turn dense+BM25 | 1.000 | 0.500 |",
        "| - segment keys | 1.000 | 0.500 |",
    ]


def test_roles_apply_to_the_per_unit_table_too(
    chat_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from reflective_bench import retrieval

    seen = _spy_ingest(monkeypatch, retrieval)
    summary = _bench(chat_file, tmp_path, "--roles", "ua", "--units", "turn")
    assert "roles: ua" in capsys.readouterr().out and summary["roles"] == "ua"
    assert seen and seen[0][0] == ("assistant", "Ben: Hey Ana, how was the trip?")
