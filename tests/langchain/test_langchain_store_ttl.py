"""TTL of the LangGraph `ReflectiveStore`, on SQLite (on disk) and on PostgreSQL.

The installed `langgraph` ships no reusable store test cases, so LangGraph's own TTL cases
(`libs/checkpoint-sqlite/tests/test_ttl.py` and the TTL tests of
`libs/checkpoint-postgres/tests/test_store.py`) are restated here with the same assertions,
plus what is ours: a refresh is a metadata-only write, a sweep deletes from every file.

Time is a `Clock` given to the store (moved forward by the tests), so expiry is exact and the
tests are fast; one test uses the real clock with a TTL of a fraction of a second, and the
sweeper test runs the real thread with an interval of 50 ms.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from langgraph.store.base import PutOp
from pg_cluster import pg_schema
from reflective_memory import (
    ConfigError,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)

from langchain_reflective import ReflectiveStore

MINUTE = 60.0
NS = ("ana", "notes")


class Clock:
    """A settable clock in epoch seconds."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CountingEmbedder(HashingEmbedder):
    """`HashingEmbedder` that records every text it embeds."""

    def __init__(self) -> None:
        super().__init__(64)
        self.texts: list[str] = []

    def encode(self, texts: str | list[str]) -> np.ndarray:
        self.texts.extend([texts] if isinstance(texts, str) else texts)
        return super().encode(texts)


@pytest.fixture(params=["sqlite", "postgres"])
def core(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReflectiveMemory]:
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    if request.param == "sqlite":
        with ReflectiveMemory(tmp_path / "db", embedder=CountingEmbedder(), config=cfg) as m:
            yield m
        return
    from reflective_memory.storage.postgres import PostgresStore

    dsn = request.getfixturevalue("pg_dsn")
    store = PostgresStore(dsn, schema=pg_schema(), pool_max=4)
    with ReflectiveMemory(store=store, embedder=CountingEmbedder(), config=cfg) as m:
        yield m


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _store(core: ReflectiveMemory, clock: Clock, **ttl_config) -> ReflectiveStore:
    return ReflectiveStore(memory=core, clock=clock, ttl_config=ttl_config or None)


def _expires_at(store: ReflectiveStore, ns: tuple[str, ...], key: str) -> float:
    user = store.user_of(ns)
    return store.memory.get_memory(user, store.memory_id(ns, key)).metadata["expires_at"]


def _stored(store: ReflectiveStore, ns: tuple[str, ...], key: str) -> bool:
    """Whether the item is still a memory of its user (expired or not)."""
    mid = store.memory_id(ns, key)
    return any(m.id == mid for m in store.memory.memories(store.user_of(ns)))


def test_expired_items_are_never_read_even_before_a_sweep(core, clock) -> None:
    store = _store(core, clock)
    assert store.supports_ttl is True
    gone, kept = ("ana", "expired"), ("ana", "control")
    store.put(gone, "e", {"data": "apple pie"}, ttl=1)
    store.put(kept, "c", {"data": "apple juice"}, ttl=None)
    assert store.get(gone, "e").value == {"data": "apple pie"}
    assert [i.key for i in store.search(("ana",), filter={"data": "apple pie"})] == ["e"]
    clock.advance(MINUTE)  # expiry is inclusive: at exactly one minute the item is gone
    assert _stored(store, gone, "e")  # unswept
    assert store.get(gone, "e") is None
    assert store.get(kept, "c") is not None
    assert store.search(gone) == [] and store.search(gone, query="apple") == []
    assert [i.key for i in store.search(("ana",), query="apple pie")] == ["c"]
    assert store.search(("ana",), filter={"data": "apple pie"}) == []
    assert store.list_namespaces(prefix=("ana",)) == [kept]
    assert store.sweep_ttl() == 1
    assert not _stored(store, gone, "e") and _stored(store, kept, "c")
    assert store.sweep_ttl() == 0


def test_refresh_on_read_extends_expiry_without_reembedding(core, clock) -> None:
    store = _store(core, clock, default_ttl=1.0, refresh_on_read=True)
    store.put(NS, "k", {"text": "my sister lives in Porto"})
    assert store.search(NS, query="sister")[0].key == "k"  # the user's index is built
    version, index = core.store.version("ana"), core.indexes.get("ana")
    embedded = list(core.embedder.texts)
    updated = store.get(NS, "k", refresh_ttl=False).updated_at
    clock.advance(50)
    assert store.get(NS, "k") is not None  # refreshes: now expires 60 s from here
    assert _expires_at(store, NS, "k") == clock.now + MINUTE
    clock.advance(50)  # 100 s after the put: alive only thanks to the refresh
    assert store.sweep_ttl() == 0
    assert store.search(NS, query="Porto", refresh_ttl=True)[0].key == "k"
    clock.advance(50)
    item = store.get(NS, "k", refresh_ttl=False)
    assert item is not None and item.updated_at == updated
    # Metadata-only writes: same version, same cached index, only the queries were embedded.
    assert core.store.version("ana") == version and core.indexes.get("ana") is index
    assert core.embedder.texts[len(embedded) :] == ["Porto"]
    clock.advance(15)  # 65 s since the last refreshing read
    assert store.search(NS, query="Porto", refresh_ttl=False) == []
    assert store.get(NS, "k") is None
    assert store.sweep_ttl() == 1


