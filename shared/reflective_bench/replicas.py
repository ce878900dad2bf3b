"""`reflective-memory bench replicas`: reads on PostgreSQL hot standbys, and failover.

Starts servers of its own with the local PostgreSQL + pgvector binaries
(`reflective_bench.pg_local`; `.ci/install-postgres.sh` installs them): a primary and two hot
standbys (`pg_basebackup -R`, asynchronous streaming replication), then, for the failover
part, fresh primaries with one standby each. Three parts:

- `throughput`: `--users` users get `--turns` synthetic turns each (sessions of 10, ended);
  `--clients` threads then call `retrieve` (`k=10`, the default pipeline) on random users for
  `--seconds`, with the store reading from 0, 1 and 2 replicas (`PostgresStore(read_dsn=...)`),
  in alternating order over `--rounds` rounds. Reported: calls per second, p50 / p95 latency,
  and the share of reads each kind of server answered. Every server runs on this machine: on
  a small box they share its cores with the clients, so the ratio to the primary alone is
  what to read, not a promise for separate machines.
- `ryw`: `--pairs` write-then-read pairs on one replica, from `--writers` threads (one user
  each): `add_turn` of a sentence (made-up words) holding a code said nowhere else, then
  `retrieve(code, mode="lexical")`: found exactly when the read saw the write (the default
  pipeline's ranking of look-alike synthetic turns is not what this measures). Reported:
  misses (a question that did not find its turn), the time a pair's reads waited for the
  replica to replay its write (p50 / p95 / max, every read of the pair: `add_turn`'s own
  reads come first and usually do the waiting), the reads each kind of server answered,
  and the pairs that read from the primary because the replica had not caught up within
  `read_wait`; then the same pairs on the primary alone (a miss there would be ranking, not
  replication).
- `failover`: for each `--replication` mode (`sync`: the standby is synchronous,
  `synchronous_standby_names = '*'`; `async`), `--failovers` rounds of: 3 threads write turns
  through a multi-host URI (`target_session_attrs=read-write`) for `--load-seconds`, the
  primary is SIGKILLed (with every process it started) and its standby promoted
  (`pg_ctl promote`), a new standby is made from the new primary, and writing goes on in the
  same process. A write that fails (typed `StoreUnavailableError`) is retried with its
  `turn_id` until it lands. At the end every acknowledged turn is looked up on the last
  primary: reported are the acknowledged turns, the ones lost, the failed attempts, and the
  time from each kill to the first acknowledgement of a write started after the old primary
  was dead (promotion included).

`--embedder hashing` (the default) keeps the model out of the measurement (`HashingEmbedder`,
384 dims); `minilm` runs the bundled model.
"""

from __future__ import annotations

import argparse
import logging
import random
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from reflective_bench.pg_local import Cluster, free_port, missing_reason
from reflective_bench.report import bench_parser, finish, run_context
from reflective_bench.storage import load_users, synthetic_texts

__all__ = ["register", "run_replicas_bench"]

logger = logging.getLogger(__name__)

#: What `bench --help` says of this benchmark.
_SUMMARY = "PostgreSQL read replicas: throughput, read-your-writes, failover (own servers)"

_DB = "bench_replicas"
_SCHEMA = "bench_replicas"


def _embedder(kind: str) -> Any:
    from reflective_memory import HashingEmbedder
    from reflective_memory.embed import default_embedder

    return HashingEmbedder(384) if kind == "hashing" else default_embedder()


def _memory(dsn: str, replicas: list[str], embedder: Any, **store: Any) -> Any:
    from reflective_memory import ReflectiveMemory
    from reflective_memory.storage.postgres import PostgresStore

    pg = PostgresStore(dsn, read_dsn=replicas or None, schema=_SCHEMA, **store)
    return ReflectiveMemory(store=pg, embedder=embedder)


def _ms(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64) if values else np.zeros(1)
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p95_ms": round(float(np.percentile(a, 95)), 2),
        "max_ms": round(float(a.max()), 2),
    }


