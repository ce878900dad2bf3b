"""Reads on a real hot standby (`pg_basebackup -R` of a real primary) and failover.

Read-your-writes by WAL position on the standby, a lagging standby (replay paused), a standby
that is down, a primary SIGKILLed under writing threads with its synchronous standby promoted
(`pg_ctl promote`): every acknowledged turn is counted afterwards, and a write retried with
the same `turn_id` lands once. Skipped without PostgreSQL + pgvector (failed with
`REFLECTIVE_REQUIRE_POSTGRES=1`).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator

import pg_cluster as _pg
import pytest
from pg_cluster import pg_schema
from reflective_memory import (
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
    StoreUnavailableError,
)
from reflective_memory.storage import pg_replicas
from reflective_memory.storage.pg_replicas import WritePositions, lsn_value, record_end
from reflective_memory.storage.postgres import PostgresStore

TURNS = MemoryConfig(units={"granularities": ("turn",)}, passages={"enabled": False})


def _memory(primary: str, replica: str | list[str], **store: object) -> ReflectiveMemory:
    pg = PostgresStore(primary, read_dsn=replica, schema=pg_schema(), pool_max=4, **store)
    return ReflectiveMemory(store=pg, embedder=HashingEmbedder(), config=TURNS)


def _ask(mem: ReflectiveMemory, user: str, word: str) -> tuple[bool, dict]:
    """Whether a search for `word` finds the turn that said it, and the read log.

    Lexical search for a word said once: found exactly when the read saw the write (ranking
    plays no part).
    """
    got = mem.retrieve(user, word, k=3, mode="lexical")
    found = any(word in h.memory.text for h in got.hits)
    return found, got.diagnostics["reads"]


# -- pure parts ------------------------------------------------------------------------------
def test_wal_positions_read_and_page_headers_stand_for_the_boundary() -> None:
    assert lsn_value("16/B374D848") == (0x16 << 32) | 0xB374D848 and lsn_value(None) == 0
    seg, block = 16 << 20, 8192
    assert record_end(3 * seg + 40, block, seg) == 3 * seg  # a segment's long header
    assert record_end(5 * block + 24, block, seg) == 5 * block  # a page's short header
    assert record_end(5 * block + 96, block, seg) == 5 * block + 96


def test_write_positions_per_user_then_folded_into_a_floor() -> None:
    pos = WritePositions(limit=4)
    pos.wrote(["a"], 10)
    pos.wrote(["b", "c"], 20)
    assert (pos.need("a"), pos.need("b"), pos.need("zz"), pos.need(None)) == (10, 20, 0, 20)
    pos.replayed(15)  # every replica has 15: "a" needs nothing any more
    assert pos.need("a") == 0 and pos.need("b") == 20 and len(pos) == 2
    for i, u in enumerate("defgh"):
        pos.wrote([u], 30 + i)
    assert len(pos) <= 4 and pos.need("nobody") > 0  # the oldest were folded into the floor
    assert pos.need("h") == 34
    pos.wrote(None, 50)  # a write of no user in particular: every read waits for it
    assert pos.need("a") == 50


# -- on a real standby ----------------------------------------------------------------------
def test_a_question_right_after_a_turn_finds_it_on_the_replica(pg_replicated) -> None:
    """100 write-then-read pairs: every question finds the turn just written, answered by the
    standby after waiting for it to replay the write (read-your-writes)."""
    primary, replica = pg_replicated
    waits, servers = [], set()
    with ReflectiveMemory(
        store=primary, read_dsn=replica, embedder=HashingEmbedder(), config=TURNS
    ) as mem:
        for i in range(100):
            mem.add_turn("ana", "s1", "user", f"My code word today is kiwi{i}x.")
            found, reads = _ask(mem, "ana", f"kiwi{i}x")
            assert found, (i, reads)
            waits.append(reads["waited_ms"])
            servers |= set(reads["servers"])
    assert any(s.startswith("replica ") for s in servers), servers
    p95 = statistics.quantiles(waits, n=20)[-1]
    assert p95 < 1000 * pg_replicas.READ_WAIT_S, p95  # the standby keeps up, on this box too


def test_reads_of_a_user_wait_only_for_that_users_writes(pg_replicated) -> None:
    """A lagging standby (replay paused) is not read for what it has not replayed: the read
    waits at most `read_wait`, then goes to the primary, and the diagnostics say so; another
    user's reads, with nothing written since, stay on the standby."""
    primary, replica = pg_replicated
    with _memory(primary, replica, read_wait=0.1) as mem:
        _ask(mem, "ana", "warm")  # the standby has the new schema
        with _paused(replica):
            _lagging(mem)
    with _memory(primary, replica) as mem:  # replay resumed: the standby answers again
        mem.add_turn("bo", "s2", "user", "The code word is papaya3.")
        found, reads = _ask(mem, "bo", "papaya3")
        assert found and all(s.startswith("replica ") for s in reads["servers"]), reads


