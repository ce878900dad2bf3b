"""`bench portable`: export / import (and migrate) rate and peak memory on generated stores.

For each size, builds an embedded store of synthetic conversations (the hashing embedder at
384 dimensions: the rates measured are those of export and import, which reuse the stored
vectors), then runs `reflective-memory export`, `import` and, with `--dsn`, `migrate` each in a
fresh process, and reports wall time, turns per second, the file size and the process's peak
RSS (`wait4`). Constant memory shows as a peak RSS that does not grow with the store.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["register", "build_store", "run_child"]


def build_store(path: Path, users: int, sessions: int, turns: int) -> int:
    """An embedded store of `users` x `sessions` ended sessions of `turns` turns; return turns."""
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

    cfg = MemoryConfig(sessions={"idle_seconds": None}, rerank={"enabled": False})
    words = "moved city sister dog job trip book cooking garden piano tennis coffee".split()
    with ReflectiveMemory(path, embedder=HashingEmbedder(384), config=cfg) as mem:
        for u in range(users):
            for s in range(sessions):
                mem.add_turns(
                    {
                        "user_id": f"user-{u:04d}",
                        "session_id": f"s{s}",
                        "role": "user" if i % 2 == 0 else "assistant",
                        "text": f"Turn {i} of session {s}: about my {words[(u + s + i) % 12]} "
                        f"and the {words[(u * 7 + i) % 12]}, which I mention for the {i}th time.",
                        "timestamp": 1_700_000_000 + 86_400 * s + 60 * i,
                    }
                    for i in range(turns)
                )
                mem.end_session(f"user-{u:04d}", f"s{s}")
    return users * sessions * turns


_CHILD = """
import runpy, sys
try:
    sys.argv = ["reflective-memory", *{argv!r}]
    runpy.run_module("reflective_memory.cli", run_name="__main__")
finally:  # this process's own peak (VmHWM starts again at exec; ru_maxrss does not)
    with open("/proc/self/status") as fh, open({peak!r}, "w") as out:
        out.write(next(ln for ln in fh if ln.startswith("VmHWM")).split()[1])
"""


def run_child(argv: list[str]) -> tuple[float, int, str]:
    """Run `reflective-memory <argv>` in a fresh process: (seconds, peak RSS in MiB, stdout)."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        code = _CHILD.format(argv=list(argv), peak=str(peak))
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
        return seconds, int(peak.read_text()) // 1024, done.stdout


def _build_in_child(path: Path, users: int, sessions: int, turns: int) -> int:
    """`build_store` in another process (this one then stays small and quick to fork)."""
    code = (
        "import sys; from reflective_bench.portable import build_store; "
        f"build_store(__import__('pathlib').Path({str(path)!r}), {users}, {sessions}, {turns})"
    )
    shared = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([shared, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return users * sessions * turns


def _run(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    sizes = [int(x) for x in args.users.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for users in sizes:
            src, dst = Path(tmp) / f"src-{users}", Path(tmp) / f"dst-{users}"
            t0 = time.perf_counter()
            n = _build_in_child(src, users, args.sessions, args.turns)
            built = time.perf_counter() - t0
            file = Path(tmp) / f"export-{users}.jsonl"
            ex_s, ex_rss, _ = run_child(["export", "--db", str(src), "-o", str(file)])
            im_s, im_rss, _ = run_child(["import", "--db", str(dst), str(file)])
            row = {
                "users": users,
                "turns": n,
                "build_s": round(built, 1),
                "file_mb": round(file.stat().st_size / 2**20, 1),
                "export_s": round(ex_s, 2),
                "export_turns_per_s": round(n / ex_s),
                "export_peak_rss_mb": ex_rss,
                "import_s": round(im_s, 2),
                "import_turns_per_s": round(n / im_s),
                "import_peak_rss_mb": im_rss,
            }
            if args.dsn is not None:
                schema = f"bench_{users}_{os.getpid()}"
                argv = ["migrate", "--from", str(src), "--to", args.dsn, "--schema", schema]
                mi_s, mi_rss, _ = run_child(argv)
                row.update(
                    migrate_s=round(mi_s, 2),
                    migrate_turns_per_s=round(n / mi_s),
                    migrate_peak_rss_mb=mi_rss,
                )
            rows.append(row)
            sys.stdout.write(json.dumps(row) + "\n")
    if args.json is not None:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def register(bench: Any) -> None:
    """Add `bench portable` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "portable",
        help="export / import / migrate rate and peak RSS on generated stores",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--users", default="10,40", help="store sizes in users, comma-separated")
    p.add_argument("--sessions", type=int, default=10, help="sessions per user")
    p.add_argument("--turns", type=int, default=10, help="turns per session")
    p.add_argument("--dsn", default=None, help="also time `migrate` onto this PostgreSQL")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.set_defaults(func=_run)