# -- throughput -------------------------------------------------------------------------------
def _clients(mem: Any, args: argparse.Namespace, seconds: float, seed: int) -> dict[str, Any]:
    """`args.clients` threads retrieving for `seconds`: calls, latencies, servers."""
    queries = synthetic_texts(2000, seed=seed, words=6)
    lat: list[float] = []
    servers: Counter[str] = Counter()
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(c: int) -> None:
        rng = random.Random(seed * 100 + c)
        mine, roles = [], Counter()
        while time.perf_counter() < stop:
            t = time.perf_counter()
            got = mem.retrieve(f"u{rng.randrange(args.users)}", rng.choice(queries), k=10)
            mine.append((time.perf_counter() - t) * 1000)
            for name, n in got.diagnostics.get("reads", {}).get("servers", {}).items():
                roles[name.split(" ", 1)[0]] += n
        with lock:
            lat.extend(mine)
            servers.update(roles)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"calls": len(lat), "seconds": time.perf_counter() - t0, "lat": lat, "servers": servers}


def _throughput(
    dsn: str, reads: list[str], embedder: Any, args: argparse.Namespace
) -> dict[str, Any]:
    pool = args.clients + 2
    mems = {n: _memory(dsn, reads[:n], embedder, pool_max=pool) for n in range(len(reads) + 1)}
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in mems}
    try:
        for mem in mems.values():  # warm-up: snapshots, reranker state, pools
            _clients(mem, args, 1.0, seed=1)
        for r in range(args.rounds):
            order = list(mems) if r % 2 == 0 else list(mems)[::-1]
            for n in order:
                runs[n].append(_clients(mems[n], args, args.seconds, seed=10 + r))
    finally:
        for mem in mems.values():
            mem.close()
    out: dict[str, Any] = {}
    for n, got in runs.items():
        calls = sum(g["calls"] for g in got)
        secs = sum(g["seconds"] for g in got)
        servers: Counter[str] = sum((g["servers"] for g in got), Counter())
        total = sum(servers.values()) or 1
        out[f"{n}_replicas"] = {
            "calls_per_s": round(calls / secs, 1),
            **_ms([x for g in got for x in g["lat"]]),
            "calls": calls,
            "reads_by": {k: round(v / total, 3) for k, v in servers.items()},
        }
    base = out["0_replicas"]["calls_per_s"]
    for n in list(mems)[1:]:
        out[f"{n}_replicas"]["ratio_to_primary_alone"] = round(
            out[f"{n}_replicas"]["calls_per_s"] / base, 2
        )
    return out


