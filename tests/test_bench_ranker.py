"""`bench fit-ranker` and the cross-validated row of `bench retrieval`, on small chats."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from reflective_bench.retrieval import session_ndcg
from reflective_bench.systems import fold_of
from reflective_memory.io import Conversation, Question, load_conversations
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.ranker import load_ranker
from reflective_memory.types import Hit, Memory, Retrieval


def _chat(sample: str, people: tuple[str, str], facts: list[tuple[str, str, str]]) -> dict:
    """A two-person chat of three sessions; each fact is (question, answer turn, small talk)."""
    a, b = people
    conv: dict[str, Any] = {"speaker_a": a, "speaker_b": b}
    qa = []
    for n, (question, fact, chatter) in enumerate(facts, 1):
        conv[f"session_{n}_date_time"] = f"10:00 AM on {n} March, 2024"
        conv[f"session_{n}"] = [
            {"speaker": b, "dia_id": f"D{n}:1", "text": f"Hey {a}, what's new?"},
            {"speaker": a, "dia_id": f"D{n}:2", "text": chatter},
            {"speaker": a, "dia_id": f"D{n}:3", "text": fact},
            {"speaker": b, "dia_id": f"D{n}:4", "text": "Nice, tell me more another time."},
        ]
        qa.append({"question": question, "answer": "", "evidence": [f"D{n}:3"]})
    return {"sample_id": sample, "conversation": conv, "qa": qa}


CHATS = [
    _chat(
        "chat-1",
        ("Ana", "Ben"),
        [
            ("Where did Ana hike?", "I hiked the Lofoten ridge in the rain.", "Busy week here."),
            ("What is Ana's dog called?", "My dog is called Pretzel.", "The weather is grim."),
            ("What does Ana cook?", "I cook a mushroom risotto on Sundays.", "Work was long."),
        ],
    ),
    _chat(
        "chat-2",
        ("Cleo", "Dan"),
        [
            ("Which city did Cleo visit?", "I visited Porto with my aunt.", "So tired today."),
            ("What instrument does Cleo play?", "I play the cello in a quartet.", "Rainy again."),
            ("What does Cleo read?", "I am reading a novel about whales.", "Long day."),
        ],
    ),
]


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    f = tmp_path / "chats.json"
    f.write_text(json.dumps(CHATS))
    return f


def _cli(*argv: str) -> int:
    from reflective_memory.cli import main

    return main([*argv, "--embedder", "hashing", "--cache", "none"])


def test_fit_ranker_writes_a_model_and_one_per_fold(chats: Path, tmp_path: Path, capsys) -> None:
    out, folds, table = tmp_path / "ranker.json", tmp_path / "folds", tmp_path / "rows.npz"
    argv = ["bench", "fit-ranker", "--data", f"{chats}:names", "--data", f"{chats}:ua"]
    assert _cli(*argv, "--table", str(table), "--out", str(out), "--folds", str(folds)) == 0
    model = load_ranker(str(out))
    assert tuple(model.weights) == FEATURES and model.fitted["questions"] == 12
    assert sorted(model.fitted["data"]) == ["chats.json:names", "chats.json:ua"]
    convs = load_conversations(chats)
    names = sorted(p.name for p in folds.iterdir())
    assert names == sorted(f"{fold_of(c)}.json" for c in convs)  # leave one chat out
    for path in folds.iterdir():
        fold = load_ranker(str(path))
        assert fold.fitted["questions"] == 6  # both roles of the other chat
    printed = capsys.readouterr().out
    assert "| cosine |" in printed and "2 fold models" in printed
    # refit from the rows alone: the same weights
    again = tmp_path / "again.json"
    assert _cli("bench", "fit-ranker", "--table", str(table), "--out", str(again)) == 0
    assert load_ranker(str(again)).weights == model.weights
    # the rows of every question are views of one matrix read once, not one copy each
    from reflective_bench.ranker import _load_table

    rows = _load_table(str(table))
    bases = {id(r[1].base) for _, r in rows}
    assert len(rows) == 12 and len(bases) == 1


def test_retrieval_prints_the_cross_validated_row(chats: Path, tmp_path: Path, capsys) -> None:
    folds = tmp_path / "folds"
    argv = ["bench", "fit-ranker", "--data", str(chats), "--out", str(tmp_path / "m.json")]
    assert _cli(*argv, "--folds", str(folds)) == 0
    summary = tmp_path / "summary.json"
    argv = ["bench", "retrieval", "--data", str(chats), "--ablations", "none", "--budgets", "20"]
    assert _cli(*argv, "--ranker-folds", str(folds), "--json", str(summary)) == 0
    assert "| learned ranker, cross-validated |" in capsys.readouterr().out
    got = json.loads(summary.read_text())["coverage"]
    assert 0.0 <= got["learned ranker, cross-validated/20"] <= 1.0
    # without the folds the row cannot run, and says so
    from reflective_memory.errors import ConfigError

    with pytest.raises(ConfigError, match="--ranker-folds"):
        from reflective_bench.systems import run_systems, system_by_name
        from reflective_memory import HashingEmbedder

        run_systems(
            load_conversations(chats),
            [system_by_name("learned ranker, cross-validated")],
            embedder=HashingEmbedder(dim=64),
            budgets=[20],
            coverage_fn=lambda r, e, b: (0.0, 0),
            progress=False,
        )


def test_folds_leave_one_chat_out_and_split_single_questions_five_ways() -> None:
    chat = Conversation("chat-1", [], [Question("a"), Question("b")])
    assert fold_of(chat) == fold_of(Conversation("chat-1", [], [Question("c")] * 3))
    assert fold_of(chat) != fold_of(Conversation("chat-2", [], [Question("a"), Question("b")]))
    singles = {fold_of(Conversation(f"q{i}", [], [Question("x")])) for i in range(200)}
    assert singles == {f"questions-{k}" for k in range(5)}


def _ranking(sessions: list[str]) -> Retrieval:
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    hits = [
        Hit(Memory(f"m{i}", "u", s, "turn", "text", "key", (f"t{i}",), now, now), 1.0, i)
        for i, s in enumerate(sessions)
    ]
    return Retrieval("u", "q", hits, {})


def test_session_ndcg_counts_distinct_sessions_in_order() -> None:
    assert session_ndcg(_ranking(["a", "a", "b", "c"]), {"a", "b"}) == pytest.approx(1.0)
    # evidence second and third among distinct sessions
    got = session_ndcg(_ranking(["x", "x", "a", "b"]), {"a", "b"})
    ideal = 1 + 1 / 1.584962500721156
    assert got == pytest.approx((1 / 1.584962500721156 + 0.5) / ideal)
    assert session_ndcg(_ranking(["x"]), set()) == 0.0
