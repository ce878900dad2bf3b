"""`reflective-memory bench storage`: the PostgreSQL store next to the embedded one, same run.

Three measurements, each on both backends in the same process and run:

1. `one-user`: one user with `--one-user` memories (default 10,000). Keys are synthetic sentences
   (a Zipf-distributed vocabulary of made-up words) embedded by `HashingEmbedder(--dim)`.
   Query p50 / p95 of `ReflectiveMemory.retrieve(k=10)` with the default configuration
   (hybrid dense + lexical, RF-Mem gate, reranker), embedded (SQLite + FAISS + BM25 caches) vs
   PostgreSQL (exact per-user pgvector scan, server full-text search), plus PostgreSQL forced
   onto the HNSW index with iterative scans; the three are queried interleaved (rotating order),
   so a noisy machine loads them alike.
2. `many-users`: `--users` users x `--per-user` memories (default 1,000 x 1,000 = 1M rows), with
   precomputed random unit vectors (embedding a million texts is not what is measured; say so
   when quoting). Queries go to random users: first touch of a user (`cold`: the embedded store
   builds its per-user FAISS/BM25 cache, PostgreSQL reads the id list) and a second pass over
   the same users (`warm`).
3. `ingest`: `add_turn` turns/s (sessions end every 10 turns, so memories are built too) with 1
   writer process and with `--writers` writer processes, each on its own user.

Rows are bulk-loaded (SQLite `executemany`, PostgreSQL binary `COPY`); load times are reported.
The PostgreSQL schemas `bench_one`, `bench_many`, `bench_ingest` are dropped and recreated.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import platform
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.storage.checksum import text_crc

__all__ = ["load_users", "register", "run_storage_bench", "synthetic_texts"]

logger = logging.getLogger(__name__)


def synthetic_texts(n: int, seed: int, vocab: int = 5000, words: int = 14) -> list[str]:
    """`n` sentences of made-up words drawn from a Zipf-like distribution (deterministic)."""
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "ter", "sun", "va", "ro", "pel", "din", "sa", "gor", "ne", "tu"]
    lex = []
    for i in range(vocab):
        w, j = "", i + 1
        while j:
            j, r = divmod(j, len(syll))
            w += syll[r]
        lex.append(w)
    # Zipf ranks from 100 on: the 100 most frequent words of a language are stopwords,
    # which the library's tokenizer drops anyway
    p = 1.0 / np.arange(100, vocab + 100) ** 1.05
    p /= p.sum()
    idx = rng.choice(vocab, size=(n, words), p=p)
    return [" ".join(lex[j] for j in row) for row in idx]


def load_users(mem: Any, users: int, turns: int, seed: int = 7) -> float:
    """Give users `u0`, `u1`, ... `turns` synthetic turns each, in ended sessions of 10.

    Returns:
        Seconds taken (turns stored, sessions' memories built).
    """
    t0 = time.perf_counter()
    texts = synthetic_texts(users * turns, seed=seed)
    for u in range(users):
        mine = texts[u * turns : (u + 1) * turns]
        for s in range(0, len(mine), 10):
            sid = f"s{s // 10}"
            mem.add_turns(
                [
                    {"user_id": f"u{u}", "session_id": sid, "role": "user", "text": t}
                    for t in mine[s : s + 10]
                ]
            )
            mem.end_session(f"u{u}", sid)
    return time.perf_counter() - t0


def _pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p95_ms": round(float(np.percentile(a, 95)), 2),
        "mean_ms": round(float(a.mean()), 2),
        "n": len(xs),
    }


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


# -- bulk loading (benchmark only: bypasses the engine to load a million rows in minutes) ----
def _load_sqlite(
    store: Any, rows: list[tuple[str, str, str]], vectors: np.ndarray, model: str
) -> None:
    now = "2026-01-01T00:00:00+00:00"
    users = sorted({r[0] for r in rows})
    with store._lock, store._tx():
        store.conn.executemany(
            "INSERT INTO memories (id, user_id, session_id, granularity, text, key, turn_ids,"
            " start_ts, end_ts, created_at, updated_at, metadata, embedding, embed_model,"
            " text_crc, key_crc)"
            " VALUES (?, ?, ?, 'turn', ?, ?, '[]', NULL, NULL, ?, ?, '{}', ?, ?, ?, ?)",
            (
                (mid, u, "s0", text, text, now, now, vectors[i].tobytes(), model, crc, crc)
                for i, (u, mid, text) in enumerate(rows)
                for crc in (text_crc(text),)
            ),
        )
        for u in users:
            store._bump(u)


def _load_postgres(
    store: Any, rows: list[tuple[str, str, str]], vectors: np.ndarray, model: str
) -> None:
    from psycopg.types.json import Jsonb
    from reflective_memory.storage.core import lexical_text as _lex

    s = store.db.qualified
    dim = int(vectors.shape[1])
    with store.db.transaction() as conn, conn.cursor() as cur:
        with cur.copy(
            f"COPY {s}.memories (user_id, id, session_id, granularity, text, key, lex, turn_ids,"
            " created_at, updated_at, metadata, embedding, embed_dim, embed_model, text_crc,"
            " key_crc) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(
                ["text", "text", "text", "text", "text", "text", "text", "jsonb",
                 "timestamptz", "timestamptz", "jsonb", "vector", "int4", "text", "int8", "int8"]
            )  # fmt: skip
            from datetime import datetime, timezone

            now = datetime(2026, 1, 1, tzinfo=timezone.utc)
            # jsonb in binary COPY: a Python str would be stored as a JSON string, not a list
            # or an object, and read back as one
            no_ids, no_meta = Jsonb([]), Jsonb({})
            for i, (u, mid, text) in enumerate(rows):
                copy.write_row(
                    (u, mid, "s0", "turn", text, text, _lex(text), no_ids, now, now, no_meta,
                     vectors[i], dim, model, text_crc(text), text_crc(text))
                )  # fmt: skip
        cur.execute(
            f"INSERT INTO {s}.user_state (user_id, version) SELECT DISTINCT user_id, 1 FROM"
            f" {s}.memories ON CONFLICT (user_id) DO UPDATE SET version = user_state.version + 1"
        )
    with store.db.transaction() as conn:
        conn.execute(f"ANALYZE {s}.memories")


def _fresh_pg(dsn: str, schema: str, **kw: Any) -> Any:
    import psycopg
    from reflective_memory.storage.postgres import PostgresStore

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return PostgresStore(dsn, schema=schema, **kw)


def _mem(store: Any, dim: int) -> Any:
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

    return ReflectiveMemory(
        store=store,
        embedder=HashingEmbedder(dim),
        config=MemoryConfig(units={"granularities": ("turn",)}),
    )


def _time_queries(mem: Any, pairs: list[tuple[str, str]], k: int) -> tuple[list[float], dict]:
    lat: list[float] = []
    stages: dict[str, list[float]] = {}
    for user, q in pairs:
        t0 = time.perf_counter()
        r = mem.retrieve(user, q, k=k)
        lat.append((time.perf_counter() - t0) * 1000)
        for key, v in r.diagnostics.get("timings_ms", {}).items():
            stages.setdefault(key, []).append(float(v))
    return lat, {k2: round(float(np.median(v)), 2) for k2, v in stages.items()}


def _one_user(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from reflective_memory import HashingEmbedder
    from reflective_memory.storage.sqlite import SQLiteStore

    n, dim = args.one_user, args.dim
    emb = HashingEmbedder(dim)
    texts = synthetic_texts(n, seed=1)
    t0 = time.perf_counter()
    vectors = emb.encode(texts).astype(np.float32)
    embed_s = time.perf_counter() - t0
    rows = [("one", f"turn-one-{i}", t) for i, t in enumerate(texts)]
    queries = [("one", " ".join(t.split()[:6])) for t in synthetic_texts(args.queries, seed=2)]
    out: dict[str, Any] = {"memories": n, "embed_s": round(embed_s, 1)}
    from reflective_memory.storage.postgres import PostgresStore

    sqlite_store = SQLiteStore(tmp / "one.sqlite3")
    t0 = time.perf_counter()
    _load_sqlite(sqlite_store, rows, vectors, emb.name)
    loads = {"embedded": time.perf_counter() - t0}
    pg_store = _fresh_pg(args.dsn, "bench_one")
    t0 = time.perf_counter()
    _load_postgres(pg_store, rows, vectors, emb.name)
    loads["postgres"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pg_store.search.ensure_vector_index(dim)
    build_s = time.perf_counter() - t0
    # the same rows through the HNSW index (iterative scans): a second store, threshold 0
    hnsw_store = PostgresStore(args.dsn, schema="bench_one", hnsw_threshold=0)
    mems = {
        "embedded": _mem(sqlite_store, dim),
        "postgres": _mem(pg_store, dim),
        "postgres_hnsw": _mem(hnsw_store, dim),
    }
    lat: dict[str, list[float]] = {k: [] for k in mems}
    stages: dict[str, dict[str, list[float]]] = {k: {} for k in mems}
    try:
        for mem in mems.values():
            _time_queries(mem, queries[:5], args.k)  # warm: index cache, reranker, pool
        names = list(mems)
        # interleaved, rotating order: every backend sees the same load over the run
        for i, pair in enumerate(queries):
            for name in names[i % 3 :] + names[: i % 3]:
                one, st = _time_queries(mems[name], [pair], args.k)
                lat[name] += one
                for key, v in st.items():
                    stages[name].setdefault(key, []).append(v)
    finally:
        for mem in mems.values():
            mem.close()
    for name in mems:
        med = {k: round(float(np.median(v)), 2) for k, v in stages[name].items()}
        out[name] = {**_pct(lat[name]), "stages_median_ms": med}
        if name in loads:
            out[name]["load_s"] = round(loads[name], 1)
        logger.info("one-user %s: %s", name, out[name])
    out["postgres_hnsw"]["index_build_s"] = round(build_s, 1)
    out["ratio_p50_postgres_vs_embedded"] = round(
        out["postgres"]["p50_ms"] / out["embedded"]["p50_ms"], 2
    )
    return out


def _many_users(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from reflective_memory.storage.sqlite import SQLiteStore

    users, per, dim = args.users, args.per_user, args.dim
    rng = np.random.default_rng(3)
    base = synthetic_texts(20_000, seed=4)
    out: dict[str, Any] = {"users": users, "per_user": per, "rows": users * per}
    qrng = np.random.default_rng(5)
    picked = [
        f"user{int(u):05d}"
        for u in qrng.choice(users, size=min(args.queries, users), replace=False)
    ]
    qtexts = synthetic_texts(len(picked), seed=6)
    pairs = [(u, " ".join(t.split()[:6])) for u, t in zip(picked, qtexts, strict=True)]
    stores = {
        "embedded": lambda: SQLiteStore(tmp / "many.sqlite3"),
        "postgres": lambda: _fresh_pg(args.dsn, "bench_many"),
    }
    for name, make in stores.items():
        store = make()
        load_s = 0.0
        chunk_users = max(1, 100_000 // per)
        for start in range(0, users, chunk_users):
            ids = range(start, min(users, start + chunk_users))
            rows = [
                (f"user{u:05d}", f"turn-{u}-{i}", base[(u * 7919 + i * 104729) % len(base)])
                for u in ids
                for i in range(per)
            ]
            vectors = _unit(rng, len(rows), dim)
            t0 = time.perf_counter()
            (_load_sqlite if name == "embedded" else _load_postgres)(
                store, rows, vectors, f"hashing:{dim}"
            )
            load_s += time.perf_counter() - t0
        logger.info("many-users %s: loaded %d rows in %.0f s", name, users * per, load_s)
        with _mem(store, dim) as mem:
            _time_queries(mem, [("user-absent", "warm up")], args.k)
            cold, cstages = _time_queries(mem, pairs, args.k)
            warm, wstages = _time_queries(mem, pairs, args.k)
        out[name] = {
            "load_s": round(load_s, 1),
            "cold": {**_pct(cold), "stages_median_ms": cstages},
            "warm": {**_pct(warm), "stages_median_ms": wstages},
        }
        logger.info("many-users %s: %s", name, out[name])
    return out


def _writer(spec: dict[str, Any], user: str, ready: Any, go: Any, results: Any) -> None:
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

    cfg = MemoryConfig(units={"granularities": ("turn",)}, sessions={"max_turns": 10})
    if spec["backend"] == "embedded":
        mem = ReflectiveMemory(spec["path"], embedder=HashingEmbedder(spec["dim"]), config=cfg)
    else:
        from reflective_memory.storage.postgres import PostgresStore

        store = PostgresStore(spec["dsn"], schema=spec["schema"], pool_max=3)
        mem = ReflectiveMemory(store=store, embedder=HashingEmbedder(spec["dim"]), config=cfg)
    texts = synthetic_texts(500, seed=zlib.crc32(user.encode()) % 1000)
    ready.put(user)
    go.wait()
    deadline = time.time() + spec["seconds"]
    n = 0
    t0 = time.perf_counter()
    while time.time() < deadline:
        mem.add_turn(
            user, f"{user}-s{n // 10}", "user" if n % 2 == 0 else "assistant", texts[n % 500]
        )
        n += 1
    results.put((user, n, time.perf_counter() - t0))
    mem.close()


def _ingest_run(spec: dict[str, Any], writers: int, tag: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_writer, args=(spec, f"{tag}-w{i}", ready, go, results))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    go.set()
    got = [results.get(timeout=spec["seconds"] + 300) for _ in procs]
    for p in procs:
        p.join()
    turns = sum(n for _, n, _ in got)
    secs = max(s for _, _, s in got)
    return {"writers": writers, "turns": turns, "seconds": round(secs, 1),
            "turns_per_s": round(turns / secs, 1)}  # fmt: skip


def _ingest(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": args.ingest_seconds}
    _fresh_pg(args.dsn, "bench_ingest").close()
    for backend in ("embedded", "postgres"):
        spec = {"backend": backend, "dim": args.dim, "seconds": args.ingest_seconds,
                "path": str(tmp / "ingest"), "dsn": args.dsn, "schema": "bench_ingest"}  # fmt: skip
        one = _ingest_run(spec, 1, f"{backend}-1")
        many = _ingest_run(spec, args.writers, f"{backend}-{args.writers}")
        out[backend] = {"one_writer": one, "many_writers": many,
                        "speedup": round(many["turns_per_s"] / one["turns_per_s"], 2)}  # fmt: skip
        logger.info("ingest %s: %s", backend, out[backend])
    return out


def run_storage_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected parts; return the results (also written to `--out` as JSON)."""
    from reflective_memory.errors import InvalidInputError
    from reflective_memory.storage.postgres import is_postgres_dsn

    if not is_postgres_dsn(args.dsn):
        raise InvalidInputError("--dsn must be a postgresql://... URI")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - {"one-user", "many-users", "ingest"}
    if bad:
        raise InvalidInputError(f"unknown parts {sorted(bad)}")
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {mp.cpu_count()} cores",
        "dim": args.dim,
        "k": args.k,
    }
    try:
        res["load_before"] = [round(x, 2) for x in __import__("os").getloadavg()]
    except OSError:  # pragma: no cover
        pass
    with tempfile.TemporaryDirectory(prefix="rm-bench-storage-", dir=args.tmp) as d:
        tmp = Path(d)
        if "one-user" in parts:
            res["one_user"] = _one_user(args, tmp)
        if "many-users" in parts:
            res["many_users"] = _many_users(args, tmp)
        if "ingest" in parts:
            res["ingest"] = _ingest(args, tmp)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return res


def _cmd(args: argparse.Namespace) -> int:
    res = run_storage_bench(args)
    print(json.dumps(res, indent=2))  # noqa: T201 - the command's output
    return 0


def register(bench: Any) -> None:
    """Add `bench storage` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "storage",
        help="PostgreSQL + pgvector vs the embedded store: query p50/p95, ingest turns/s",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dsn", required=True, help="postgresql://... of a server with pgvector")
    p.add_argument("--parts", default="one-user,many-users,ingest", help="comma list")
    p.add_argument("--one-user", type=int, default=10_000, help="memories of the single user")
    p.add_argument("--users", type=int, default=1000, help="users in the many-users part")
    p.add_argument("--per-user", type=int, default=1000, help="memories per user there")
    p.add_argument("--dim", type=int, default=384, help="vector size")
    p.add_argument("--queries", type=int, default=200, help="timed queries per backend")
    p.add_argument("--k", type=int, default=10, help="hits per query")
    p.add_argument("--writers", type=int, default=4, help="concurrent writer processes")
    p.add_argument("--ingest-seconds", type=float, default=15.0, help="seconds per ingest run")
    p.add_argument("--tmp", default=None, help="folder for the embedded stores")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.set_defaults(func=_cmd)
