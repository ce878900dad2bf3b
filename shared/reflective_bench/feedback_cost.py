"""`reflective-memory bench feedback-cost`: what one feedback episode and one retrieval cost.

A user with `--sessions` sessions of four turns each (hashing embedder: the model's time is not
what is measured) asks `--rounds` questions on a default memory; each answer cites the last
shown passage. Reported per store (SQLite with its state in files, and PostgreSQL on a local
throwaway cluster with `--pg`): feedback p50 / p95 / max (the maximum is an episode that stores
a batch, `rerank.save_every`) and retrieval p50 after a warm-up.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Any

from reflective_memory import HashingEmbedder, ReflectiveMemory

__all__ = ["measure", "register"]

logger = logging.getLogger(__name__)


def measure(mem: ReflectiveMemory, *, sessions: int = 12, rounds: int = 400) -> dict[str, float]:
    """Fill `mem` with one user's notes, then time `rounds` retrieve + feedback calls.

    Returns:
        Milliseconds: `feedback_p50`, `feedback_p95`, `feedback_max`, `retrieve_p50` (the
        first tenth of the rounds left out as warm-up), and `learned` (episodes learned).
    """
    for s in range(sessions):
        for i in range(4):
            text = f"note {s} {i} about topic {s % 5} and item {i}"
            when = f"2024-01-{s % 28 + 1:02d}T10:0{i}:00Z"
            mem.add_turn("u", f"s{s}", "user", text, timestamp=when)
        mem.end_session("u", f"s{s}")
    fb: list[float] = []
    rt: list[float] = []
    learned = 0
    for k in range(rounds):
        t0 = time.perf_counter()
        r = mem.retrieve("u", f"what about topic {k % 5} item {k % 4}", budget_tokens=120)
        rt.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        learned += mem.feedback(r, cited=[len(r.hits) - 1]).learned
        fb.append((time.perf_counter() - t0) * 1000)
    fb.sort()
    return {
        "feedback_p50": statistics.median(fb),
        "feedback_p95": fb[int(0.95 * (len(fb) - 1))],
        "feedback_max": fb[-1],
        "retrieve_p50": statistics.median(rt[rounds // 10 :]),
        "learned": float(learned),
    }


def run(args: argparse.Namespace) -> int:
    """Measure on SQLite (and PostgreSQL with `--pg`); print one line per store."""
    rows: dict[str, dict[str, float]] = {}
    with ReflectiveMemory(tempfile.mkdtemp(), embedder=HashingEmbedder()) as mem:
        rows["SQLite"] = measure(mem, sessions=args.sessions, rounds=args.rounds)
    if args.pg:
        from reflective_bench.pg_local import Cluster

        cluster = Cluster().start()
        try:
            with ReflectiveMemory(store=cluster.dsn, embedder=HashingEmbedder()) as mem:
                rows["PostgreSQL"] = measure(mem, sessions=args.sessions, rounds=args.rounds)
        finally:
            cluster.stop()
    for name, m in rows.items():
        print(  # noqa: T201 - the command's output
            f"{name}: feedback p50 {m['feedback_p50']:.3f} ms, p95 {m['feedback_p95']:.2f} ms, "
            f"max {m['feedback_max']:.1f} ms ({m['learned']:.0f} learned); "
            f"retrieve p50 {m['retrieve_p50']:.2f} ms"
        )
    return 0


def register(bench_subparsers: Any) -> None:
    """Add `feedback-cost` to `reflective-memory bench`."""
    p = bench_subparsers.add_parser("feedback-cost", help=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=12, help="the user's sessions")
    p.add_argument("--rounds", type=int, default=400, help="retrieve + feedback rounds")
    p.add_argument("--pg", action="store_true", help="also on a local PostgreSQL cluster")
    p.set_defaults(func=run)