def _lagging(mem: ReflectiveMemory) -> None:
    """With replay paused: bo's write is not on the standby, ana's reads need nothing new."""
    mem.add_turn("bo", "s1", "user", "The code word is mango7.")
    t0 = time.perf_counter()
    found, reads = _ask(mem, "ana", "mango7")  # nothing of ana's written: no wait
    assert not found and all(s.startswith("replica ") for s in reads["servers"]), reads
    found, reads = _ask(mem, "bo", "mango7")
    took = time.perf_counter() - t0
    assert found, reads  # bo's reads went to the primary (the shared reranker's stayed)
    assert any(s.startswith("primary ") for s in reads["servers"]), reads
    assert any("had not replayed" in n for n in reads["notes"]), reads
    assert took < 2.0  # one bounded wait, then the primary for the rest of the call


def test_a_retry_of_a_write_that_landed_returns_the_stored_turn(pg_replicated) -> None:
    """A write whose answer was lost landed on the primary; the replica has not replayed it.
    Sent again with its `turn_id`, it is found (the refused insert makes the reads that follow
    see the primary as it is), so the retry returns the stored turn instead of failing."""
    primary, replica = pg_replicated
    with _memory(primary, replica) as mem:
        _ask(mem, "fe", "warm")
        other = PostgresStore(primary, schema=mem.store.schema, create=False)
        try:
            with _paused(replica):
                turn = {"user_id": "fe", "session_id": "s1", "role": "user", "turn_id": "t1"}
                (stored,) = other.add_turns([{**turn, "text": "The code word is pear8."}])
                again = mem.add_turn("fe", "s1", "user", "The code word is pear8.", turn_id="t1")
                assert (again.turn_id, again.seq) == (stored.turn_id, stored.seq)
                assert [t.turn_id for t in mem.turns("fe", "s1")] == ["t1"]
        finally:
            other.close()


def test_a_standby_that_is_down_sends_reads_to_the_primary_until_it_is_back(
    pg_pair, pg_replicated, monkeypatch
) -> None:
    """Reads never fail because a replica is down: they go to the primary (the diagnostics
    name it and why), the replica is left alone for a while, then used again when it is up."""
    monkeypatch.setattr(pg_replicas, "RETRY_AFTER_S", 0.3)
    primary, replica = pg_replicated
    standby = pg_pair[1]
    with _memory(primary, replica, replica_timeout=0.5) as mem:
        mem.add_turn("cy", "s1", "user", "The code word is lime5.")
        assert _ask(mem, "cy", "lime5")[0]
        standby.pause()
        try:
            found, reads = _ask(mem, "cy", "lime5")
            assert found and all(s.startswith("primary ") for s in reads["servers"]), reads
            assert any("unreachable" in n for n in reads["notes"]), reads
            t0 = time.perf_counter()
            assert _ask(mem, "cy", "lime5")[0]  # left alone: no wait for it meanwhile
            assert time.perf_counter() - t0 < 0.5
        finally:
            standby.resume()
        standby.wait_caught_up(pg_pair[0])
        time.sleep(0.3)
        deadline = time.time() + 20
        while True:  # the pool reconnects in the background
            found, reads = _ask(mem, "cy", "lime5")
            assert found
            if any(s.startswith("replica ") for s in reads["servers"]) or time.time() > deadline:
                break
            time.sleep(0.2)
        assert any(s.startswith("replica ") for s in reads["servers"]), reads


