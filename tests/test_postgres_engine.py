"""ReflectiveMemory on PostgreSQL + pgvector: isolation, durability, freshness, shared state.

Runs against the throwaway cluster of `conftest.pg_cluster` (skipped without PostgreSQL +
pgvector locally, failed in CI where REFLECTIVE_REQUIRE_POSTGRES=1).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from pg_cluster import pg_schema
from reflective_memory import (
    ConfigError,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)
from reflective_memory.errors import StoreUnavailableError

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "garden piano violin marathon lisbon berlin tokyo allergy peanut dog cat parrot nurse "
    "teacher engineer wedding sister brother coffee tea cycling sailing chess novel poetry"
).split()


def _store(dsn: str, schema: str, **kw):
    from reflective_memory.storage.postgres import PostgresStore

    return PostgresStore(dsn, schema=schema, pool_max=6, **kw)


def _mem(dsn: str, schema: str, *, dim: int = 64, store_kw=None, **cfg) -> ReflectiveMemory:
    return ReflectiveMemory(
        store=_store(dsn, schema, **(store_kw or {})),
        embedder=HashingEmbedder(dim),
        config=MemoryConfig(units={"granularities": ("turn",)}).replace(**cfg),
    )


def test_bad_store_arguments_fail_before_any_work(tmp_path, pg_dsn) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    with pytest.raises(InvalidInputError, match="postgresql://"):
        ReflectiveMemory(store="sqlite:///tmp/x.db", embedder=HashingEmbedder(16))
    with pytest.raises(InvalidInputError, match="not both"):
        ReflectiveMemory(tmp_path / "x", store=pg_dsn, embedder=HashingEmbedder(16))
    assert not (tmp_path / "x").exists()
    with pytest.raises(InvalidInputError, match="store contract"):
        ReflectiveMemory(store=object(), embedder=HashingEmbedder(16))
    with pytest.raises(ConfigError, match="schema"):
        PostgresStore(pg_dsn, schema="Bad-Name")
    with pytest.raises(InvalidInputError):
        PostgresStore(12345)
    with ReflectiveMemory(store=pg_dsn, embedder=HashingEmbedder(16)) as mem:
        with pytest.raises(InvalidInputError, match="NUL"):
            mem.add_turn("ana", "s1", "user", "a\x00b")
        with pytest.raises(InvalidInputError, match="NUL"):
            mem.put_memory("ana", "x\x00y")
        assert mem.users() == []
    with pytest.raises(StoreUnavailableError):
        PostgresStore("postgresql://postgres@127.0.0.1:9/none", timeout=1.5)


def test_dsn_string_opens_a_working_memory(pg_dsn) -> None:
    with ReflectiveMemory(store=pg_dsn, embedder=HashingEmbedder(64)) as mem:
        mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        mem.end_session("ana", "s1")
        hit = mem.retrieve("ana", "What is my dog called?", k=1).hits[0]
        assert "Pixel" in hit.memory.text and hit.memory.user_id == "ana"
        mem.delete_user("ana")
    with ReflectiveMemory(store=pg_dsn, embedder=HashingEmbedder(64)) as mem:
        assert mem.users() == [] and len(mem.retrieve("ana", "dog", k=3)) == 0


def test_users_never_receive_each_others_memories(pg_dsn) -> None:
    rng = random.Random(7)
    with _mem(pg_dsn, pg_schema()) as mem:
        owner: dict[str, str] = {}
        users = [f"user-{i}" for i in range(5)]
        for n in range(100):
            user = rng.choice(users)
            text = " ".join(rng.choices(WORDS, k=6)) + f" marker{n}"
            t = mem.add_turn(user, f"s{rng.randint(0, 2)}", "user", text)
            owner[f"{user}/{t.session_id}/{t.turn_id}"] = user
        for user in users:
            for session in mem.open_sessions(user):
                mem.end_session(user, session)
        for _ in range(12):
            user = rng.choice(users)
            query = " ".join(rng.choices(WORDS, k=3))
            for mode in ("dense", "lexical", "hybrid"):
                r = mem.retrieve(user, query, k=50, mode=mode)
                assert r.diagnostics["index_size"] == mem.stats(user)["memories"]
                for h in r:
                    assert h.memory.user_id == user
                    for tid in h.memory.turn_ids:
                        assert owner[f"{user}/{h.memory.session_id}/{tid}"] == user
        said_by = {u: [k for k, v in owner.items() if v == u] for u in users}
        probe = next(u for u in users if said_by[u])
        for other in users:
            if other == probe:
                continue
            r = mem.retrieve(other, "marker", k=200, mode="lexical")
            assert all(h.memory.user_id == other for h in r)


def test_lexical_search_runs_on_the_server(pg_dsn) -> None:
    with _mem(pg_dsn, pg_schema()) as mem:
        mem.add_turn("u", "s", "user", "I adopted a parrot named Kiwi in Lisbon.")
        mem.add_turn("u", "s", "user", "The marathon in Berlin was tough.")
        mem.add_turn("v", "s", "user", "Kiwi is also my cat's name.")
        mem.end_session("u", "s")
        mem.end_session("v", "s")
        r = mem.retrieve("u", "kiwi parrot", k=5, mode="lexical")
        assert [h.memory.text.split("\n")[-1] for h in r] == [  # after its date line
            "user: I adopted a parrot named Kiwi in Lisbon."
        ]
        assert r.hits[0].scores["lexical"] > 0
        assert len(mem.retrieve("u", "zebra", k=5, mode="lexical")) == 0


def test_cached_index_follows_other_processes_writes(pg_dsn) -> None:
    schema = pg_schema()
    with _mem(pg_dsn, schema) as a, _mem(pg_dsn, schema) as b:
        a.add_turn("u", "s1", "user", "I play the violin every evening.")
        a.end_session("u", "s1")
        assert len(b.retrieve("u", "violin", k=5)) == 1  # b caches u's index at this version
        a.add_turn("u", "s2", "user", "My violin teacher lives in Tokyo.")
        a.end_session("u", "s2")
        texts = [h.memory.text for h in b.retrieve("u", "violin teacher", k=5)]
        assert len(texts) == 2 and any("Tokyo" in t for t in texts)
        a.delete_session("u", "s1")
        texts = [h.memory.text for h in b.retrieve("u", "violin", k=5)]
        assert len(texts) == 1 and "Tokyo" in texts[0]


def test_hnsw_path_with_iterative_scan_matches_exact(pg_dsn) -> None:
    schema = pg_schema()
    rng = random.Random(3)
    texts = [" ".join(rng.choices(WORDS, k=5)) + f" item{i}" for i in range(120)]
    with _mem(pg_dsn, schema, store_kw={"hnsw_threshold": 50}) as mem:
        mem.add_turns([{"user_id": "big", "session_id": "s", "role": "user", "text": t}
                       for t in texts])  # fmt: skip
        mem.add_turns([{"user_id": "small", "session_id": "s", "role": "user", "text": t}
                       for t in texts[:10]])  # fmt: skip
        mem.end_session("big", "s")
        mem.end_session("small", "s")
        exact = _mem(pg_dsn, schema, store_kw={"hnsw_threshold": None})
        try:
            for q in ("piano lisbon dog", "chess novel tea", "sailing sister"):
                ra = mem.retrieve("big", q, k=10, mode="dense", recall={"mode": "familiarity"})
                re_ = exact.retrieve("big", q, k=10, mode="dense", recall={"mode": "familiarity"})
                assert ra.diagnostics["ann"] == "pg-hnsw" and re_.diagnostics["ann"] == "pg-exact"
                overlap = {h.memory.id for h in ra} & {h.memory.id for h in re_}
                assert len(overlap) >= 8
                assert all(h.memory.user_id == "big" for h in ra)
            rs = mem.retrieve("small", "piano", k=5, mode="dense")
            assert rs.diagnostics["ann"] == "pg-exact"
        finally:
            exact.close()
        store = mem.store
        q = HashingEmbedder(64).encode("piano")
        with store.db.transaction() as conn:
            conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    f"EXPLAIN SELECT id FROM {store.db.qualified}.memories WHERE user_id='big' AND"
                    " embed_dim=64 ORDER BY embedding::vector(64) <#> %s::vector(64) LIMIT 10",
                    (np.asarray(q, np.float32),),
                )
            )
        assert "memories_hnsw_64" in plan


def test_two_engines_ending_one_session_build_it_once(pg_dsn, spans) -> None:
    schema = pg_schema()
    with _mem(pg_dsn, schema) as a, _mem(pg_dsn, schema) as b:
        for i in range(6):
            a.add_turn("u", "s", "user", f"fact {i} about the garden")
        results: dict[str, list[str]] = {}
        barrier = threading.Barrier(2)

        def end(name: str, mem: ReflectiveMemory) -> None:
            barrier.wait()
            results[name] = sorted(m.id for m in mem.end_session("u", "s"))

        threads = [threading.Thread(target=end, args=(n, m)) for n, m in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results["a"] == results["b"] and len(results["a"]) == 6
        assert a.store.session_builds("u", "s") == 1
        ends = [s for s in spans.get_finished_spans() if s.name == "end_session"]
        paths = sorted(s.attributes["reflective_memory.path"] for s in ends)
        assert paths == ["built", "built_elsewhere"]  # the traces say who built it
        a.add_turn("u", "s", "user", "one more fact")  # new turns: the next end rebuilds
        assert len(b.end_session("u", "s")) == 7
        assert a.store.session_builds("u", "s") == 2


def _notes(mem, user: str, n: int = 8) -> None:
    """`n` notes, one session each (so a retrieval shows several passages)."""
    for i in range(n):
        when = f"2024-01-{i + 1:02d}T10:00:00Z"
        mem.add_turn(
            user, f"s{i}", "user", f"note {i} about {WORDS[i]} and {WORDS[i + 5]}", timestamp=when
        )
        mem.end_session(user, f"s{i}")


def _taught(mem, user: str, i: int):
    r = mem.retrieve(user, f"{WORDS[i]} and {WORDS[i + 1]} note", budget_tokens=60)
    assert len(r.hits) >= 2
    return mem.feedback(r, cited=[len(r.hits) - 1])


def test_turn_ranker_offsets_from_two_processes_are_not_lost_and_go_with_the_user(pg_dsn) -> None:
    """Shared and per-user offsets live in the database; each save adds to what is stored."""
    from reflective_memory.rmm.turn_learning import PRIOR_OWNER, SHARED_STATE, USER_STATE

    schema = pg_schema()
    cfg = {"rerank": {"save_every": 2, "turn_learning_rate": 0.2}}
    with _mem(pg_dsn, schema, **cfg) as a, _mem(pg_dsn, schema, **cfg) as b:
        for user in ("u", "v"):
            _notes(a, user)
        for i in range(6):
            for mem in (a, b):
                assert _taught(mem, "u", i).learned
        assert _taught(a, "v", 0).learned
        a.rerank_stage.learning.flush()
        b.rerank_stage.learning.flush()
        with _mem(pg_dsn, schema, **cfg) as c:  # a new process reads it from the database
            w = c.ranker_weights("u")
            assert w["episodes"] == 13 and w["user_episodes"] == 12
            assert any(w["user"].values())
        assert a.store.state.version(PRIOR_OWNER, SHARED_STATE) > 0
        a.delete_user("u")
        assert a.store.state.version("u", USER_STATE) == 0
        assert a.store.state.version("v", USER_STATE) > 0  # v keeps its own
        assert a.ranker_weights("u")["user_episodes"] == 0
        b.rerank_stage.learning.flush()  # the other process, one save window later
        assert b.ranker_weights("u")["user_episodes"] == 0
        assert a.ranker_weights()["episodes"] == 13  # the shared offsets are an aggregate


WRITER = textwrap.dedent(
    """
    import sys
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
    from reflective_memory.storage.postgres import PostgresStore
    dsn, schema, ack = sys.argv[1], sys.argv[2], sys.argv[3]
    mem = ReflectiveMemory(store=PostgresStore(dsn, schema=schema), embedder=HashingEmbedder(64),
                           config=MemoryConfig(granularities=("turn",), max_session_turns=7))
    with open(ack, "a", buffering=1) as out:
        for i in range(100000):
            t = mem.add_turn("u", f"s{i // 10}", "user", f"fact number {i} about zebras")
            out.write(t.turn_id + "\\n")
    """
)


def test_sigkill_during_ingest_loses_no_acknowledged_turn(tmp_path: Path, pg_dsn) -> None:
    schema = pg_schema()
    _store(pg_dsn, schema).close()  # create the schema before the writer races for it
    ack, script = tmp_path / "ack.txt", tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}{REPO}"}
    proc = subprocess.Popen([sys.executable, str(script), pg_dsn, schema, str(ack)], env=env)
    deadline = time.time() + 90
    while time.time() < deadline:
        if ack.exists() and len(ack.read_text().splitlines()) >= 40:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acknowledged = [line for line in ack.read_text().splitlines() if line]
    assert len(acknowledged) >= 40
    with _mem(pg_dsn, schema) as mem:
        stored = {t.turn_id for t in mem.turns("u")}
        assert set(acknowledged) <= stored
        for session in mem.open_sessions("u"):
            mem.end_session("u", session)
        assert len(mem.retrieve("u", "fact number 3 about zebras", k=3)) == 3
        assert mem.stats("u")["memories"] == len(stored)


def test_db_init_command_is_idempotent(pg_dsn, capsys) -> None:
    from reflective_memory.cli import main

    schema = pg_schema()
    args = ["db", "init", "--dsn", pg_dsn, "--schema", schema, "--dim", "64"]
    assert main(args) == 0
    assert "created" in capsys.readouterr().out
    assert main(args) == 0
    assert "present" in capsys.readouterr().out
    assert main(["db", "init", "--dsn", "sqlite:///x"]) == 2
    with _mem(pg_dsn, schema) as mem:
        mem.add_turn("u", "s", "user", "schema made by db init works")
        assert len(mem.end_session("u", "s")) == 1


def test_bench_storage_small_run(pg_dsn, tmp_path) -> None:
    from reflective_bench.storage import run_storage_bench
    from reflective_memory.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "storage", "--dsn", pg_dsn, "--parts", "one-user,many-users",
         "--one-user", "300", "--users", "4", "--per-user", "50", "--dim", "32",
         "--queries", "2", "--tmp", str(tmp_path), "--out", str(tmp_path / "r.json")]
    )  # fmt: skip
    res = run_storage_bench(args)
    one = res["one_user"]
    for name in ("embedded", "postgres", "postgres_hnsw"):
        assert one[name]["n"] == 2 and one[name]["p95_ms"] >= one[name]["p50_ms"] > 0
    assert res["many_users"]["rows"] == 200
    assert res["many_users"]["postgres"]["warm"]["n"] == 2
    assert (tmp_path / "r.json").exists()


def test_concurrent_writers_to_one_session_get_distinct_positions(pg_dsn) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    schema = pg_schema()
    stores = [PostgresStore(pg_dsn, schema=schema, pool_max=2) for _ in range(3)]
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(15):
                stores[w].add_turns(
                    [{"user_id": "u", "session_id": "s", "role": "user", "text": f"{w}-{i}"}]
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        turns = stores[0].turns("u", "s")
        assert [t.position for t in turns] == list(range(45))
        assert [t.turn_id for t in turns] == [f"s:{i}" for i in range(45)]
        assert stores[0].session("u", "s").n_turns == 45
    finally:
        for s in stores:
            s.close()


def test_bench_retrieval_on_postgres_matches_the_embedded_baselines(pg_dsn, tmp_path) -> None:
    """`bench retrieval --dsn`: every system on its own schema, dropped afterwards; the plain
    dense baseline ranks the same on both backends."""
    import psycopg
    from reflective_bench.retrieval import coverage_at_budget, pg_stores
    from reflective_bench.systems import BASELINES, DEFAULT, run_systems
    from reflective_memory.io import load_conversations
    from test_bench_feedback import _locomo_file

    convs = load_conversations(_locomo_file(tmp_path, users=2, questions=4))
    systems = [DEFAULT, BASELINES[0]]
    kw = {"embedder": HashingEmbedder(64), "budgets": [20, 60], "coverage_fn": coverage_at_budget}
    on_pg = run_systems(convs, systems, stores=pg_stores(pg_dsn), progress=False, **kw)
    local = run_systems(convs, systems, progress=False, **kw)
    dense = BASELINES[0].name
    for b in (20, 60):
        assert on_pg.coverage[(dense, b)] == local.coverage[(dense, b)]
        assert len(on_pg.coverage[("default", b)]) == 8
    with psycopg.connect(pg_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM information_schema.schemata "
            "WHERE schema_name LIKE 'bench_retrieval_%'"
        ).fetchone()[0]
    assert left == 0


def test_open_session_turns_rank_fairly_on_postgres(pg_dsn) -> None:
    """Issue 27 on the server backend: every turn, open or ended, is in the top 5 for its text."""
    from test_open_sessions import SESSIONS, _fill, _misses

    with ReflectiveMemory(
        store=_store(pg_dsn, pg_schema()), embedder=HashingEmbedder(), config=MemoryConfig()
    ) as mem:
        _fill(mem, SESSIONS, "open")
        assert mem.open_sessions("u") == ["open"]
        assert _misses(mem, "u") == {True: [], False: []}


def test_reopening_ends_idle_sessions_as_the_embedded_store_does(pg_dsn) -> None:
    schema = pg_schema()
    # written with no rule ending sessions, so both are open when the store is opened again
    rules = {"idle_seconds": None, "end_on_new_session": False}
    with _mem(pg_dsn, schema, sessions=rules) as mem:
        mem.add_turn("u", "old", "user", "We booked the cabin in Tromsø.", timestamp="2024-01-05")
        # live, stamped now (a turn without a time would take the open replay's time)
        now = datetime.now(timezone.utc)
        mem.add_turn("u", "new", "user", "Just now: the ferry is late.", timestamp=now)
        assert sorted(mem.open_sessions("u")) == ["new", "old"]
    with _mem(pg_dsn, schema, sessions={"idle_seconds": 3600}) as again:
        assert again.open_sessions("u") == ["new"]  # the idle one ended on open
        assert [t.text for t in again.turns("u", "old")] == ["We booked the cabin in Tromsø."]
        assert again.retrieve("u", "cabin Tromsø", k=1).hits[0].memory.session_id == "old"
