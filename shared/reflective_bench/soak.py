"""Reliability soak: threads, processes and SIGKILLs against one store, then an audit.

`reflective-memory bench soak --minutes N` runs, for the given time:

* a **thread soak**: `threads` threads of one `ReflectiveMemory` add turns, end sessions and
  retrieve for a few users at once;
* a **process soak**: `processes` worker processes do the same on the same directory;
* a **SIGKILL loop**: a worker ingesting, ending sessions and saving index caches is killed at
  random moments, `kills` times.

Every worker writes the id of each turn to an acknowledgement file right after `add_turn`
returned, and the id of each session right after `end_session` returned. The audit then
reopens the store and counts:

* `lost`: acknowledged turns missing from the store (must be 0);
* `stranded`: turns of sessions marked ended that no memory holds (must be 0), at the audit and
  in snapshots workers take right after each `end_session`;
* `incomplete`: ended sessions without their `session` memory (must be 0);
* `leaks`: retrieved hits that belonged to another user (must be 0);
* `errors`: unexpected exceptions in workers (must be 0);

with throughput and retrieve latency percentiles. `bench cache-rss --users N` fills N users and
retrieves for each through one process, reporting the resident memory and the bounded index
cache's size. The reliability tests run the same functions for a few seconds each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.embed import HashingEmbedder
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import SessionChangedError

__all__ = [
    "soak_config",
    "thread_soak",
    "process_soak",
    "kill_loop",
    "audit",
    "cache_rss",
    "register",
]

logger = logging.getLogger(__name__)

_WORDS = (
    "zebra violin harbor pepper orbit lantern cactus meadow copper falcon tundra quartz "
    "saffron glacier ember willow canyon marble nectar pixel"
).split()


def soak_config(**overrides: Any) -> MemoryConfig:
    """The configuration every soak worker uses (turn and session units, offline notes)."""
    base = MemoryConfig(
        units={"granularities": ("turn", "session")},
        conditional={"notes": True},
        denoise={"kind": "none"},
        rerank={"enabled": False},
    )
    return base.replace(**overrides)


def _open(directory: Path) -> ReflectiveMemory:
    return ReflectiveMemory(directory, embedder=HashingEmbedder(64), config=soak_config())


def _user_text(rng: random.Random, user: str) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(6))
    return f"I ({user}) noted {words} number {rng.randrange(10**6)}."


def _stranded_now(mem: ReflectiveMemory, user: str, session: str) -> int:
    """Turns of `session` missing from its memories while it is marked ended (one snapshot)."""
    store = mem.store
    with store._lock:  # one read transaction: status, turns and memories of the same moment
        store.conn.execute("BEGIN")
        try:
            info = store.session(user, session)
            if info is None or info.status != "ended":
                return 0
            tids = {t.turn_id for t in store.turns(user, session)}
            covered = {
                tid
                for m in store.memories(user)
                if m.session_id == session and m.granularity == "turn"
                for tid in m.turn_ids
            }
        finally:
            store.conn.execute("COMMIT")
    return len(tids - covered)


def _work(
    mem: ReflectiveMemory,
    ack: Any,
    ack_lock: threading.Lock,
    rng: random.Random,
    users: list[str],
    tag: str,
    deadline: float,
    stats: dict[str, Any],
) -> None:
    """One worker loop: add (acknowledged), sometimes end a session, sometimes retrieve."""
    n = 0
    while time.monotonic() < deadline:
        user = rng.choice(users)
        # Sessions are shared by all workers: turns arrive while others end the same session.
        session = f"s{rng.randrange(3)}"
        try:
            turn = mem.add_turn(user, session, "user", _user_text(rng, user))
            with ack_lock:
                ack.write(f"T\t{user}\t{session}\t{turn.turn_id}\n")
                ack.flush()
            stats["turns"] += 1
            n += 1
            if n % 5 == 0:
                try:
                    mem.end_session(user, session)
                except SessionChangedError:  # turns kept arriving: the session stays open
                    stats["ends_deferred"] += 1
                else:
                    with ack_lock:
                        ack.write(f"E\t{user}\t{session}\t{tag}\n")
                        ack.flush()
                    stats["ends"] += 1
                    stats["stranded_seen"] += _stranded_now(mem, user, session)
            if n % 3 == 0:
                t0 = time.perf_counter()
                r = mem.retrieve(user, rng.choice(_WORDS), k=5)
                stats["latency_ms"].append((time.perf_counter() - t0) * 1000)
                stats["leaks"] += sum(1 for h in r.hits if h.memory.user_id != user)
                stats["leaks"] += sum(1 for h in r.hits if f"({user})" not in h.memory.text)
        except Exception as exc:  # counted, never hidden
            logger.exception("soak worker error")
            stats["errors"] += 1
            stats.setdefault("error_kinds", []).append(type(exc).__name__)


def _new_stats() -> dict[str, Any]:
    return {
        "turns": 0,
        "ends": 0,
        "ends_deferred": 0,
        "stranded_seen": 0,
        "leaks": 0,
        "errors": 0,
        "latency_ms": [],
    }


def thread_soak(
    directory: Path, seconds: float, *, threads: int = 8, users: int = 4, seed: int = 0
) -> dict[str, Any]:
    """`threads` threads on one engine for `seconds`; returns the audited figures."""
    directory = Path(directory)
    stats = _new_stats()
    ack_path = directory.parent / f"{directory.name}.threads.ack"
    lock = threading.Lock()
    names = [f"user{u}" for u in range(users)]
    t0 = time.monotonic()
    with _open(directory) as mem, open(ack_path, "a") as ack:
        deadline = time.monotonic() + seconds
        workers = [
            threading.Thread(
                target=_work,
                args=(
                    mem,
                    ack,
                    lock,
                    random.Random(seed * 1000 + i),
                    names,
                    f"t{i}",
                    deadline,
                    stats,
                ),
            )
            for i in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        # Quiet phase: with the writers gone, every session left open must end cleanly (under
        # heavy load the fence may have deferred every end while turns kept arriving).
        for user in names:
            for session in mem.open_sessions(user):
                mem.end_session(user, session)
                stats["quiet_ends"] = stats.get("quiet_ends", 0) + 1
    elapsed = time.monotonic() - t0
    return _summary("threads", stats, audit(directory, [ack_path]), elapsed)


_ZYGOTE = """
import json, os, random, sys, threading, time
from pathlib import Path
from reflective_bench.soak import _new_stats, _open, _work
directory = sys.argv[1]
children = []
for line in sys.stdin:
    seed, tag, seconds, ack_path = line.split()
    pid = os.fork()
    if pid == 0:  # the child works for `seconds` or until it is killed
        code = 0
        try:
            stats = _new_stats()
            with _open(Path(directory)) as mem, open(ack_path, "a") as ack:
                _work(mem, ack, threading.Lock(), random.Random(int(seed)),
                      ["user0", "user1", "user2"], tag, time.monotonic() + float(seconds), stats)
            Path(ack_path + ".json").write_text(json.dumps(stats))
        except BaseException:
            code = 1
        os._exit(code)
    children.append(pid)
    sys.stdout.write(f"{pid}\\n")
    sys.stdout.flush()
    for c in list(children):
        if os.waitpid(c, os.WNOHANG)[0]:
            children.remove(c)
