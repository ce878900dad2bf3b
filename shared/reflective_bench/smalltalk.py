"""Fit the short-turn rule's one constant and cross-validate it (issues 38, 49).

A turn of at most `reflective_memory.retrieval.redundancy.SHORT_WORDS` words is read with the
turn before it, never alone ("Got it.", "Tusen takk!"). This runs the default system
(`reflective_bench.systems.DEFAULT`) on each conversation of a file once per candidate word
count, keeps every question's coverage at each word budget and at `k=5`, and then leaves one
conversation out: the count with the best mean on the other conversations (the mean of the
budgets' and `k=5`'s coverage; ties go to the smaller count, which holds fewer turns back) is
scored on the one left out. `--perturb` measures it on a messy history
(`reflective_bench.perturb`).

Run from a source checkout (one benchmark at a time on a shared box)::

    python -m reflective_bench.smalltalk --data ../shared/data/realtalk_dev.json.gz \
        --words 0,1,2,3,4 --json smalltalk.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from reflective_memory.embed import Embedder
from reflective_memory.io import Conversation
from reflective_memory.retrieval import redundancy
from tqdm import tqdm

from reflective_bench.perturb import PERTURBATIONS, Copies, load_perturbed
from reflective_bench.retrieval import (
    DEFAULT_BUDGETS,
    add_embedder_arguments,
    coverage_at_budget,
    make_embedder,
)
from reflective_bench.roles import ROLES
from reflective_bench.systems import DEFAULT, run_systems

__all__ = ["ShareRuns", "run_shares", "leave_one_out", "main"]

#: A question's coverages: one per budget, then `k=5`'s.
Row = list[float]


@dataclass
class ShareRuns:
    """Per-question coverage of the default system, by word count and conversation.

    Attributes:
        budgets: The word budgets (a row holds one coverage per budget, then `k=5`'s).
        rows: `rows[words][user_id]` = one row per question with evidence.
    """

    budgets: tuple[int, ...]
    rows: dict[int, dict[str, list[Row]]] = field(default_factory=dict)


def run_shares(
    conversations: Sequence[Conversation],
    embedder: Embedder,
    shares: Sequence[int],
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    progress: bool = True,
    copies: Copies | None = None,
) -> ShareRuns:
    """Measure the default system on every conversation once per word count.

    Args:
        conversations: Conversations with questions.
        embedder: Shared embedder.
        shares: Candidate values of `redundancy.SHORT_WORDS`.
        budgets: Word budgets.
        progress: Show a progress bar.
        copies: A `repeated` perturbation's copies (each counts as its original).

    Returns:
        The per-question coverages.
    """
    out = ShareRuns(tuple(budgets))
    kept = redundancy.SHORT_WORDS
    try:
        for share in tqdm(shares, desc="words", disable=not progress):
            redundancy.SHORT_WORDS = share
            out.rows[share] = {}
            for conv in conversations:
                res = run_systems(
                    [conv],
                    [DEFAULT],
                    embedder=embedder,
                    budgets=budgets,
                    coverage_fn=coverage_at_budget,
                    topk=5,
                    progress=False,
                    copies=copies,
                )
                cols = [res.coverage[(DEFAULT.name, b)] for b in budgets]
                cols.append(res.topk_coverage[DEFAULT.name])
                out.rows[share][conv.user_id] = [list(r) for r in zip(*cols, strict=True)]
    finally:
        redundancy.SHORT_WORDS = kept
    return out


def _score(rows: list[Row]) -> float:
    """The mean of the budgets' and `k=5`'s mean coverage."""
    return float(np.mean(np.asarray(rows, dtype=float))) if rows else 0.0


def leave_one_out(runs: ShareRuns) -> dict[str, object]:
    """Choose the share on all conversations but one, score it on that one, for each.

    Returns:
        `chosen` (held-out user -> share), `held_out` (coverage per budget and `k=5` over
        the held-out questions, pooled) and `in_sample` (the same per share, all questions).
    """
    shares = sorted(runs.rows)
    users = list(runs.rows[shares[0]])
    chosen: dict[str, int] = {}
    pooled: list[Row] = []
    for out in users:
        best = max(
            shares,
            key=lambda s: (
                _score([r for u in users if u != out for r in runs.rows[s][u]]),
                -s,  # ties: the smaller count holds fewer turns back
            ),
        )
        chosen[out] = best
        pooled += runs.rows[best][out]
    names = [f"cov@{b}" for b in runs.budgets] + ["cov@k=5"]

    def table(rows: list[Row]) -> dict[str, float]:
        means = np.asarray(rows, dtype=float).mean(axis=0)
        return {n: round(float(m), 4) for n, m in zip(names, means, strict=True)}

    in_sample = {str(s): table([r for u in users for r in runs.rows[s][u]]) for s in shares}
    return {"chosen": chosen, "held_out": table(pooled), "in_sample": in_sample}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m reflective_bench.smalltalk`: print (and optionally save) the fit as JSON."""
    p = argparse.ArgumentParser(prog="python -m reflective_bench.smalltalk", description=__doc__)
    p.add_argument("--data", required=True, help="conversation file (.json or .json.gz)")
    p.add_argument("--words", default="0,1,2,3,4", help="word counts to try (default 0,1,2,3,4)")
    p.add_argument("--roles", choices=ROLES, default="names", help="how turns are stored")
    p.add_argument(
        "--perturb", choices=PERTURBATIONS, default="none", help="a messy history (default none)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    p.add_argument("--json", default=None, help="also write the result here")
    add_embedder_arguments(p)
    args = p.parse_args(argv)
    perturbed, _ = load_perturbed(args.data, args.roles, args.limit, args.perturb)
    words = [int(s) for s in args.words.split(",")]
    runs = run_shares(
        perturbed.conversations,
        make_embedder(args.embedder, args.cache),
        words,
        copies=perturbed.copies,
    )
    result = {
        "data": args.data,
        "roles": args.roles,
        "perturb": args.perturb,
        **leave_one_out(runs),
    }
    dumped = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(dumped)
    print(dumped)  # noqa: T201 - a command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