def test_a_replica_unreachable_from_the_start_never_fails_a_call(pg_replicated) -> None:
    primary, _ = pg_replicated
    nowhere = f"postgresql://postgres@127.0.0.1:{_pg.free_port()}/none"
    with _memory(primary, [nowhere], replica_timeout=0.3) as mem:
        mem.add_turn("di", "s1", "user", "The code word is fig2.")
        found, reads = _ask(mem, "di", "fig2")
        assert found and any("unreachable" in n for n in reads["notes"]), reads


def test_native_async_reads_on_the_replica(pg_replicated) -> None:
    """`aadd_turn` / `aretrieve` read the standby on the event loop (its async pool)."""
    primary, replica = pg_replicated

    async def run() -> dict:
        async with _memory(primary, replica) as mem:
            await mem.aadd_turn("ed", "s1", "user", "The code word is plum4.")
            got = await mem.aretrieve("ed", "what is the code word plum4", k=3)
            assert any("plum4" in h.memory.text for h in got.hits)
            return got.diagnostics["reads"]

    reads = asyncio.run(run())
    assert any(s.startswith("replica ") for s in reads["servers"]), reads


def test_every_surface_that_takes_a_dsn_takes_its_replicas(pg_replicated, tmp_path, capsys) -> None:
    """`ReflectiveMemory(store=..., read_dsn=...)`, `migrate --read-dsn`, `export`/`import
    --read-dsn` and the MCP server's `--read-dsn` read the standby; replicas of no PostgreSQL
    store are refused before anything opens."""
    import argparse

    from portable_data import fill, open_memory
    from reflective_memory import ConfigError
    from reflective_memory.cli import main
    from reflective_memory.serve.mcp import _open_memory

    primary, replica = pg_replicated
    with open_memory(tmp_path / "src") as mem:
        fill(mem)
    schema = pg_schema()
    argv = ["migrate", "--from", str(tmp_path / "src"), "--to", primary, "--schema", schema]
    assert main([*argv, "--read-dsn", replica]) == 0
    assert "verified 2 users" in capsys.readouterr().out
    out = tmp_path / "out.jsonl"
    where = ["--dsn", primary, "--read-dsn", replica, "--schema", schema]
    assert main(["export", *where, "-o", str(out)]) == 0
    other = ["--dsn", primary, "--read-dsn", replica, "--schema", pg_schema()]
    assert main(["import", *other, str(out)]) == 0
    args = argparse.Namespace(dsn=primary, read_dsn=[replica], db=None)
    mem = _open_memory(args)
    try:
        assert [r.db.dsn_label for r in mem.store.routes.replicas] == [
            replica.split("@")[1].split("/")[0]
        ]
    finally:
        mem.close()
    with pytest.raises(ConfigError, match="--read-dsn"):
        _open_memory(argparse.Namespace(dsn=None, read_dsn=[replica], db=str(tmp_path / "src")))
    assert main(["export", "--db", str(tmp_path / "src"), "--read-dsn", replica, "-o", "-"]) != 0
    with pytest.raises(InvalidInputError, match="read_dsn"):
        ReflectiveMemory(tmp_path / "src", read_dsn=replica)
    with pytest.raises(InvalidInputError, match="read_dsn"):
        PostgresStore(primary, read_dsn=["not-a-uri"])