def test_refresh_on_read_off_in_the_config(core, clock) -> None:
    store = _store(core, clock, default_ttl=1.0, refresh_on_read=False)
    store.put(NS, "k", {"v": 1})
    clock.advance(40)
    assert store.get(NS, "k") is not None and store.search(NS) != []  # no refresh
    clock.advance(25)
    assert store.get(NS, "k") is None
    store.put(NS, "k", {"v": 2})
    clock.advance(40)
    assert store.get(NS, "k", refresh_ttl=True) is not None  # asked for explicitly
    clock.advance(40)
    assert store.get(NS, "k").value == {"v": 2}


def test_item_ttl_overrides_the_default(core, clock) -> None:
    store = _store(core, clock, default_ttl=5.0)
    store.put(NS, "short", {"v": "override"}, ttl=1.0)  # one minute
    store.put(NS, "default", {"v": "default"})
    store.put(NS, "never", {"v": "permanent"}, ttl=None)
    store.batch([PutOp(NS, "op", {"v": "from a PutOp"}, ttl=2.0)])
    store.batch([PutOp(NS, "op-plain", {"v": "PutOp without ttl"})])  # ops carry no default
    clock.advance(2 * MINUTE + 1)
    assert store.sweep_ttl() == 2
    keys = ("short", "default", "never", "op", "op-plain")
    assert [store.get(NS, k, refresh_ttl=False) is None for k in keys] == [
        True,
        False,
        False,
        True,
        False,
    ]
    clock.advance(4 * MINUTE)
    assert store.sweep_ttl() == 1
    assert store.get(NS, "default") is None and store.get(NS, "never") is not None
    assert store.get(NS, "op-plain") is not None


def test_a_put_resets_or_removes_the_expiry(core, clock) -> None:
    store = _store(core, clock, default_ttl=1.0)
    store.put(NS, "k", {"v": 1})
    clock.advance(50)
    store.put(NS, "k", {"v": 2})  # rewritten: a fresh minute
    clock.advance(50)
    assert store.get(NS, "k", refresh_ttl=False).value == {"v": 2}
    store.put(NS, "k", {"v": 3}, ttl=None)  # rewritten without a TTL: never expires
    clock.advance(10 * MINUTE)
    assert store.sweep_ttl() == 0 and store.get(NS, "k").value == {"v": 3}


def test_refresh_never_resurrects_an_expired_item(core, clock) -> None:
    store = _store(core, clock)
    store.put(NS, "expired", {"n": 0}, ttl=1)
    clock.advance(2 * MINUTE)
    store.put(NS, "live_get", {"n": 1}, ttl=1)
    store.put(NS, "live_search", {"n": 2}, ttl=1)
    before = {k: _expires_at(store, NS, k) for k in ("expired", "live_get", "live_search")}
    clock.advance(30)
    assert store.get(NS, "expired", refresh_ttl=True) is None
    assert "expired" not in [i.key for i in store.search(NS, refresh_ttl=True)]
    assert _expires_at(store, NS, "expired") == before["expired"]
    assert store.get(NS, "live_get", refresh_ttl=True) is not None
    assert _expires_at(store, NS, "live_get") == before["live_get"] + 30
    assert _expires_at(store, NS, "live_search") == before["live_search"] + 30


def test_search_pages_leave_expired_items_out_before_paging(core, clock) -> None:
    store = _store(core, clock)
    for key in ("c", "b", "expired", "a"):  # listed most recently updated first: a, expired, b, c
        store.put(NS, key, {"k": key}, ttl=1 if key == "expired" else None)
    assert [i.key for i in store.search(NS, limit=2)] == ["a", "expired"]
    clock.advance(2 * MINUTE)
    assert [i.key for i in store.search(NS, limit=2, offset=0)] == ["a", "b"]
    assert [i.key for i in store.search(NS, limit=2, offset=2)] == ["c"]


