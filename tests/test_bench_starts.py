"""`bench fit-starts` and `bench retrieval --starts-folds`, on small chats (hashing embedder)."""

from __future__ import annotations

import json
from pathlib import Path

from reflective_bench.starts import log_turns
from reflective_bench.systems import fold_of
from reflective_memory.io import load_conversations
from reflective_memory.sessions.starts import load_starts
from test_bench_ranker import CHATS, _cli


def test_fit_starts_writes_a_model_and_one_per_fold(tmp_path: Path, capsys) -> None:
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps(CHATS))
    out, folds = tmp_path / "starts.json", tmp_path / "folds"
    argv = ["bench", "fit-starts", "--data", str(chats), "--out", str(out)]
    assert _cli(*argv, "--folds", str(folds), "--min-turns", "10") == 0
    model = load_starts(str(out))
    assert model is not None and (model.threshold, model.min_turns) == (0.9, 10)
    convs = load_conversations(chats)
    # each chat is three sessions of four turns: a log of 12 turns with starts at 4 and 8
    assert log_turns(convs[0])[1] == [4, 8]
    assert model.model["fitted"]["gaps"] == 22 and model.model["fitted"]["starts"] == 4
    assert set(model.model["fitted"]["cross_validated"]["0.9"]) == {
        "precision",
        "recall",
        "false_per_100_turns",
    }
    names = sorted(p.name for p in folds.iterdir())
    assert names == sorted(f"{fold_of(c)}.json" for c in convs)  # leave one chat out
    for c in convs:
        fold = load_starts(str(folds / f"{fold_of(c)}.json"))
        assert fold is not None and fold.model["fitted"]["without_fold"] == fold_of(c)
        assert fold.model["fitted"]["gaps"] == 11  # the other chat's gaps only
    printed = capsys.readouterr().out
    assert "| dip3 |" in printed and "| p >= 0.9 |" in printed and "2 fold models" in printed
    # every system of a run reads each conversation with its fold's detector
    summary = tmp_path / "summary.json"
    argv = ["bench", "retrieval", "--data", str(chats), "--ablations", "none", "--budgets", "20"]
    argv += ["--perturb", "bare", "--no-baselines", "--starts-folds", str(folds)]
    assert _cli(*argv, "--json", str(summary)) == 0
    assert 0.0 <= json.loads(summary.read_text())["coverage"]["default/20"] <= 1.0