# -- read-your-writes ---------------------------------------------------------------------------
def _pairs(dsn: str, reads: list[str], embedder: Any, args: argparse.Namespace) -> dict:
    """`args.pairs` write-then-read pairs from `args.writers` threads (one user each)."""
    from reflective_memory.storage.reads import reads_of_call

    mem = _memory(dsn, reads, embedder, pool_max=2 * args.writers + 2)
    per = args.pairs // args.writers
    bodies = synthetic_texts(per * args.writers, seed=23, words=10)
    waits: list[float] = []
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def writer(w: int) -> None:
        user = f"ryw{w}-{len(reads)}"
        for i in range(per):
            word = f"zq{w}x{i}v"
            with reads_of_call() as log:  # every read of the pair, add_turn's included
                mem.add_turn(user, "s1", "user", f"{bodies[w * per + i]}. The code is {word}.")
                got = mem.retrieve(user, word, k=5, mode="lexical")
            found = any(word in h.memory.text for h in got.hits)
            with lock:
                counts["misses"] += not found
                waits.append(log.waited_ms)
                counts["pairs_read_from_primary_after_waiting"] += any(
                    "had not replayed" in n for n in log.notes
                )
                for name, n in log.servers.items():
                    counts[f"reads_{name.split(' ', 1)[0]}"] += n

    t0 = time.perf_counter()
    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        mem.close()
    return {
        "pairs": per * args.writers,
        **counts,
        "wait_per_pair": _ms(waits),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _ryw(dsn: str, replica: str, embedder: Any, args: argparse.Namespace) -> dict:
    """The pairs on a replica, and the same on the primary alone (a miss there is ranking)."""
    from reflective_memory.storage.pg_replicas import READ_WAIT_S

    return {
        "writers": args.writers,
        "read_wait_s": READ_WAIT_S,
        "on_replica": _pairs(dsn, [replica], embedder, args),
        "primary_alone": _pairs(dsn, [], embedder, args),
    }


# -- failover -----------------------------------------------------------------------------------
class _Writers:
    """Threads writing turns with their own ids, retrying each until it is acknowledged."""

    def __init__(self, mem: Any, n: int) -> None:
        self.mem = mem
        #: (when the attempt that landed started, when it was acknowledged, turn id)
        self.acked: list[tuple[float, float, str]] = []
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._write, args=(w,)) for w in range(n)]

    def _write(self, w: int) -> None:
        from reflective_memory import StoreUnavailableError

        i = 0
        while not self._stop.is_set():
            turn_id = f"w{w}-{i}"
            while True:
                started = time.perf_counter()
                try:
                    self.mem.add_turn("ana", f"s{w}", "user", f"fact {turn_id}", turn_id=turn_id)
                    break
                except StoreUnavailableError:
                    with self._lock:
                        self.errors["StoreUnavailableError"] += 1
                    time.sleep(0.05)
            with self._lock:
                self.acked.append((started, time.perf_counter(), turn_id))
            i += 1

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def _failover(mode: str, embedder: Any, args: argparse.Namespace) -> dict[str, Any]:
    from reflective_memory import ReflectiveMemory
    from reflective_memory.storage.postgres import PostgresStore

    ports = [free_port() for _ in range(args.failovers + 2)]
    sync = mode == "sync"
    primary = Cluster(port=ports[0]).start()
    clusters = [primary]
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    dsn = f"postgresql://postgres@{hosts}/{_DB}?target_session_attrs=read-write&connect_timeout=2"
    downtime: list[float] = []
    try:
        primary.create_database(_DB)
        standby = primary.standby(sync=sync, port=ports[1])
        clusters.append(standby)
        store = PostgresStore(dsn, schema=_SCHEMA, pool_max=6, timeout=10)
        mem = ReflectiveMemory(store=store, embedder=embedder)
        writers = _Writers(mem, 3)
        writers.start()
        try:
            for r in range(args.failovers):
                time.sleep(args.load_seconds)
                killed = time.perf_counter()
                primary.kill()
                dead = time.perf_counter()  # a write started from now on lands on the new one
                standby.promote()
                primary, standby = standby, None
                after: list[float] = []
                while not after:
                    if time.perf_counter() > dead + 120:
                        raise RuntimeError("no write was acknowledged after the failover")
                    time.sleep(0.01)
                    after = [t for s, t, _ in writers.acked if s > dead]
                downtime.append((min(after) - killed) * 1000)
                standby = primary.standby(sync=sync, port=ports[r + 2])
                clusters.append(standby)
            time.sleep(args.load_seconds)
        finally:
            writers.stop()
            mem.close()
        final = PostgresStore(primary.dsn_for(_DB), schema=_SCHEMA, create=False)
        try:
            stored = [t.turn_id for t in final.turns("ana")]
        finally:
            final.close()
    finally:
        for c in clusters:
            c.stop()
    acked = [tid for _, _, tid in writers.acked]
    lost = sorted(set(acked) - set(stored))
    return {
        "replication": mode,
        "failovers": args.failovers,
        "acknowledged": len(acked),
        "stored": len(stored),
        "stored_twice": len(stored) - len(set(stored)),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "failed_attempts": dict(writers.errors),
        "kill_to_next_ack": _ms(downtime),
    }