def test_bench_replicas_small_run(pg_replicated, tmp_path) -> None:
    """`bench replicas` on the test servers: throughput with 0 and 1 replica, and the
    write-then-read pairs (the failover part starts servers of its own: run by hand)."""
    from reflective_bench.replicas import run_replicas_bench
    from reflective_memory.cli import build_parser

    primary, replica = pg_replicated
    args = build_parser().parse_args(
        ["bench", "replicas", "--dsn", primary, "--read-dsn", replica, "--parts", "throughput",
         "ryw", "--users", "3", "--turns", "10", "--clients", "2", "--seconds", "0.3",
         "--rounds", "1", "--pairs", "20", "--writers", "2", "--out", str(tmp_path / "r.json")]
    )  # fmt: skip
    res = run_replicas_bench(args)
    assert res["throughput"]["0_replicas"]["calls"] > 0
    one = res["throughput"]["1_replicas"]
    assert one["calls"] > 0 and one["reads_by"].get("replica", 0) > 0.5, one
    ryw = res["ryw"]["on_replica"]
    assert ryw["pairs"] == 20 and ryw.get("misses", 0) == 0 and ryw["reads_replica"] > 0, ryw
    assert (tmp_path / "r.json").exists()


@pytest.fixture
def paused_primary() -> Iterator[tuple[_pg.Cluster, _pg.Cluster]]:
    """A fresh primary and its synchronous standby, for a test that kills the primary."""
    reason = _pg.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    primary = _pg.Cluster().start()
    standby = None
    try:
        standby = primary.standby(sync=True)
        yield primary, standby
    finally:
        for c in (standby, primary):
            if c is not None:
                c.stop()


def test_a_killed_primary_loses_no_acknowledged_turn_and_writing_goes_on(paused_primary) -> None:
    """Three threads write turns; the primary is SIGKILLed mid-load and its synchronous standby
    promoted. The same process keeps writing through the multi-host URI (typed
    `StoreUnavailableError` during the switch, each write retried with its `turn_id`), and
    every acknowledged turn is on the new primary, once."""
    primary, standby = paused_primary
    name = "failover"
    primary.create_database(name)
    standby.wait_caught_up(primary)
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    dsn = f"postgresql://postgres@{hosts}/{name}?target_session_attrs=read-write&connect_timeout=2"
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()
    store = PostgresStore(dsn, pool_max=6, timeout=10)
    mem = ReflectiveMemory(store=store, embedder=HashingEmbedder(), config=TURNS)

    def writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            turn_id = f"w{w}-{i}"
            while True:  # a retry sends the same turn_id: it lands once
                try:
                    mem.add_turn("ana", f"s{w}", "user", f"fact {turn_id}", turn_id=turn_id)
                    break
                except StoreUnavailableError as exc:
                    with lock:
                        errors.append(exc)
                    time.sleep(0.05)
            with lock:
                acked.append(turn_id)
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        before = len(acked)
        primary.kill()
        standby.promote()
        promoted = len(acked)
        deadline = time.time() + 30
        while len(acked) < promoted + 30 and time.time() < deadline:
            time.sleep(0.1)
        after_promotion = len(acked)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    mem.close()
    assert before > 10 and after_promotion >= promoted + 30  # writing went on
    assert all(isinstance(e, StoreUnavailableError) for e in errors)
    survivor = PostgresStore(standby.dsn_for(name), create=False)
    try:
        stored = [t.turn_id for t in survivor.turns("ana")]
        assert len(stored) == len(set(stored))  # no turn twice
        lost = set(acked) - set(stored)
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged turns lost: {sorted(lost)[:5]}"
        first = acked[0]  # "w<writer>-<i>", in session "s<writer>"
        other = {"user_id": "ana", "session_id": f"s{first[1:].split('-')[0]}", "role": "user"}
        with pytest.raises(InvalidInputError, match="already exists"):  # a different turn
            survivor.add_turns([{**other, "text": "another text", "turn_id": first}])
    finally:
        survivor.close()


class _paused:
    """Pause WAL replay on a standby for the block (`pg_wal_replay_pause()`)."""

    def __init__(self, replica_dsn: str) -> None:
        self.dsn = replica_dsn

    def _call(self, fn: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"SELECT {fn}()")

    def __enter__(self) -> _paused:
        self._call("pg_wal_replay_pause")
        return self

    def __exit__(self, *exc: object) -> None:
        self._call("pg_wal_replay_resume")
