"""Fit the small-talk rule's one fitted constant and cross-validate it (issue 38).

A turn is small talk when its words are all common in the user's turns
(`reflective_memory.text.WordCounts`); "common" is a share of the user's turns,
`text.COMMON_SHARE`. This runs the default system (`reflective_bench.systems.DEFAULT`) on each
conversation of a file once per candidate share, keeps every question's coverage at each word
budget and at `k=5`, and then leaves one conversation out: the share with the best mean on the
other conversations (the mean of the budgets' and `k=5`'s coverage; ties go to the larger,
more cautious share) is scored on the one left out.

Run from a source checkout (one benchmark at a time on a shared box)::

    python -m reflective_bench.smalltalk --data ../shared/data/realtalk_dev.json.gz \
        --shares 0.01,0.02,0.03,0.04,0.05,0.08 --json smalltalk.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from reflective_memory import text
from reflective_memory.embed import Embedder
from reflective_memory.io import Conversation, load_conversations
from tqdm import tqdm

from reflective_bench.retrieval import (
    DEFAULT_BUDGETS,
    add_embedder_arguments,
    coverage_at_budget,
    make_embedder,
)
from reflective_bench.roles import ROLES, store_roles
from reflective_bench.systems import DEFAULT, run_systems

__all__ = ["ShareRuns", "run_shares", "leave_one_out", "main"]

#: A question's coverages: one per budget, then `k=5`'s.
Row = list[float]


@dataclass
class ShareRuns:
    """Per-question coverage of the default system, by share and conversation.

    Attributes:
        budgets: The word budgets (a row holds one coverage per budget, then `k=5`'s).
        rows: `rows[share][user_id]` = one row per question with evidence.
    """

    budgets: tuple[int, ...]
    rows: dict[float, dict[str, list[Row]]] = field(default_factory=dict)


def run_shares(
    conversations: Sequence[Conversation],
    embedder: Embedder,
    shares: Sequence[float],
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    progress: bool = True,
) -> ShareRuns:
    """Measure the default system on every conversation once per share.

    Args:
        conversations: Conversations with questions.
        embedder: Shared embedder.
        shares: Candidate values of `text.COMMON_SHARE`.
        budgets: Word budgets.
        progress: Show a progress bar.

    Returns:
        The per-question coverages.
    """
    out = ShareRuns(tuple(budgets))
    kept = text.COMMON_SHARE
    try:
        for share in tqdm(shares, desc="shares", disable=not progress):
            text.COMMON_SHARE = share
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
                )
                cols = [res.coverage[(DEFAULT.name, b)] for b in budgets]
                cols.append(res.topk_coverage[DEFAULT.name])
                out.rows[share][conv.user_id] = [list(r) for r in zip(*cols, strict=True)]
    finally:
        text.COMMON_SHARE = kept
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
    chosen: dict[str, float] = {}
    pooled: list[Row] = []
    for out in users:
        best = max(
            shares,
            key=lambda s: (
                _score([r for u in users if u != out for r in runs.rows[s][u]]),
                s,  # ties: the larger share flags less
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
    p.add_argument("--shares", default="0.01,0.02,0.03,0.04,0.05,0.08")
    p.add_argument("--roles", choices=ROLES, default="names")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    p.add_argument("--json", default=None, help="also write the result here")
    add_embedder_arguments(p)
    args = p.parse_args(argv)
    convs = load_conversations(args.data)[: args.limit]
    convs, _ = store_roles(convs, args.roles, args.data)
    shares = [float(s) for s in args.shares.split(",")]
    runs = run_shares(convs, make_embedder(args.embedder, args.cache), shares)
    result = {"data": args.data, "roles": args.roles, **leave_one_out(runs)}
    dumped = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(dumped)
    print(dumped)  # noqa: T201 - a command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