def _reads(
    dsn: str, replicas: list[str], embedder: Any, args: argparse.Namespace, res: dict[str, Any]
) -> None:
    """The `throughput` and `ryw` parts on a primary and its replicas (loaded here)."""
    from reflective_memory.errors import ConfigError

    if not replicas:
        raise ConfigError("the throughput and ryw parts need a replica: give --read-dsn")
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:  # a fresh schema each run
        conn.execute(f"DROP SCHEMA IF EXISTS {_SCHEMA} CASCADE")
    mem = _memory(dsn, [], embedder)
    try:
        res["data"] = {"users": args.users, "turns_per_user": args.turns}
        res["data"]["load_s"] = round(load_users(mem, args.users, args.turns), 1)
    finally:
        mem.close()
    if "throughput" in args.parts:
        res["throughput"] = {
            "clients": args.clients,
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            **_throughput(dsn, replicas, embedder, args),
        }
    if "ryw" in args.parts:
        res["ryw"] = _ryw(dsn, replicas[0], embedder, args)


def _on_own_servers(embedder: Any, args: argparse.Namespace, res: dict[str, Any]) -> None:
    """The `throughput` and `ryw` parts on a primary and two standbys started here."""
    primary = Cluster().start()
    standbys: list[Cluster] = []
    try:
        primary.create_database(_DB)
        standbys = [primary.standby(), primary.standby()]
        _reads(primary.dsn_for(_DB), [s.dsn_for(_DB) for s in standbys], embedder, args, res)
    finally:
        for c in [*standbys, primary]:
            c.stop()


def run_replicas_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parts asked for; return the results (also written to `--out`).

    Raises:
        ConfigError: No local PostgreSQL + pgvector to start servers with.
    """
    from reflective_memory.errors import ConfigError

    reason = missing_reason()
    own = args.dsn is None or "failover" in args.parts
    if reason is not None and own:
        raise ConfigError(f"bench replicas starts local servers: {reason}")
    res: dict[str, Any] = {
        **run_context(),
        "embedder": args.embedder,
    }
    embedder = _embedder(args.embedder)
    if {"throughput", "ryw"} & set(args.parts):
        if args.dsn is not None:
            _reads(args.dsn, list(args.read_dsn or []), embedder, args, res)
        else:
            _on_own_servers(embedder, args, res)
    if "failover" in args.parts:
        modes = ("sync", "async") if args.replication == "both" else (args.replication,)
        res["failover"] = [_failover(m, embedder, args) for m in modes]
    return finish(res, args.out, "replicas")


def register(bench: Any) -> None:
    """Add `bench replicas` to the CLI's bench sub-parsers."""
    p = bench_parser(bench, "replicas", _SUMMARY, __doc__, run_replicas_bench)
    p.add_argument(
        "--parts",
        nargs="+",
        choices=("throughput", "ryw", "failover"),
        default=["throughput", "ryw", "failover"],
        help="which parts to run (default: all)",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="throughput and ryw on this primary (and --read-dsn replicas) instead of servers "
        "started here; the schema `bench` is dropped and loaded",
    )
    p.add_argument("--read-dsn", action="append", default=None, help="a replica of --dsn")
    p.add_argument("--users", type=int, default=50, help="users loaded")
    p.add_argument("--turns", type=int, default=40, help="turns per user")
    p.add_argument("--clients", type=int, default=8, help="retrieving threads")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per throughput run")
    p.add_argument("--rounds", type=int, default=2, help="throughput runs per setting")
    p.add_argument("--pairs", type=int, default=1000, help="write-then-read pairs")
    p.add_argument("--writers", type=int, default=4, help="threads writing then reading")
    p.add_argument("--failovers", type=int, default=5, help="primary kills per mode")
    p.add_argument("--load-seconds", type=float, default=1.5, help="writing between kills")
    p.add_argument("--replication", choices=("sync", "async", "both"), default="both")
    p.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