def test_sweep_covers_every_user_and_leaves_other_memories(core, clock) -> None:
    core.add_turn("ana", "s1", "user", "I keep bees on the roof.")
    core.end_session("ana", "s1")
    store = _store(core, clock)
    for user in ("ana", "bob"):
        store.put((user, "tmp"), "k", {"v": user}, ttl=1)
    fixed = ReflectiveStore(memory=core, user_id="cy", clock=clock)
    fixed.put(("tmp",), "k", {"v": "cy"}, ttl=1)
    clock.advance(2 * MINUTE)
    assert fixed.sweep_ttl() == 1  # a store serving one user sweeps that user
    assert store.sweep_ttl() == 2
    assert [m.granularity for m in core.memories("ana")] == ["turn"]
    assert core.memories("bob") == [] and core.memories("cy") == []


def test_sweeper_thread_deletes_expired_items(core, clock) -> None:
    store = _store(core, clock, default_ttl=1.0, sweep_interval_minutes=0.05 / 60)
    assert store.stop_ttl_sweeper() is True  # not running: nothing to stop
    done = store.start_ttl_sweeper()
    again = store.start_ttl_sweeper()  # already running: no second thread
    try:
        store.put(NS, "k", {"v": 1})
        store.put(NS, "keep", {"v": 2}, ttl=None)
        time.sleep(0.2)
        assert _stored(store, NS, "k")
        clock.advance(2 * MINUTE)
        deadline = time.monotonic() + 10
        while _stored(store, NS, "k") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _stored(store, NS, "k") and _stored(store, NS, "keep")
    finally:
        assert store.stop_ttl_sweeper(timeout=5) is True
    assert done.result(timeout=1) is None and not again.done()


def test_real_clock_with_a_tiny_ttl(core) -> None:
    store = ReflectiveStore(memory=core, ttl_config={"default_ttl": 0.4 / 60})
    store.put(NS, "k", {"v": 1})
    assert store.get(NS, "k", refresh_ttl=False) is not None
    time.sleep(0.6)
    assert store.get(NS, "k") is None and store.search(NS) == []
    assert store.sweep_ttl() == 1


async def test_async_twins(core, clock) -> None:
    store = _store(core, clock, default_ttl=1.0)
    await store.aput(NS, "k", {"text": "apple"})
    await store.aput(NS, "j", {"text": "banana"})
    clock.advance(45)
    assert [i.key for i in await store.asearch(NS, filter={"text": "apple"})] == ["k"]
    clock.advance(45)  # only the searched item was refreshed
    assert await store.aget(NS, "k", refresh_ttl=False) is not None
    assert await store.aget(NS, "j") is None
    assert await store.asweep_ttl() == 1


def test_sweep_deletes_from_every_file(tmp_path: Path, clock) -> None:
    directory = tmp_path / "db"
    with ReflectiveMemory(directory, embedder=HashingEmbedder(64)) as core:
        store = _store(core, clock)
        store.put(NS, "secret", {"text": "the safe code is zebra-4417"}, ttl=1)
        store.put(NS, "other", {"text": "the safe is in the attic"})
        store.put(NS, "deleted", {"text": "my pin is walrus-9931"})
        assert store.search(NS, query="safe code")[0].key == "secret"  # index files written
        assert store.search(NS, query="pin")[0].key == "deleted"
        blob = b"".join(f.read_bytes() for f in directory.rglob("*") if f.is_file())
        assert b"zebra-4417" in blob and b"walrus-9931" in blob
        clock.advance(2 * MINUTE)
        assert store.sweep_ttl() == 1
        store.delete(NS, "deleted")
        for needle in (b"zebra-4417", b"walrus-9931"):
            assert [
                f for f in directory.rglob("*") if f.is_file() and needle in f.read_bytes()
            ] == []
        assert [i.key for i in store.search(NS, query="safe")] == ["other"]


def test_bad_ttl_settings_are_refused(clock) -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(64)) as core:
        for bad in (
            {"default_ttl": 0},
            {"default_ttl": "1"},
            {"sweep_interval_minutes": -1},
            {"refresh_on_read": "yes"},
            {"omit_expired": False},
            {"ttl_minutes": 1},
        ):
            with pytest.raises(ConfigError):
                ReflectiveStore(memory=core, ttl_config=bad)
        with pytest.raises(ConfigError):
            ReflectiveStore(memory=core, ttl_config=[("default_ttl", 1)])  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            ReflectiveStore(memory=core, clock=1.0)  # type: ignore[arg-type]
        store = ReflectiveStore(memory=core, ttl_config={"omit_expired": True}, clock=clock)
        with pytest.raises(InvalidInputError):
            store.start_ttl_sweeper(0)
        assert store.ttl_config == {"omit_expired": True} and store.stop_ttl_sweeper()


def test_sweeper_stops_when_the_memory_closes(clock) -> None:
    core = ReflectiveMemory(embedder=HashingEmbedder(64))
    store = _store(core, clock, sweep_interval_minutes=0.02 / 60)
    done = store.start_ttl_sweeper()
    core.close()
    assert done.result(timeout=5) is None  # the next sweep finds the memory closed
    assert store.stop_ttl_sweeper(timeout=1) is True
