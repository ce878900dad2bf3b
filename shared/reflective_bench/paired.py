"""`reflective-memory bench paired`: two runs compared question by question, with their noise.

A difference of half a point in mean coverage can be one question of a few hundred. This
command reads two `bench retrieval --json` files of the same questions (e.g. a change and the
code before it, or a messy history and the clean one: `--perturb` keeps every question) and
reports, per budget and `k=5`, the mean of the per-question differences (second minus first)
and its standard error, in points. Questions are matched by conversation and order; a run
whose conversations or question counts differ is refused.

Example:
    reflective-memory bench retrieval --data realtalk_dev.json.gz --roles ua --ablations none
        --no-baselines --ranker-folds folds --json clean.json
    reflective-memory bench retrieval ... --perturb filler --json filler.json
    reflective-memory bench paired --first clean.json --second filler.json
        --system "learned ranker, cross-validated"
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from reflective_memory.errors import ConfigError

from reflective_bench.settings_cv import cell_order

__all__ = ["paired_differences", "register"]

#: The row compared when `--system` is not given.
DEFAULT_SYSTEM = "default"


def _questions(path: str, system: str) -> dict[str, dict[str, list[float]]]:
    """`{conversation: {cell: [coverage per question]}}` of one system in one run."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable bench retrieval --json file ({exc})") from exc
    rows = data.get("coverage_by_question") if isinstance(data, dict) else None
    if not rows:
        raise ConfigError(f"{path}: no per-question coverage; re-run bench retrieval --json")
    if system not in rows:
        raise ConfigError(f"{path}: no system {system!r}; it holds {sorted(rows)}")
    return rows[system]  # type: ignore[no-any-return]


def paired_differences(
    first: dict[str, dict[str, list[float]]], second: dict[str, dict[str, list[float]]]
) -> dict[str, tuple[float, float, int]]:
    """Per cell, the mean per-question difference `second - first`, its standard error, `n`.

    Args:
        first: `{conversation: {cell: coverages}}` of the first run.
        second: The same of the second run.

    Returns:
        `{cell: (mean, standard error, questions)}` in coverage units (0-1).

    Raises:
        ConfigError: The runs do not hold the same conversations, cells and question counts.
    """
    if set(first) != set(second):
        raise ConfigError(
            f"the runs hold different conversations ({len(first)} and {len(second)}); "
            "compare runs of the same data file and --limit"
        )
    out: dict[str, tuple[float, float, int]] = {}
    cells = set().union(*(set(c) for c in first.values())) if first else set()
    for cell in cell_order(cells):
        diffs: list[float] = []
        for conv, by_cell in first.items():
            a, b = by_cell.get(cell, []), second[conv].get(cell, [])
            if len(a) != len(b):
                raise ConfigError(
                    f"conversation {conv!r}, {cell}: {len(a)} questions against {len(b)}"
                )
            diffs.extend(y - x for x, y in zip(a, b, strict=True))
        n = len(diffs)
        if n == 0:
            continue
        mean = sum(diffs) / n
        var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
        out[cell] = (mean, math.sqrt(var / n), n)
    return out


def format_paired(diffs: dict[str, tuple[float, float, int]], title: str) -> str:
    """A markdown table of `paired_differences` in points (mean ± one standard error)."""
    cells = list(diffs)
    head = "| " + " | ".join(["points", *cells]) + " |"
    rule = "|" + "---|" * (len(cells) + 1)
    row = (
        "| "
        + " | ".join([title, *(f"{100 * m:+.1f} ± {100 * se:.1f}" for m, se, _ in diffs.values())])
        + " |"
    )
    n = {q for _, _, q in diffs.values()}
    return "\n".join([head, rule, row, f"questions: {', '.join(str(q) for q in sorted(n))}"])


def _run(args: argparse.Namespace) -> int:
    first = _questions(args.first, args.system)
    second = _questions(args.second, args.system)
    diffs = paired_differences(first, second)
    print(format_paired(diffs, f"{args.second} minus {args.first}"))  # noqa: T201
    return 0


def register(bench: Any) -> None:
    """Add `bench paired` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "paired",
        help="two bench retrieval runs compared question by question (mean ± standard error)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--first", required=True, help="bench retrieval --json file (the baseline)")
    p.add_argument("--second", required=True, help="bench retrieval --json file (compared)")
    p.add_argument(
        "--system",
        default=DEFAULT_SYSTEM,
        help="row to compare, e.g. 'learned ranker, cross-validated' (default: default)",
    )
    p.set_defaults(func=_run)
