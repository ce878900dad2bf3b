"""The `reflective-memory` command: demo, ingest, search, redenoise and benchmarks."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

from tqdm import tqdm

from reflective_memory.bench.datasets import Conversation, load_conversations
from reflective_memory.config import MemoryConfig
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ReflectiveMemoryError

__all__ = ["main", "build_parser", "ingest_conversations", "BENCH_MODULES"]

logger = logging.getLogger(__name__)

#: Modules that add `bench` sub-commands through a `register(bench_subparsers)` function.
BENCH_MODULES = [
    "reflective_memory.bench.retrieval",
    "reflective_memory.bench.conditional",
    "reflective_memory.bench.feedback",
    "reflective_memory.bench.segmentation",
    "reflective_memory.bench.latency",
]


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def ingest_conversations(
    mem: ReflectiveMemory,
    conversations: Sequence[Conversation],
    *,
    user: str | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Add every session of `conversations` to `mem` and end each session.

    Args:
        mem: Target memory.
        conversations: Loaded conversations.
        user: Store under this user id; with several conversations each goes to
            `<user>/<conversation user id>`.
        progress: Show a progress bar over sessions.

    Returns:
        Turns and sessions ingested per user id.
    """
    counts: dict[str, int] = {}
    todo = []
    for conv in conversations:
        if user is None:
            uid = conv.user_id
        elif len(conversations) == 1:
            uid = user
        else:
            uid = f"{user}/{conv.user_id}"
        todo += [(uid, s) for s in conv.sessions]
    for uid, session in tqdm(todo, desc="ingest sessions", unit="session", disable=not progress):
        if not session.turns:
            continue
        mem.add_turns(
            [{**t, "user_id": uid, "session_id": session.session_id} for t in session.turns]
        )
        mem.end_session(uid, session.session_id)
        counts[uid] = counts.get(uid, 0) + len(session.turns)
    return counts


def _demo(args: argparse.Namespace) -> int:
    src = resources.files("reflective_memory") / "data" / "demo_conversation.json"
    with resources.as_file(src) as path:
        convs = load_conversations(path)
    conv = convs[0]
    _out(
        f"reflective-memory demo: {len(conv.sessions)} sessions, {conv.n_turns} turns of "
        f"{conv.user_id!r}'s conversations with an assistant (offline, CPU)."
    )
    t0 = time.perf_counter()
    with ReflectiveMemory(args.db, config=MemoryConfig()) as mem:
        if args.db is not None and mem.stats(conv.user_id)["turns"]:
            mem.delete_user(conv.user_id)
        ingest_conversations(mem, [conv], progress=not args.quiet)
        stats = mem.stats(conv.user_id)
        _out(
            f"ingested in {time.perf_counter() - t0:.1f}s -> {stats['memories']} memories "
            f"{stats['memories_by_granularity']}"
        )
        found = 0
        for q in conv.questions[: args.questions]:
            r = mem.retrieve(conv.user_id, q.question, budget_tokens=args.budget)
            ms = r.diagnostics["timings_ms"]["total"]
            _out("")
            _out(f"Q: {q.question}   [{r.diagnostics['path']}, {ms:.1f} ms]")
            got = set()
            for h in r.hits:
                got.update(h.memory.turn_ids)
                first = h.memory.text.splitlines()
                head = first[0] if first else ""
                _out(
                    f"  #{h.rank} score={h.score:.4f} session={h.memory.session_id} "
                    f"turns={','.join(h.memory.turn_ids)}  {head}"
                )
                for line in first[1:4]:
                    _out(f"        {line[:110]}")
            hit = bool(set(q.evidence) & got)
            found += hit
            _out(f"  expected answer: {q.answer}")
            _out(f"  evidence turn retrieved: {'yes' if hit else 'no'} ({', '.join(q.evidence)})")
        n = min(len(conv.questions), args.questions)
        _out("")
        _out(
            f"{found}/{n} questions got an evidence turn in the passages packed into "
            f"{args.budget} tokens."
        )
    return 0


