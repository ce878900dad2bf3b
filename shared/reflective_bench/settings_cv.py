"""`reflective-memory bench cv-settings`: each hand-set setting's value chosen by cross-validation.

The learned ranker's weights are cross-validated by `bench fit-ranker --folds`; the settings
outside the model (how much a segment votes for its turns, how long an excerpt is, how packing
weighs length) were set by hand. This command checks them the same way.

Input: one or more `bench retrieval --json` files of runs with `--ranker-folds` and
`--variant GROUP.FIELD=VALUE` rows (the default with one setting changed, each conversation
scored by its fold's model). For each setting, and for each fold (a REALTALK chat; one of five
LongMemEval question folds), the value is the one with the best mean coverage on the *other*
folds (coverage averaged over the budgets and `k=5`, each data file weighing the same), and the
held-out fold is scored with that value. The table then shows, per file and budget, the
cross-validated coverage of the chosen values next to the shipped default's, and how many
folds chose the default. A default whose value is chosen in most folds, and whose coverage the
choice does not beat, is confirmed; otherwise the table says by how much the choice pays.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from reflective_memory.config import MemoryConfig
from reflective_memory.errors import ConfigError

logger = logging.getLogger(__name__)

#: The row that holds the shipped default, cross-validated (`bench retrieval --ranker-folds`).
DEFAULT_ROW = "learned ranker, cross-validated"


def cell_order(names: set[str]) -> list[str]:
    """Cells of a `bench retrieval --json` run: budgets in increasing order, then `k=...`."""
    return sorted((c for c in names if c.isdigit()), key=int) + sorted(
        c for c in names if not c.isdigit()
    )


@dataclass(frozen=True)
class Run:
    """One `bench retrieval --json` file, read for per-conversation coverage.

    Attributes:
        name: The file, as given.
        cells: `(row, conversation, cell)` -> (sum of coverage, questions); a cell is a budget
            (`"250"`) or `"k=5"`.
        folds: Conversation -> fold.
    """

    name: str
    cells: dict[tuple[str, str, str], tuple[float, int]]
    folds: dict[str, str]

    @classmethod
    def load(cls, path: str) -> Run:
        """Read a summary written by `bench retrieval --json` (with per-conversation cells)."""
        with open(path) as fh:
            data = json.load(fh)
        raw = data.get("coverage_by_conversation")
        if not raw or "folds" not in data:
            raise ConfigError(
                f"{path}: no per-conversation coverage; re-run bench retrieval --json"
            )
        cells: dict[tuple[str, str, str], tuple[float, int]] = {}
        for row, convs in raw.items():
            for conv, by_cell in convs.items():
                for cell, (total, n) in by_cell.items():
                    cells[(row, conv, cell)] = (float(total), int(n))
        return cls(path, cells, dict(data["folds"]))

    def rows(self) -> set[str]:
        """The rows the run holds."""
        return {r for r, _, _ in self.cells}

    def cell_names(self) -> list[str]:
        """Budgets in increasing order, then `k=...`."""
        return cell_order({c for _, _, c in self.cells})

    def mean(self, row: str, keep: set[str] | None, cell: str | None = None) -> float | None:
        """Mean coverage of `row` over the questions of the folds in `keep` (None: all).

        With `cell`, of that cell only; else the mean over every cell.
        """
        return self.mean_of(lambda fold: row if keep is None or fold in keep else None, cell)

    def mean_of(self, row_of: Callable[[str], str | None], cell: str | None = None) -> float | None:
        """Mean coverage with each fold's questions read from the row `row_of(fold)` (None: skip).

        With `cell`, of that cell only; else the mean over every cell.
        """
        cells = [cell] if cell is not None else self.cell_names()
        per_cell = []
        for c in cells:
            total = n = 0.0
            for conv, fold in self.folds.items():
                row = row_of(fold)
                got = None if row is None else self.cells.get((row, conv, c))
                if got is not None:
                    total += got[0]
                    n += got[1]
            if n:
                per_cell.append(total / n)
        return sum(per_cell) / len(per_cell) if per_cell else None


def settings_of(rows: set[str]) -> dict[str, dict[Any, str]]:
    """Variant rows grouped by setting: `{"passages.context_weight": {0.5: row, ...}}`."""
    out: dict[str, dict[Any, str]] = defaultdict(dict)
    for row in rows:
        path, sep, raw = row.partition("=")
        if not sep or "." not in path:
            continue
        out[path][json.loads(raw)] = row
    return dict(out)


def default_value(setting: str) -> Any:
    """The shipped default of `GROUP.FIELD`."""
    group, _, name = setting.partition(".")
    config = getattr(MemoryConfig(), group)
    if name not in {f.name for f in fields(config)}:
        raise ConfigError(f"unknown setting {setting!r}")
    return getattr(config, name)


def choose(runs: Sequence[Run], candidates: Mapping[Any, str], keep: set[str]) -> Any:
    """The value whose row has the best coverage on the folds in `keep` (files weigh the same).

    Ties go to the first candidate (the shipped default is listed first).
    """
    best, best_score = None, float("-inf")
    for value, row in candidates.items():
        scores = [run.mean(row, keep) for run in runs]
        got = [s for s in scores if s is not None]
        if len(got) < len(runs):
            continue
        score = sum(got) / len(got)
        if score > best_score + 1e-12:
            best, best_score = value, score
    return best


@dataclass(frozen=True)
class SettingReport:
    """What cross-validation says of one setting."""

    setting: str
    default: Any
    chosen: dict[str, Any]  # fold -> value chosen without it
    cv: dict[str, dict[str, float]]  # file -> cell -> coverage of the chosen values
    shipped: dict[str, dict[str, float]]  # file -> cell -> the default's coverage
    in_sample: Any  # the value chosen on every fold


def cross_validate(runs: Sequence[Run], setting: str, variants: Mapping[Any, str]) -> SettingReport:
    """Choose `setting` per fold without the fold, and score each fold with its choice."""
    default = default_value(setting)
    candidates = {default: DEFAULT_ROW, **{v: r for v, r in variants.items() if v != default}}
    folds = sorted({f for run in runs for f in run.folds.values()})
    chosen = {f: choose(runs, candidates, set(folds) - {f}) for f in folds}
    cv: dict[str, dict[str, float]] = {}
    shipped: dict[str, dict[str, float]] = {}
    for run in runs:
        cv[run.name], shipped[run.name] = {}, {}
        for cell in run.cell_names():
            got = run.mean_of(lambda fold: candidates[chosen[fold]], cell)
            base = run.mean(DEFAULT_ROW, None, cell)
            if got is not None and base is not None:
                cv[run.name][cell] = got
                shipped[run.name][cell] = base
    return SettingReport(
        setting, default, chosen, cv, shipped, choose(runs, candidates, set(folds))
    )


def format_report(reports: Sequence[SettingReport]) -> str:
    """Markdown: per setting, the chosen values and the coverage, chosen vs shipped."""
    lines: list[str] = []
    for rep in reports:
        values = defaultdict(int)
        for v in rep.chosen.values():
            values[json.dumps(v)] += 1
        picks = ", ".join(f"{v} in {n}" for v, n in sorted(values.items(), key=lambda x: -x[1]))
        lines += [
            f"**{rep.setting}** (shipped {json.dumps(rep.default)}; chosen on all folds: "
            f"{json.dumps(rep.in_sample)}; per held-out fold: {picks})",
            "",
        ]
        cells = next(iter(rep.cv.values())).keys() if rep.cv else []
        lines.append("| data | " + " | ".join(cells) + " |")
        lines.append("|---|" + "---|" * len(cells))
        for name in rep.cv:
            lines.append(
                f"| {name}, chosen (CV) | "
                + " | ".join(f"{rep.cv[name][c]:.3f}" for c in cells)
                + " |"
            )
            lines.append(
                f"| {name}, shipped (CV model) | "
                + " | ".join(f"{rep.shipped[name][c]:.3f}" for c in cells)
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    runs = [Run.load(p) for p in args.json]
    rows = set.intersection(*(run.rows() for run in runs))
    if DEFAULT_ROW not in rows:
        raise ConfigError(
            f"every run needs the row {DEFAULT_ROW!r} (bench retrieval --ranker-folds)"
        )
    settings = settings_of(rows)
    if not settings:
        raise ConfigError("no --variant rows common to every run")
    reports = [cross_validate(runs, s, settings[s]) for s in sorted(settings)]
    print(format_report(reports))  # noqa: T201
    return 0


def register(bench: Any) -> None:
    """Add `bench cv-settings` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "cv-settings",
        help="each hand-set setting's value chosen by cross-validation (from bench retrieval runs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--json",
        action="append",
        required=True,
        help="a `bench retrieval --ranker-folds --variant ... --json` file (repeatable)",
    )
    p.set_defaults(func=_run)
