import argparse
from datetime import datetime, timedelta, timezone

import numpy as np
import reflective_memory.bench.transfer as transfer
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.bench.datasets import load_conversations
from reflective_memory.passages import TurnVotes
from reflective_memory.types import Turn

from tests.test_bench_feedback import _locomo_file


def _turn(i, text, role="Ann"):
    ts = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=i)
    return Turn("u", "s", role, text, f"t{i}", i, timestamp=ts)


def test_turn_features_describe_each_voted_turn():
    turns = [
        _turn(0, "Where did you go last week?"),
        _turn(1, "I went to Lisbon on the 3rd with my sister"),
        _turn(2, "lol ok"),
    ]
    votes = TurnVotes()
    votes.add(("s", 0), 0.5, "a")
    votes.add(("s", 1), 0.9, "b")
    votes.add(("s", 1), 0.1, "c")
    votes.add(("s", 2), 0.2, None)
    keys, x = transfer.turn_features(votes, lambda sid: turns)
    assert keys == [("s", 0), ("s", 1), ("s", 2)]
    f = {name: x[:, j].tolist() for j, name in enumerate(transfer.FEATURE_NAMES)}
    assert f["question"] == [1.0, 0.0, 0.0]
    assert f["digit"] == [0.0, 1.0, 0.0]
    assert f["first_person"] == [0.0, 1.0, 0.0]
    assert f["short"] == [0.0, 0.0, 1.0]
    assert f["voters"] == [1.0, 2.0, 0.0]
    assert f["log_rank"] == [np.log1p(1), 0.0, np.log1p(2)]  # turn 1 has the most votes
    assert transfer.turn_features(TurnVotes(), lambda sid: turns)[1].shape == (0, 7)


def _memory(cls):
    mem = cls(
        None, embedder=HashingEmbedder(), config=MemoryConfig(passages={"budget_unit": "words"})
    )
    texts = [
        "we talked about the weather in spring",
        "my cat Tom likes the weather on the balcony",
        "the weather report said rain all week",
        "I bought a new umbrella for the weather",
    ]
    for i, text in enumerate(texts):
        mem.add_turn("u", f"s{i}", "user", text)
        mem.end_session("u", f"s{i}")
    return mem


def test_study_rule_runs_inside_the_real_pipeline():
    plain, study = _memory(ReflectiveMemory), _memory(transfer.StudyMemory)
    q = "what about the weather?"

    def top(mem):
        return [h.memory.text for h in mem.retrieve("u", q, budget_tokens=14).hits]

    assert top(study) == top(plain)  # no rule: the library's votes
    calls = []

    def favour_umbrella(user_id, votes, session_turns):
        calls.append(user_id)
        for key in votes.turn:
            if "umbrella" in session_turns(key[0])[key[1]].text:
                votes.turn[key] *= 100.0

    study.rule = favour_umbrella
    got = top(study)
    assert calls and set(calls) == {"u"}
    assert "umbrella" in got[0] and top(plain)[0] != got[0]


def test_tiny_run_reports_every_row(tmp_path):
    convs = load_conversations(_locomo_file(tmp_path, users=2, questions=6))
    rows = transfer.run_transfer(
        convs, seeds=[0, 1], strengths=[0.5], embedder=HashingEmbedder(), progress=False
    )
    names = set(rows)
    assert names == {
        "free ceiling",
        "oracle credit x1.5",
        "oracle features 0.5",
        "citation features 0.5",
        "citation features, online TurnPrior 0.5",
    }
    for name, per_split in rows.items():
        assert len(per_split) == 2 and all(a.shape == (5,) for a in per_split)
        if name != "free ceiling":
            assert np.isfinite(np.vstack(per_split)).all()
    # every question has its own evidence turn: teaching evidence never answers a test question
    assert all(a[2] == 0.0 for a in rows["free ceiling"])
    table = transfer.format_transfer(rows, (250, 500, 1000, 2000, 4000))
    assert "| oracle credit x1.5 |" in table and "Δcov@1000" in table


def test_register_adds_parser():
    p = argparse.ArgumentParser()
    transfer.register(p.add_subparsers())
    ns = p.parse_args(["transfer", "--data", "x.json", "--strengths", "0.1,1"])
    assert ns.strengths == [0.1, 1.0] and ns.splits == 5 and ns.func is transfer._run
