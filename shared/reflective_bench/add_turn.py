"""`bench add-turn`: `add_turn` latency on a user with a long history, next to one embedding.

For each history size N, a SQLite store is filled with N turns of one user (sessions of 50 turns,
each ended, vectors from a fast random embedder; only their count matters here), kept under
`--dir` for the next run. Then, interleaved so both see the same load, one fresh text is embedded
alone by MiniLM (a `str`, no cache: the single-text reference) and another is stored with
`add_turn` on the MiniLM memory, `--calls` times; the report gives both p50 / p95 and the ratio of
the p50s. `--profile` adds a cProfile of the `add_turn` calls.

    reflective-memory bench add-turn --history 10000 100000 --dir /tmp/rm-history
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import logging
import pstats
import time
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.errors import InvalidInputError

__all__ = ["RandomEmbedder", "build_history", "time_add_turn", "register"]

logger = logging.getLogger(__name__)

_WORDS = (
    "sister moved Paris coffee running book movie dog beach job city garden piano trip "
    "dinner friend wedding class recipe weekend"
).split()


class RandomEmbedder:
    """Random unit vectors (seeded by the text), named like MiniLM; fills a history fast.

    Args:
        name: The embedder name to store the vectors under.
        dim: Vector size.
    """

    def __init__(self, name: str, dim: int = 384) -> None:
        self.name = name
        self._dim = dim

    @property
    def dim(self) -> int:
        """Vector size."""
        return self._dim

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """One seeded random unit vector per text."""
        items = [texts] if isinstance(texts, str) else list(texts)
        out = np.zeros((len(items), self._dim), np.float32)
        for i, t in enumerate(items):
            seed = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
            out[i] = np.random.default_rng(seed).standard_normal(self._dim)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out[0] if isinstance(texts, str) else out


def _text(rng: np.random.Generator, i: int) -> str:
    return " ".join(rng.choice(_WORDS, 12)) + f" ({i})"


def build_history(path: Path, n: int, name: str, user: str = "u") -> None:
    """Fill the store at `path` with `n` turns of `user` (sessions of 50, each ended)."""
    from reflective_memory.engine import ReflectiveMemory

    rng = np.random.default_rng(n)
    with ReflectiveMemory(path, embedder=RandomEmbedder(name)) as mem:
        have = mem.stats(user)["turns"] if user in mem.users() else 0
        for s in range(have // 50, n // 50):
            mem.add_turns(
                [
                    {
                        "user_id": user,
                        "session_id": f"h{s}",
                        "role": "user" if j % 2 == 0 else "assistant",
                        "text": _text(rng, 50 * s + j),
                    }
                    for j in range(50)
                ]
            )
            mem.end_session(user, f"h{s}")


def time_add_turn(
    path: Path, embedder: Any, reference: Any, calls: int, profile: bool, user: str = "u"
) -> dict[str, Any]:
    """Interleave single-text embeddings and `add_turn` calls; return their p50 / p95 in ms."""
    from reflective_memory.engine import ReflectiveMemory

    add, one = [], []
    prof = cProfile.Profile() if profile else None
    with ReflectiveMemory(path, embedder=embedder) as mem:
        history = mem.stats(user)["turns"]
        rng = np.random.default_rng(history + 7)  # texts no earlier run embedded
        for i in range(calls + 5):  # the first five warm up
            t0 = time.perf_counter()
            reference.encode(_text(rng, -i))
            t1 = time.perf_counter()
            if prof is not None and i >= 5:
                prof.enable()
            mem.add_turn(user, "bench-add-turn", "user", _text(rng, 10**9 + i))
            t2 = time.perf_counter()
            if prof is not None:
                prof.disable()
            if i >= 5:
                one.append(1000 * (t1 - t0))
                add.append(1000 * (t2 - t1))
        mem.delete_session(user, "bench-add-turn")
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(20)
    return {
        "history_turns": history,
        "add_turn_ms": {"p50": float(np.median(add)), "p95": float(np.percentile(add, 95))},
        "single_embed_ms": {"p50": float(np.median(one)), "p95": float(np.percentile(one, 95))},
        "ratio_p50": float(np.median(add) / np.median(one)),
    }


def _run(args: argparse.Namespace) -> int:
    from reflective_memory.embed import SentenceTransformerEmbedder

    if min(args.history) < 50 or args.calls < 1:
        raise InvalidInputError("--history needs at least 50 turns and --calls at least 1")
    reference = SentenceTransformerEmbedder(cache_size=0)
    reference.encode("warm up the model")
    for n in args.history:
        path = Path(args.dir) / f"history-{n}"
        t0 = time.perf_counter()
        build_history(path, n, reference.name)
        logger.info("history of %d turns ready in %.0f s", n, time.perf_counter() - t0)
        embedder = SentenceTransformerEmbedder()  # its own cache of recent texts: none seen
        r = time_add_turn(path, embedder, reference, args.calls, args.profile)
        a, e = r["add_turn_ms"], r["single_embed_ms"]
        print(  # noqa: T201
            f"{r['history_turns']} turns of history: add_turn p50 {a['p50']:.1f} ms, "
            f"p95 {a['p95']:.1f} ms; one text embedded p50 {e['p50']:.1f} ms, "
            f"p95 {e['p95']:.1f} ms; add_turn p50 / embedding p50 = {r['ratio_p50']:.2f}"
        )
    return 0


def register(bench: Any) -> None:
    """Add `bench add-turn` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "add-turn",
        help="add_turn latency at N turns of history next to one MiniLM embedding",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--history", type=int, nargs="+", default=[10000, 100000], help="turns (>= 50 each)"
    )
    p.add_argument("--dir", required=True, help="where the history stores are built and kept")
    p.add_argument("--calls", type=int, default=50, help="timed add_turn calls (>= 1)")
    p.add_argument("--profile", action="store_true", help="print a cProfile of add_turn")
    p.set_defaults(func=_run)
