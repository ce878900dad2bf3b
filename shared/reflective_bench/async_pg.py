"""`reflective-memory bench async`: native async `aretrieve` on PostgreSQL next to thread twins.

`--users` users (default 64) each get `--turns` synthetic turns (default 40, sessions of 10
turns, ended, so turn and session memories are indexed) in a fresh schema `bench_async`. Then,
in one event loop, batches of `--concurrency` (default 64) retrievals, one per user
(`k=10`, the default hybrid pipeline with the reranker), are started at once, in two modes
that alternate batch by batch so a noisy machine loads them alike:

- `native`: `await mem.aretrieve(...)`: the queries awaited on psycopg's `AsyncConnectionPool`
  (no thread for I/O; the query embeddings batched in the model thread, `embed.QueryBatcher`;
  the pipeline on the loop between them);
- `threads`: `await asyncio.to_thread(mem.retrieve, ...)`: the sync call in the default
  executor's worker threads, on the sync pool (what every `a*` method did before).

Both pools have `--pool-max` connections. Reported per mode: calls per second (calls / wall
time of its batches), p50 / p95 of a call's latency from its batch's start, and how long the
loop was kept busy (`loop_lag`: how late a 1 ms sleep running beside the batch woke up, p95 and
max); plus whether both modes returned the same hits. `--embedder hashing` replaces the
bundled MiniLM by `HashingEmbedder(384)` to show the database part alone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import numpy as np

from reflective_bench.report import bench_parser, finish, run_context
from reflective_bench.storage import _fresh_pg as fresh_pg
from reflective_bench.storage import load_users, synthetic_texts

__all__ = ["register", "run_async_bench"]

logger = logging.getLogger(__name__)

#: What `bench --help` says of this benchmark.
_SUMMARY = "64 concurrent aretrieve on PostgreSQL: native async vs thread twins"

_SCHEMA = "bench_async"
_MODES = ("native", "threads")


def _memory(args: argparse.Namespace) -> Any:
    from reflective_memory import HashingEmbedder, ReflectiveMemory

    store = fresh_pg(args.dsn, _SCHEMA, pool_max=args.pool_max)
    embedder = HashingEmbedder(384) if args.embedder == "hashing" else None
    return ReflectiveMemory(store=store, embedder=embedder)


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    """Record how late a 1 ms sleep wakes up: how long the loop was kept busy (ms)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t) * 1000 - 1.0)


async def _batch(
    mem: Any, mode: str, jobs: list[tuple[str, str]], k: int, lags: list[float] | None = None
) -> tuple[float, list]:
    """Start every job at once; return the wall time and (latency, hit ids) per job."""
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe([] if lags is None else lags, stop))
    t0 = time.perf_counter()

    async def one(user: str, query: str) -> tuple[float, list[str]]:
        if mode == "native":
            got = await mem.aretrieve(user, query, k=k)
        else:
            got = await asyncio.to_thread(mem.retrieve, user, query, k=k)
        return time.perf_counter() - t0, [h.memory.id for h in got.hits]

    out = await asyncio.gather(*(one(u, q) for u, q in jobs))
    wall = time.perf_counter() - t0
    stop.set()
    await probe
    return wall, out


async def _measure(mem: Any, args: argparse.Namespace) -> dict[str, Any]:
    queries = synthetic_texts(args.rounds * args.concurrency, seed=11, words=6)
    users = [f"u{i % args.users}" for i in range(args.concurrency)]
    wall = dict.fromkeys(_MODES, 0.0)
    lat: dict[str, list[float]] = {m: [] for m in _MODES}
    lags: dict[str, list[float]] = {m: [] for m in _MODES}
    same = True

    def jobs(r: int) -> list[tuple[str, str]]:
        n = args.concurrency
        return list(zip(users, queries[r * n : (r + 1) * n], strict=True))

    for mode in _MODES:  # warm-up: index snapshots, reranker state, the loop's pool
        await _batch(mem, mode, jobs(0), args.k)
    for r in range(args.rounds):
        hits = {}
        order = _MODES if r % 2 == 0 else _MODES[::-1]
        for mode in order:
            secs, out = await _batch(mem, mode, jobs(r), args.k, lags[mode])
            wall[mode] += secs
            lat[mode] += [t * 1000 for t, _ in out]
            hits[mode] = [ids for _, ids in out]
        same = same and hits["native"] == hits["threads"]
    calls = args.rounds * args.concurrency
    res: dict[str, Any] = {}
    for mode in _MODES:
        a = np.asarray(lat[mode])
        res[mode] = {
            "calls_per_s": round(calls / wall[mode], 1),
            "p50_ms": round(float(np.percentile(a, 50)), 1),
            "p95_ms": round(float(np.percentile(a, 95)), 1),
            "calls": calls,
            "loop_lag_p95_ms": round(float(np.percentile(lags[mode], 95)), 1),
            "loop_lag_max_ms": round(max(lags[mode]), 1),
        }
    res["native_over_threads"] = round(
        res["native"]["calls_per_s"] / res["threads"]["calls_per_s"], 2
    )
    res["same_hits"] = same
    return res


def run_async_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Load the users, run the batches; return the results (also written to `--out`)."""
    from reflective_memory.errors import InvalidInputError
    from reflective_memory.storage.postgres import is_postgres_dsn

    if not is_postgres_dsn(args.dsn):
        raise InvalidInputError("--dsn must be a postgresql://... URI")
    res: dict[str, Any] = {
        **run_context(),
        "embedder": args.embedder,
        "users": args.users,
        "turns_per_user": args.turns,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "pool_max": args.pool_max,
        "k": args.k,
    }
    mem = _memory(args)
    try:
        res["load_s"] = round(load_users(mem, args.users, args.turns), 1)

        async def main() -> dict[str, Any]:
            try:
                return await _measure(mem, args)
            finally:
                await mem.aclose()

        res.update(asyncio.run(main()))
    finally:
        mem.close()
    return finish(res, args.out, "async")


def register(bench: Any) -> None:
    """Add `bench async` to the CLI's bench sub-parsers."""
    p = bench_parser(bench, "async", _SUMMARY, __doc__, run_async_bench)
    p.add_argument("--dsn", required=True, help="postgresql://... of a server with pgvector")
    p.add_argument("--users", type=int, default=64, help="users loaded")
    p.add_argument("--turns", type=int, default=40, help="turns per user")
    p.add_argument("--concurrency", type=int, default=64, help="retrievals started at once")
    p.add_argument("--rounds", type=int, default=10, help="timed batches per mode")
    p.add_argument("--pool-max", type=int, default=10, help="connections of each pool")
    p.add_argument("--k", type=int, default=10, help="hits per retrieval")
    p.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