def _ingest(args: argparse.Namespace) -> int:
    convs = load_conversations(args.file, default_user=args.user)
    with ReflectiveMemory(args.db) as mem:
        counts = ingest_conversations(mem, convs, user=args.user, progress=not args.quiet)
        for uid, n in counts.items():
            _out(f"{uid}: {n} turns -> {mem.stats(uid)['memories']} memories")
    return 0


def _redenoise(args: argparse.Namespace) -> int:
    cfg = MemoryConfig(denoiser=args.denoiser, denoise_rate=args.rate, denoiser_model=args.model)
    with ReflectiveMemory(args.db, config=cfg) as mem:
        n = mem.redenoise(args.user, only_stale=args.only_stale)
    _out(f"{args.user}: re-keyed and re-embedded {n} memories with {args.denoiser}")
    return 0


def _search(args: argparse.Namespace) -> int:
    with ReflectiveMemory(args.db) as mem:
        r = mem.retrieve(args.user, args.query, k=args.k)
    if args.json:
        payload: dict[str, Any] = {
            "query": r.query,
            "user_id": r.user_id,
            "diagnostics": r.diagnostics,
            "hits": [
                {
                    "rank": h.rank,
                    "score": h.score,
                    "scores": h.scores,
                    "memory_id": h.memory.id,
                    "session_id": h.memory.session_id,
                    "granularity": h.memory.granularity,
                    "turn_ids": list(h.memory.turn_ids),
                    "text": h.memory.text,
                }
                for h in r.hits
            ],
        }
        _out(json.dumps(payload, indent=2, default=str))
        return 0
    if not r.hits:
        _out(f"no memories for user {args.user!r}")
    for h in r.hits:
        _out(
            f"#{h.rank} score={h.score:.4f} session={h.memory.session_id} "
            f"turns={','.join(h.memory.turn_ids)}"
        )
        _out("   " + h.memory.text.replace("\n", "\n   "))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `reflective-memory` command."""
    parser = argparse.ArgumentParser(
        prog="reflective-memory",
        description="Long-term conversational memory for LLM apps (offline, CPU).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="ingest a bundled conversation and answer questions from it")
    p.add_argument("--db", default=None, help="store directory (default: in memory)")
    p.add_argument(
        "--budget", type=int, default=300, help="tokens of passages retrieved per question"
    )
    p.add_argument("--questions", type=int, default=8, help="how many questions to ask")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "ingest",
        help="add a conversation file to a store",
        description="Formats: reflective-memory/v1 JSON (see reflective_memory.bench.datasets), LongMemEval, "
        "LoCoMo. Each session is ended after ingestion, so it becomes memories.",
    )
    p.add_argument("file", help="conversation file (.json or .json.gz)")
    p.add_argument("--user", required=True, help="user id to store under")
    p.add_argument("--db", required=True, help="store directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_ingest)

    p = sub.add_parser("search", help="retrieve a user's memories for a query")
    p.add_argument("query", help="query text")
    p.add_argument("--user", required=True, help="user id")
    p.add_argument("--db", required=True, help="store directory")
    p.add_argument("--k", type=int, default=5, help="number of hits")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_search)

    importlib.import_module("reflective_memory.bench.segmentation").register_segment_command(sub)

    p = sub.add_parser(
        "redenoise",
        help="re-key and re-embed a user's memories with another key denoiser",
        description="Rebuilds each turn/session/segment memory's key from its stored raw turns, "
        "denoises it (SeCom compression) and re-embeds it. Texts and ids do not change.",
    )
    p.add_argument("--user", required=True, help="user id")
    p.add_argument("--db", required=True, help="store directory")
    p.add_argument("--denoiser", default="offline", choices=["none", "offline", "llmlingua"])
    p.add_argument("--rate", type=float, default=0.75, help="fraction of each key kept")
    p.add_argument("--model", default=None, help="LLMLingua-2 model name or folder")
    p.add_argument("--only-stale", action="store_true", help="only keys made by another denoiser")
    p.set_defaults(func=_redenoise)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `reflective-memory` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except ReflectiveMemoryError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