for c in children:
    os.waitpid(c, 0)
"""


class _Zygote:
    """A process that imports the library once and forks workers on request (cheap starts)."""

    def __init__(self, directory: Path) -> None:
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[1])  # shared/: this package and the library
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, str(directory)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def fork(self, seed: int, tag: str, seconds: float, ack: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{seed} {tag} {seconds} {ack}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self, timeout: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)


def process_soak(
    directory: Path, seconds: float, *, processes: int = 2, seed: int = 0
) -> dict[str, Any]:
    """`processes` worker processes on one directory for `seconds`; returns audited figures."""
    directory = Path(directory)
    _open(directory).close()  # create the store before the workers race to
    acks = [directory.parent / f"{directory.name}.proc{i}.ack" for i in range(processes)]
    zygote = _Zygote(directory)
    t0 = time.monotonic()
    for i in range(processes):
        zygote.fork(seed + i, f"p{i}", seconds, acks[i])
    zygote.close(timeout=seconds + 300)
    elapsed = time.monotonic() - t0
    stats = _new_stats()
    for ack in acks:
        report = Path(str(ack) + ".json")
        if not report.exists():
            stats["errors"] += 1  # the worker died
            continue
        got = json.loads(report.read_text())
        for key in ("turns", "ends", "ends_deferred", "stranded_seen", "leaks", "errors"):
            stats[key] += got[key]
        stats["latency_ms"] += got["latency_ms"]
        stats.setdefault("error_kinds", []).extend(got.get("error_kinds", []))
    out = _summary("processes", stats, audit(directory, acks), elapsed)
    out["error_kinds"] = sorted(set(stats.get("error_kinds", [])))
    return out


def kill_loop(directory: Path, kills: int, *, seed: int = 0) -> dict[str, Any]:
    """SIGKILL a working process at a random moment, `kills` times; audit the store.

    A zygote process imports the library once and forks one worker per round (so a round costs
    no interpreter start); the worker adds turns, ends sessions and retrieves (saving index
    caches) until the SIGKILL lands 0.05-1.5 s after its first acknowledged turn.
    """
    directory = Path(directory)
    _open(directory).close()
    rng = random.Random(seed)
    ack = directory.parent / f"{directory.name}.kill.ack"
    ack.touch()
    stats = _new_stats()
    zygote = _Zygote(directory)
    t0 = time.monotonic()
    done = 0
    try:
        for i in range(kills):
            before = ack.stat().st_size
            pid = zygote.fork(seed + i, f"k{i % 3}", 3600, ack)
            limit = time.monotonic() + 60
            while time.monotonic() < limit and ack.stat().st_size == before:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.05, 1.5))  # in ingest, end_session or a cache save
            try:
                os.kill(pid, signal.SIGKILL)
                done += 1
            except ProcessLookupError:
                stats["errors"] += 1
    finally:
        zygote.close(timeout=60)
    elapsed = time.monotonic() - t0
    out = _summary("sigkill", stats, audit(directory, [ack]), elapsed)
    out["kills"] = done
    return out


def _read_acks(paths: list[Path]) -> tuple[set[tuple[str, str, str]], set[tuple[str, str]]]:
    turns: set[tuple[str, str, str]] = set()
    ends: set[tuple[str, str]] = set()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if parts[0] == "T" and len(parts) == 4:
                turns.add((parts[1], parts[2], parts[3]))
            elif parts[0] == "E" and len(parts) >= 3:
                ends.add((parts[1], parts[2]))
    return turns, ends


def audit(directory: Path, ack_paths: list[Path]) -> dict[str, int]:
    """Reopen the store and check it against the acknowledgements (see the module doc)."""
    acked, ended_acks = _read_acks(ack_paths)  # a session ended may be reopened by later turns
    out = {
        "acknowledged": len(acked),
        "lost": 0,
        "stranded": 0,
        "incomplete": 0,
        "ended_sessions": 0,
        "acknowledged_ends": len(ended_acks),
    }
    with _open(Path(directory)) as mem:
        for user in mem.users():
            stored = {(user, t.session_id, t.turn_id) for t in mem.turns(user)}
            out["lost"] += len({a for a in acked if a[0] == user} - stored)
            mems = mem.memories(user)
            for info in mem.store.sessions(user):
                if info.status != "ended":
                    continue
                out["ended_sessions"] += 1
                own = [m for m in mems if m.session_id == info.session_id]
                covered = {tid for m in own if m.granularity == "turn" for tid in m.turn_ids}
                tids = {t.turn_id for t in mem.turns(user, info.session_id)}
                out["stranded"] += len(tids - covered)
                if not any(m.granularity == "session" for m in own):
                    out["incomplete"] += 1
        users = set(mem.users())
        out["lost"] += sum(1 for a in acked if a[0] not in users)
    return out


def _summary(kind: str, stats: dict[str, Any], checked: dict[str, int], elapsed: float) -> dict:
    lat = np.asarray(stats["latency_ms"] or [0.0])
    return {
        "kind": kind,
        "seconds": round(elapsed, 1),
        "turns": stats["turns"],
        "ends": stats["ends"],
        "ends_deferred": stats["ends_deferred"],
        "quiet_ends": stats.get("quiet_ends", 0),
        "retrieves": len(stats["latency_ms"]),
        "turns_per_s": round(stats["turns"] / max(elapsed, 1e-9), 1),
        "retrieve_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "retrieve_p95_ms": round(float(np.percentile(lat, 95)), 2),
        "leaks": stats["leaks"],
        "errors": stats["errors"],
        **checked,
        "stranded": checked["stranded"] + stats["stranded_seen"],
    }


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cache_rss(
    directory: Path, users: int, *, turns_per_user: int = 40, cache_mb: int = 64
) -> dict[str, Any]:
    """Serve `users` users' retrievals through one engine; report RSS and index-cache size.

    Fills the store first unless it already holds the users (so the serving can be measured in
    a fresh process). RSS is read after each of two passes over all users: with a bounded cache
    it stays flat however many users are served.
    """
    cfg = soak_config(
        conditional={"notes": False},
        units={"granularities": ("turn",)},
        index={"cache_bytes": cache_mb * 1024 * 1024},
    )
    rng = random.Random(0)
    rss_start = _rss_mb()
    with ReflectiveMemory(directory, embedder=HashingEmbedder(384), config=cfg) as mem:
        filled = False
        if len(mem.users()) < users:
            filled = True
            for first in range(0, users, 25):
                batch = range(first, min(first + 25, users))
                mem.add_turns(
                    [
                        {
                            "user_id": f"user{u}",
                            "session_id": "s",
                            "role": "user",
                            "text": _user_text(rng, f"user{u}"),
                        }
                        for u in batch
                        for _ in range(turns_per_user)
                    ]
                )
                for u in batch:
                    mem.end_session(f"user{u}", "s")
        rss_ready = _rss_mb()
        marks = []
        t0 = time.perf_counter()
        for _pass in range(2):
            for u in range(users):
                mem.retrieve(f"user{u}", rng.choice(_WORDS), k=5)
            marks.append(_rss_mb())
        per_query = (time.perf_counter() - t0) * 1000 / (2 * users)
        return {
            "users": users,
            "memories_per_user": turns_per_user,
            "filled_here": filled,
            "cache_limit_mb": cache_mb,
            "cached_users": len(mem.indexes),
            "cached_mb": round(mem.indexes.cached_bytes / 2**20, 1),
            "rss_start_mb": round(rss_start, 1),
            "rss_before_serving_mb": round(rss_ready, 1),
            "rss_after_pass1_mb": round(marks[0], 1),
            "rss_after_pass2_mb": round(marks[1], 1),
            "retrieve_mean_ms": round(per_query, 2),
        }


def _soak_cmd(args: argparse.Namespace) -> int:
    total = args.minutes * 60
    each = max(total / 3, 5.0)
    kills = max(args.kills, int(total / 3 / 1.5))
    with tempfile.TemporaryDirectory(prefix="rm-soak-") as tmp:
        results = [
            thread_soak(Path(tmp) / "threads", each, threads=args.threads),
            process_soak(Path(tmp) / "procs", each, processes=args.processes),
            kill_loop(Path(tmp) / "kill", kills),
        ]
    bad = 0
    for r in results:
        sys.stdout.write(json.dumps(r) + "\n")
        bad += r["lost"] + r["stranded"] + r["incomplete"] + r["leaks"] + r["errors"]
    sys.stdout.write(("OK" if bad == 0 else f"FAILED: {bad} problems") + "\n")
    return 0 if bad == 0 else 1


def _rss_cmd(args: argparse.Namespace) -> int:
    if args.db is not None:
        out = cache_rss(
            Path(args.db), args.users, turns_per_user=args.turns, cache_mb=args.cache_mb
        )
    else:
        with tempfile.TemporaryDirectory(prefix="rm-rss-") as tmp:
            out = cache_rss(
                Path(tmp) / "db", args.users, turns_per_user=args.turns, cache_mb=args.cache_mb
            )
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


def register(bench: Any) -> None:
    """Add `bench soak` and `bench cache-rss` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "soak",
        help="threads, processes and SIGKILLs against one store, then an audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minutes", type=float, default=1.0, help="total running time")
    p.add_argument("--threads", type=int, default=8, help="threads of the thread soak")
    p.add_argument("--processes", type=int, default=2, help="processes of the process soak")
    p.add_argument("--kills", type=int, default=20, help="fewest SIGKILLs")
    p.set_defaults(func=_soak_cmd)
    p = bench.add_parser("cache-rss", help="resident memory of one process serving many users")
    p.add_argument("--users", type=int, default=2000, help="users to fill and serve")
    p.add_argument("--turns", type=int, default=40, help="memories per user")
    p.add_argument("--cache-mb", type=int, default=64, help="index cache bound in MiB")
    p.add_argument("--db", default=None, help="store directory (kept; filled when short)")
    p.set_defaults(func=_rss_cmd)
