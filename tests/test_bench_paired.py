"""`bench paired`: two retrieval runs compared question by question, with a standard error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from reflective_bench.paired import paired_differences
from reflective_memory.errors import ConfigError

from tests.test_bench_ranker import _cli, chats  # noqa: F401  (fixture)


def test_the_mean_difference_and_its_standard_error_are_per_question() -> None:
    first = {"a": {"250": [0.0, 1.0, 0.5]}, "b": {"250": [1.0]}}
    second = {"a": {"250": [1.0, 1.0, 0.5]}, "b": {"250": [0.0]}}
    got = paired_differences(first, second)
    diffs = [1.0, 0.0, 0.0, -1.0]
    sd = math.sqrt(sum(d * d for d in diffs) / 3)
    assert got["250"] == pytest.approx((0.0, sd / 2, 4))
    with pytest.raises(ConfigError, match="different conversations"):
        paired_differences(first, {"a": second["a"]})
    with pytest.raises(ConfigError, match="1 questions against 2"):
        paired_differences(first, {**second, "b": {"250": [0.0, 1.0]}})


def test_retrieval_runs_compared_end_to_end(chats: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    argv = ["bench", "retrieval", "--data", str(chats), "--ablations", "none", "--budgets", "20,60"]
    runs = {}
    for name, extra in (("clean", []), ("filler", ["--perturb", "filler"])):
        runs[name] = tmp_path / f"{name}.json"
        assert _cli(*argv, *extra, "--no-baselines", "--json", str(runs[name])) == 0
    data = json.loads(runs["clean"].read_text())
    per_q = data["coverage_by_question"]["default"]
    sums = data["coverage_by_conversation"]["default"]
    for conv, cells in per_q.items():  # the lists add up to the per-conversation sums
        assert sum(cells["20"]) == pytest.approx(sums[conv]["20"][0])
        assert len(cells["20"]) == sums[conv]["20"][1]
    capsys.readouterr()
    from reflective_memory.cli import main

    args = ["bench", "paired", "--first", str(runs["clean"]), "--second", str(runs["filler"])]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| points | 20 | 60 | k=5 |" in out and " ± " in out and "questions: 6" in out
    assert main([*args, "--system", "nope"]) != 0
    assert "no system 'nope'" in capsys.readouterr().err
