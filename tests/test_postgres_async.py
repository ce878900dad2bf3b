"""Native async on PostgreSQL: the `a*` methods await psycopg's async pool, with no thread hop.

Runs against the throwaway cluster of `conftest.pg_cluster` (skipped without PostgreSQL +
pgvector locally, failed in CI where REFLECTIVE_REQUIRE_POSTGRES=1).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.storage.bridge import TaskLock, await_io, run_bridged

FACTS = [
    "My dog Pixel loves the beach at Cascais.",
    "I work as a nurse at the Lisbon children's hospital.",
    "My sister Marta plays the violin in an orchestra.",
    "I am allergic to peanuts, so no satay for me.",
    "We went sailing near Tokyo bay last summer.",
    "Chess on Sundays with my brother is a tradition.",
]
QUERIES = ["what is my dog called", "where do I work", "who plays the violin", "what allergy"]


def _mem(dsn: str, schema: str, embedder: Any = None, **kw: Any) -> ReflectiveMemory:
    from reflective_memory.storage.postgres import PostgresStore

    return ReflectiveMemory(
        store=PostgresStore(dsn, schema=schema, pool_max=6),
        embedder=HashingEmbedder(64) if embedder is None else embedder,
        config=MemoryConfig(units={"granularities": ("turn", "session")}).replace(**kw),
    )


def _hits(retrieval: Any) -> list[tuple[str, tuple[str, ...], str]]:
    return [(h.memory.id, h.memory.turn_ids, h.memory.text) for h in retrieval.hits]


#: What may run in a worker thread during a native async call: the embedding model (issue 41).
MODEL_CALLS = {"_embed_queries", "_embed_batches"}


def _forbid_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every way to hop to a thread fail during the test, except the model thread.

    Returns:
        The names of the functions run in the model thread (filled as they run).
    """
    from reflective_memory.embed import _model_executor

    hops: list[str] = []
    real = asyncio.BaseEventLoop.run_in_executor

    def no_thread(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a thread hop during native async I/O")

    def model_only(loop: Any, executor: Any, call: Any, *args: Any) -> Any:
        if executor is not _model_executor():
            raise AssertionError(f"a thread hop during native async I/O: {call}")
        hops.append(call.args[0].__name__)  # partial(context.run, fn, ...)
        return real(loop, executor, call, *args)

    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", model_only)
    return hops


def test_async_twins_equal_the_sync_calls(pg_dsn: str) -> None:
    schema = pg_schema()

    async def main() -> None:
        async with _mem(pg_dsn, schema) as mem:
            sync = _mem(pg_dsn, schema)
            try:
                turns = [
                    {"user_id": "ana", "session_id": "s1", "role": "user", "text": t}
                    for t in FACTS[:3]
                ]
                stored = await mem.aadd_turns(turns)
                one = await mem.aadd_turn("ana", "s1", "user", FACTS[3], turn_id="t-4")
                assert [t.turn_id for t in stored] == ["s1:0", "s1:1", "s1:2"]
                assert one.turn_id == "t-4"
                assert await mem.aturns("ana") == sync.turns("ana")
                for q in QUERIES:  # open session: turn units only
                    assert _hits(await mem.aretrieve("ana", q, k=3)) == _hits(
                        sync.retrieve("ana", q, k=3)
                    )
                built = await mem.aend_session("ana", "s1")
                assert {m.granularity for m in built} == {"turn", "session"}
                assert [m.id for m in built] == [m.id for m in sync.memories("ana")]
                for q in QUERIES:
                    for kw in ({"k": 2}, {"budget_tokens": 60}, {"mode": "lexical", "k": 3}):
                        a = await mem.aretrieve("ana", q, **kw)
                        assert _hits(a) == _hits(sync.retrieve("ana", q, **kw)), (q, kw)
                assert await mem.aturns("nobody") == []
            finally:
                sync.close()

    asyncio.run(main())


def test_no_thread_hop_on_postgres(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pg_schema()
    with _mem(pg_dsn, schema) as mem:
        for i, t in enumerate(FACTS):
            mem.add_turn("ben", "s1", "user", t, turn_id=f"b{i}")
        expected = _hits(mem.retrieve("ben", "who plays the violin", k=3))

    async def main() -> None:
        async with _mem(pg_dsn, schema) as amem:
            await amem.aturns("ben")  # opens this loop's pool (connecting is not the point)
            hops = _forbid_threads(monkeypatch)
            assert _hits(await amem.aretrieve("ben", "who plays the violin", k=3)) == expected
            assert hops == ["_embed_queries"]  # the model, off the loop; no I/O in a thread
            await amem.aadd_turn("ben", "s2", "user", "I moved to Berlin.")
            assert len(await amem.aend_session("ben", "s2")) == 2
            got = await amem.aretrieve("ben", "where did I move", k=1)
            assert got.hits[0].memory.session_id == "s2"
            assert set(hops) == MODEL_CALLS


class SlowQueries(HashingEmbedder):
    """A model whose query embedding holds the CPU (blocks its thread) for `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(64)
        self.seconds = seconds

    def encode_query(self, texts: Any) -> Any:
        time.sleep(self.seconds)
        return self.encode(texts)


def test_the_loop_stays_free_while_the_model_embeds(pg_dsn: str) -> None:
    """Issue 41: a 300 ms query embedding does not hold up the other coroutines of the loop."""
    schema = pg_schema()
    with _mem(pg_dsn, schema) as mem:
        for i, t in enumerate(FACTS):
            mem.add_turn("ben", "s1", "user", t, turn_id=f"b{i}")

    async def main() -> float:
        async with _mem(pg_dsn, schema, embedder=SlowQueries(0.3)) as amem:
            await amem.aturns("ben")
            lag = 0.0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal lag
                while not done.is_set():
                    t0 = time.perf_counter()
                    await asyncio.sleep(0.01)
                    lag = max(lag, time.perf_counter() - t0 - 0.01)

            tick = asyncio.create_task(ticker())
            got = await asyncio.gather(*(amem.aretrieve("ben", "violin", k=2) for _ in range(3)))
            done.set()
            await tick
            assert all(r.hits for r in got)
            return lag

    assert asyncio.run(main()) < 0.15  # the embedding on the loop: >= 0.3 s

    asyncio.run(main())


class Boom(RuntimeError):
    """The error `FailingQueries` raises."""


class FailingQueries(SlowQueries):
    """A slow query model that cannot embed any query containing "boom"."""

    def encode_query(self, texts: Any) -> Any:
        if any("boom" in t for t in ([texts] if isinstance(texts, str) else texts)):
            time.sleep(self.seconds)
            raise Boom(f"cannot embed {texts!r}")
        return super().encode_query(texts)


async def _all_returned(mem: ReflectiveMemory) -> bool:
    """Whether every connection of the loop's pool is back in it (within 5 s: a connection
    the pool grew by may still be connecting)."""
    pool = mem.store.db.async_route._pools[asyncio.get_running_loop()]  # type: ignore[attr-defined]
    for _ in range(100):
        stats = pool.get_stats()
        if stats["pool_available"] == stats["pool_size"]:
            return True
        await asyncio.sleep(0.05)
    return False


def _loaded(dsn: str) -> str:
    schema = pg_schema()
    with _mem(dsn, schema) as mem:
        for i, t in enumerate(FACTS):
            mem.add_turn("ben", "s1", "user", t, turn_id=f"b{i}")
    return schema


def test_concurrent_aretrieve_embed_their_queries_in_batches(pg_dsn: str) -> None:
    """Issue 41: queries that wait for the model are embedded together, with the same hits."""
    schema = _loaded(pg_dsn)
    queries = [f"{q} please ({i})" for i, q in enumerate(QUERIES * 4)]
    with _mem(pg_dsn, schema) as mem:
        expected = [_hits(mem.retrieve("ben", q, k=3)) for q in queries]

    async def main() -> tuple[list[Any], dict[str, int]]:
        async with _mem(pg_dsn, schema, embedder=SlowQueries(0.1)) as amem:
            got = await asyncio.gather(*(amem.aretrieve("ben", q, k=3) for q in queries))
            return [_hits(r) for r in got], dict(amem.retriever.query.batcher.counts)

    got, counts = asyncio.run(main())
    assert got == expected  # each call got its own query's vector
    assert counts["queries"] == len(queries) and counts["calls"] < len(queries)


def test_a_failing_query_embedding_fails_only_its_own_aretrieve(pg_dsn: str) -> None:
    schema = _loaded(pg_dsn)
    queries = [*QUERIES, "boom", *QUERIES]
    with _mem(pg_dsn, schema) as mem:
        expected = [_hits(mem.retrieve("ben", q, k=3)) for q in QUERIES]

    async def main() -> list[Any]:
        async with _mem(pg_dsn, schema, embedder=FailingQueries(0.05)) as amem:
            got = await asyncio.gather(
                *(amem.aretrieve("ben", q, k=3) for q in queries), return_exceptions=True
            )
            assert await _all_returned(amem)
            assert amem.retriever.query.batcher.counts["calls"] < len(queries) + 8
            return got

    got = asyncio.run(main())
    from reflective_memory.errors import EmbeddingError

    assert isinstance(got[4], EmbeddingError) and isinstance(got[4].__cause__, Boom)
    assert [_hits(r) for r in got[:4]] == expected and [_hits(r) for r in got[5:]] == expected


def test_cancelling_an_aretrieve_that_waits_for_the_model_leaves_the_others(pg_dsn: str) -> None:
    schema = _loaded(pg_dsn)
    with _mem(pg_dsn, schema) as mem:
        expected = [_hits(mem.retrieve("ben", q, k=3)) for q in QUERIES]

    async def main() -> list[Any]:
        async with _mem(pg_dsn, schema, embedder=SlowQueries(0.2)) as amem:
            batcher = amem.retriever.query.batcher
            first = asyncio.create_task(amem.aretrieve("ben", "violin", k=1))
            while batcher.counts["calls"] == 0:  # the first query holds the model thread
                await asyncio.sleep(0.005)
            tasks = [asyncio.create_task(amem.aretrieve("ben", q, k=3)) for q in QUERIES]
            victim = asyncio.create_task(amem.aretrieve("ben", "where do I work", k=3))
            await asyncio.sleep(0.05)  # they all wait for the model now
            victim.cancel()
            got = await asyncio.gather(*tasks)
            with pytest.raises(asyncio.CancelledError):
                await victim
            assert (await first).hits
            assert await _all_returned(amem)
            assert batcher.counts["queries"] == 1 + len(QUERIES)  # the victim's never ran
            return [_hits(r) for r in got]

    assert asyncio.run(main()) == expected


def test_aclose_ends_the_query_batches_and_leaves_no_thread(pg_dsn: str) -> None:
    import threading

    schema = _loaded(pg_dsn)

    async def main() -> None:
        amem = _mem(pg_dsn, schema, embedder=SlowQueries(0.01))
        got = await asyncio.gather(*(amem.aretrieve("ben", q, k=2) for q in QUERIES * 3))
        assert all(r.hits for r in got)
        await amem.aclose()
        assert not amem.retriever.query.batcher._lanes  # this loop's queue is gone

    asyncio.run(main())
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        asyncio.run(main())
    assert {t.ident for t in threading.enumerate()} == before


def test_concurrent_calls_on_one_loop_stay_isolated(pg_dsn: str) -> None:
    schema = pg_schema()
    users = [f"u{i}" for i in range(8)]

    async def writer(mem: ReflectiveMemory, user: str) -> None:
        for j, fact in enumerate(FACTS):
            await mem.aadd_turn(user, "s1", "user", f"{fact} ({user} #{j})")

    async def reader(mem: ReflectiveMemory, user: str, q: str) -> list[Any]:
        return _hits(await mem.aretrieve(user, q, k=4))

    async def main() -> dict[tuple[str, str], list[Any]]:
        async with _mem(pg_dsn, schema) as mem:
            await asyncio.gather(*(writer(mem, u) for u in users))
            jobs = [(u, q) for u in users for q in QUERIES] * 2
            got = await asyncio.gather(*(reader(mem, u, q) for u, q in jobs))
            for (u, _q), hits in zip(jobs, got, strict=True):
                assert hits and all(f"({u} #" in text for _i, _t, text in hits)
            return dict(zip(jobs, got, strict=False))

    got = asyncio.run(main())
    with _mem(pg_dsn, schema) as mem:
        for u in users:
            turns = mem.turns(u)
            assert [t.turn_id for t in turns] == [f"s1:{j}" for j in range(len(FACTS))]
            for q in QUERIES:
                assert got[(u, q)] == _hits(mem.retrieve(u, q, k=4))


def test_a_second_event_loop_gets_its_own_pool(pg_dsn: str) -> None:
    schema = pg_schema()
    mem = _mem(pg_dsn, schema)
    try:
        asyncio.run(mem.aadd_turn("cy", "s1", "user", FACTS[0]))
        got = asyncio.run(mem.aretrieve("cy", "dog", k=1))  # the first loop is gone
        assert got.hits[0].memory.turn_ids == ("s1:0",)
    finally:
        mem.close()


def test_task_lock_lets_other_bridged_calls_run() -> None:
    lock, order = TaskLock(), []

    def critical(name: str) -> None:
        with lock:
            order.append(f"{name}+")
            await_io(asyncio.sleep(0.01))  # I/O while holding the lock
            order.append(f"{name}-")

    async def main() -> None:
        await asyncio.wait_for(
            asyncio.gather(*(run_bridged(None, critical, n) for n in "abc")), timeout=5
        )

    asyncio.run(main())
    assert order == ["a+", "a-", "b+", "b-", "c+", "c-"]


def test_adapters_async_methods_need_no_thread_on_postgres(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage

    from langchain_reflective import ReflectiveChatMessageHistory

    async def main() -> None:
        async with _mem(pg_dsn, pg_schema()) as mem:
            await mem.aturns("dee")  # opens this loop's pool
            _forbid_threads(monkeypatch)
            history = ReflectiveChatMessageHistory(memory=mem, user_id="dee", session_id="s1")
            await history.aadd_messages([HumanMessage("My cat is Miso."), AIMessage("Noted!")])
            assert [m.text for m in await history.aget_messages()] == ["My cat is Miso.", "Noted!"]
            assert len(await history.aend_session()) == 3
            await history.aclear()
            assert await history.aget_messages() == []

    asyncio.run(main())


def test_sqlite_twins_run_in_threads_and_equal_the_sync_calls(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with ReflectiveMemory(tmp_path / "m", embedder=HashingEmbedder(64)) as mem:
            await mem.aadd_turns(
                [{"user_id": "eve", "session_id": "s1", "role": "user", "text": t} for t in FACTS]
            )
            await mem.aend_session("eve", "s1")
            for q in QUERIES:
                assert _hits(await mem.aretrieve("eve", q, k=3)) == _hits(
                    mem.retrieve("eve", q, k=3)
                )
            hops = []
            real = asyncio.to_thread

            async def counted(fn: Any, *a: Any, **k: Any) -> Any:
                hops.append(fn)
                return await real(fn, *a, **k)

            monkeypatch.setattr(asyncio, "to_thread", counted)
            assert await mem.aturns("eve") == mem.turns("eve")
            assert len(hops) == 1

    asyncio.run(main())


def test_bench_async_small_run(pg_dsn: str, tmp_path: Any) -> None:
    from reflective_bench.async_pg import run_async_bench
    from reflective_memory.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "async", "--dsn", pg_dsn, "--users", "4", "--turns", "10",
         "--concurrency", "8", "--rounds", "2", "--embedder", "hashing",
         "--out", str(tmp_path / "r.json")]
    )  # fmt: skip
    res = run_async_bench(args)
    for mode in ("native", "threads"):
        assert res[mode]["calls"] == 16 and res[mode]["p95_ms"] >= res[mode]["p50_ms"] > 0
    assert res["same_hits"] is True
    assert (tmp_path / "r.json").exists()


def test_cancelled_calls_give_their_connections_back(pg_dsn: str) -> None:
    from reflective_memory.errors import StoreClosedError

    async def main() -> None:
        mem = _mem(pg_dsn, pg_schema())
        for i, t in enumerate(FACTS):
            await mem.aadd_turn("fay", "s1", "user", t, turn_id=f"f{i}")
        tasks = [asyncio.create_task(mem.aretrieve("fay", q, k=2)) for q in QUERIES * 4]
        await asyncio.sleep(0.005)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        got = await asyncio.wait_for(mem.aretrieve("fay", "violin", k=1), timeout=30)
        assert got.hits[0].memory.turn_ids == ("f2",)
        pool = mem.store.db.async_route._pools[asyncio.get_running_loop()]
        stats = pool.get_stats()
        assert stats["pool_available"] == stats["pool_size"]  # none left checked out
        await mem.aclose()
        with pytest.raises(StoreClosedError):
            await mem.aretrieve("fay", "violin")
        assert not mem.store.db.async_route._pools  # no pool opened for a closed store

    asyncio.run(main())


def test_many_concurrent_session_builds_share_a_small_pool(pg_dsn: str) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    async def main() -> None:
        store = PostgresStore(pg_dsn, schema=pg_schema(), pool_max=4, timeout=10)
        async with ReflectiveMemory(store=store, embedder=HashingEmbedder(64)) as mem:
            users = [f"g{i}" for i in range(24)]
            await asyncio.gather(
                *(mem.aadd_turn(u, "s1", "user", f"{u} likes chess") for u in users)
            )
            built = await asyncio.wait_for(
                asyncio.gather(*(mem.aend_session(u, "s1") for u in users)), timeout=60
            )  # each build holds two connections: unbounded, 24 of them would starve the pool
            assert [[m.user_id for m in b] for b in built] == [[u, u] for u in users]

    asyncio.run(main())
