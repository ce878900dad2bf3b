"""`bench retrieval --variant` rows and `bench cv-settings`: settings chosen by cross-validation."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from reflective_bench.settings_cv import DEFAULT_ROW, Run, cross_validate, format_report
from reflective_bench.systems import FOLDS, variant_system
from reflective_memory.errors import ConfigError

from tests.test_bench_ranker import _cli, chats  # noqa: F401  (fixture)


def _run(cells: dict[tuple[str, str, str], tuple[float, int]], folds: dict[str, str]) -> Run:
    return Run("data.json", cells, folds)


def test_each_fold_is_scored_with_the_value_chosen_without_it() -> None:
    # three chats; 0.5 wins on chats a and b, the default (0.25) on chat c by a wide margin
    folds = {"a": "fa", "b": "fb", "c": "fc"}
    cov = {
        DEFAULT_ROW: {"a": 0.5, "b": 0.5, "c": 0.9},
        "passages.context_weight=0.5": {"a": 0.7, "b": 0.6, "c": 0.1},
    }
    cells = {(row, conv, "250"): (v * 2, 2) for row, by in cov.items() for conv, v in by.items()}
    rep = cross_validate(
        [_run(cells, folds)], "passages.context_weight", {0.5: "passages.context_weight=0.5"}
    )
    assert rep.default == 0.25
    # without a: b (0.6 vs 0.5) and c (0.1 vs 0.9) -> default; without b: the same; without c:
    # a and b both favour 0.5
    assert rep.chosen == {"fa": 0.25, "fb": 0.25, "fc": 0.5}
    assert rep.cv["data.json"]["250"] == pytest.approx((0.5 + 0.5 + 0.1) / 3)
    assert rep.shipped["data.json"]["250"] == pytest.approx((0.5 + 0.5 + 0.9) / 3)
    assert rep.in_sample == 0.25
    text = format_report([rep])
    assert "passages.context_weight" in text and "0.25 in 2" in text and "0.5 in 1" in text


def test_a_variant_names_one_setting_and_fails_before_any_work() -> None:
    sys = variant_system("passages.context_weight=0.5", folds=True)
    assert sys.name == "passages.context_weight=0.5"
    assert sys.config == {"passages": {"context_weight": 0.5, "ranker": FOLDS}}
    for bad in ("context_weight=0.5", "passages.context_weight", "passages.nope=1"):
        with pytest.raises(ConfigError):
            variant_system(bad)
    with pytest.raises(ConfigError, match="context_weight"):
        variant_system("passages.context_weight=-1")


def test_a_variant_that_sets_the_ranker_runs_that_ranker_with_folds_beside_it(tmp_path) -> None:
    """`--variant passages.ranker=FILE` beside `--ranker-folds` runs FILE, as its row says.
    Before, the folds replaced it and the row was a copy of the cross-validated one."""
    model = tmp_path / "ranker.json"
    model.write_text(
        (files("reflective_memory") / "data" / "turn_ranker.json").read_text(), "utf-8"
    )
    sys = variant_system(f"passages.ranker={model}", folds=True)
    assert sys.config == {"passages": {"ranker": str(model)}}


def test_variant_rows_then_cv_settings_end_to_end(chats: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    folds = tmp_path / "folds"
    argv = ["bench", "fit-ranker", "--data", str(chats), "--out", str(tmp_path / "m.json")]
    assert _cli(*argv, "--folds", str(folds)) == 0
    summary = tmp_path / "summary.json"
    argv = ["bench", "retrieval", "--data", str(chats), "--ablations", "none", "--budgets", "20,60"]
    variants = ["--variant", "passages.context_weight=0", "--variant", "passages.excerpt_length=5"]
    assert _cli(*argv, *variants, "--ranker-folds", str(folds), "--json", str(summary)) == 0
    data = json.loads(summary.read_text())
    assert len(set(data["folds"].values())) == 2  # leave one chat out
    for row in ("passages.context_weight=0", DEFAULT_ROW, "default"):
        cells = data["coverage_by_conversation"][row]
        for cell in ("20", "60", "k=5"):
            assert sum(cells[c][cell][1] for c in cells) == 6  # every question once
    capsys.readouterr()
    from reflective_memory.cli import main

    assert main(["bench", "cv-settings", "--json", str(summary)]) == 0
    out = capsys.readouterr().out
    assert "**passages.context_weight** (shipped 0.25" in out
    assert "**passages.excerpt_length** (shipped 50" in out
    # a run without per-conversation cells is refused with the reason
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"coverage": {}}))
    assert main(["bench", "cv-settings", "--json", str(old)]) != 0
    assert "no per-conversation coverage" in capsys.readouterr().err
