"""`reflective-memory bench chat`: the latency a chat feels, with a history behind it.

A chat app stores each message as it comes (`add_turn`) and asks memory before its next
answer (`retrieve()`, the adapters' default call). So nearly every question meets a store
that changed a moment ago. This bench fills one user's history with real turns of a dev file
(its sessions repeated under new session ids up to each size, each ended), then times, per
question of the file:

* `retrieve()` on an unchanged store (steady state),
* `add_turn` of a real turn into an open session, then `retrieve()` (after a write),
* the same two steps on a plain turn-level dense top-5 memory (`retrieve(k=5)`), as reference.

Stored turns' vectors come from the bench's embedding cache; queries are embedded for real.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from reflective_memory import MemoryConfig, ReflectiveMemory
from reflective_memory.embed import Embedder
from reflective_memory.io import load_conversations
from tqdm import tqdm

from reflective_bench.retrieval import add_embedder_arguments, make_embedder, pg_stores

__all__ = ["run_chat_bench", "format_chat_table", "register"]

logger = logging.getLogger(__name__)

_QUIET = {"sessions": {"idle_seconds": None, "max_turns": None}}
_PLAIN = {
    **_QUIET,
    "units": {"granularities": ("turn",), "speaker_keys": False},
    "passages": {"enabled": False},
    "rerank": {"enabled": False},
    "denoise": {"kind": "none"},
}


def _fill(mem: ReflectiveMemory, turns: list[dict[str, Any]], size: int, per: int) -> None:
    """Store `size` turns (cycling `turns`) in ended sessions of `per` turns."""
    rows = list(itertools.islice(itertools.cycle(turns), size))
    for s in range(0, size, per):
        sid = f"h{s // per}"
        mem.add_turns([{**t, "user_id": "u", "session_id": sid} for t in rows[s : s + per]])
        mem.end_session("u", sid)


def _ms(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)) * 1000, float(np.percentile(values, 95)) * 1000


def run_chat_bench(
    data: str,
    sizes: Sequence[int],
    embedder: Embedder,
    *,
    questions: int = 100,
    progress: bool = True,
    dsn: str | None = None,
) -> list[dict[str, Any]]:
    """Time steady and after-write retrievals at each history size (see the module doc).

    Args:
        data: A conversation file (turns and questions).
        sizes: History sizes in turns.
        embedder: Embedder of every memory (cached vectors for stored texts).
        questions: Questions timed per size (cycled when the file has fewer).
        progress: Show progress bars.
        dsn: Run on this PostgreSQL server (a fresh schema per memory, dropped after) instead
            of an embedded store in a temporary directory.

    Returns:
        One row per (size, system) with p50/p95 ms of each step.
    """
    convs = load_conversations(data)
    turns = [
        {"role": t["role"], "text": t["text"]} for c in convs for s in c.sessions for t in s.turns
    ]
    asked = [q.question for c in convs for q in c.questions]
    asked = list(itertools.islice(itertools.cycle(asked), questions))
    incoming = itertools.cycle(turns)
    embedder.encode([t["text"] for t in turns])  # fill the cache before anything is timed
    rows = []
    for size in sizes:
        for name, overrides, kw in (
            ("default · retrieve()", _QUIET, {}),
            ("plain turn dense top-5", _PLAIN, {"k": 5, "mode": "dense"}),
        ):
            with tempfile.TemporaryDirectory() as tmp:
                store, drop = pg_stores(dsn)() if dsn else (None, None)
                config = MemoryConfig(**overrides)
                where = None if store is not None else tmp
                try:
                    mem = ReflectiveMemory(where, store=store, embedder=embedder, config=config)
                    with mem:
                        _fill(mem, turns, size, per=20)
                        mem.retrieve("u", "warm up", **kw)
                        steady, add, after = [], [], []
                        for q in tqdm(asked, desc=f"chat {size} {name}", disable=not progress):
                            t0 = time.perf_counter()
                            mem.retrieve("u", q, **kw)
                            t1 = time.perf_counter()
                            turn = next(incoming)
                            mem.add_turn("u", "live", turn["role"], turn["text"])
                            t2 = time.perf_counter()
                            mem.retrieve("u", q, **kw)
                            t3 = time.perf_counter()
                            steady.append(t1 - t0)
                            add.append(t2 - t1)
                            after.append(t3 - t2)
                finally:
                    if drop is not None:
                        drop()
            rows.append(
                {
                    "size": size,
                    "system": name,
                    "steady": _ms(steady),
                    "add_turn": _ms(add),
                    "after_write": _ms(after),
                }
            )
    return rows


def format_chat_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of `run_chat_bench` rows."""
    out = [
        "| history turns | system | retrieve p50 / p95 ms | add_turn p50 / p95 ms "
        "| retrieve after add_turn p50 / p95 ms | after / steady p50 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, a, w = r["steady"], r["add_turn"], r["after_write"]
        out.append(
            f"| {r['size']:,} | {r['system']} | {s[0]:.1f} / {s[1]:.1f} | {a[0]:.1f} / {a[1]:.1f} "
            f"| {w[0]:.1f} / {w[1]:.1f} | {w[0] / max(s[0], 1e-9):.2f}× |"
        )
    return "\n".join(out)


def _run(args: argparse.Namespace) -> int:
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    embedder = make_embedder(args.embedder, args.cache)
    rows = run_chat_bench(args.data, sizes, embedder, questions=args.questions, dsn=args.dsn)
    print(format_chat_table(rows))  # noqa: T201 - the bench's output
    return 0


def register(bench: Any) -> None:
    """Add `bench chat` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "chat",
        help="retrieve latency right after add_turn, the rhythm of a chat, by history size",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="conversation file (.json or .json.gz)")
    p.add_argument("--sizes", default="1000,10000", help="comma list of history sizes (turns)")
    p.add_argument("--questions", type=int, default=100, help="timed questions per size")
    p.add_argument("--dsn", default=None, help="run on this PostgreSQL server (fresh schemas)")
    add_embedder_arguments(p)
    p.set_defaults(func=_run)
