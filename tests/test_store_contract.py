"""Our stores run the shipped store contract (`reflective_memory.testing.MemoryStoreContract`).

Each backend has one class with a `store` fixture giving an empty store: SQLite in memory,
SQLite on disk, PostgreSQL (a fresh schema per test in the module's database; skipped without a
local PostgreSQL + pgvector, failed with REFLECTIVE_REQUIRE_POSTGRES=1), and PostgreSQL reading
from a hot standby (`read_dsn`; the same contract, unchanged). `OurStores` adds the
tests of what our two stores offer beyond the contract; the capability protocols are checked
for each.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, InvalidInputError, ReflectiveMemory
from reflective_memory.storage.base import (
    MemoryDraft,
    MemoryStore,
    ServerSearch,
    SessionBuildLock,
    StateHolder,
)
from reflective_memory.storage.factory import open_store
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.storage.state import StateStore
from reflective_memory.testing import MemoryStoreContract


def _strip_offsets(store) -> None:  # noqa: ANN001
    """Write every stored time as an older version did: ISO text without an offset."""
    columns = {
        "turns": ("ts",),
        "sessions": ("first_ts", "last_ts"),
        "memories": ("start_ts", "end_ts"),
    }
    if isinstance(store, SQLiteStore):
        for table, cols in columns.items():
            for col in cols:
                store.conn.execute(f"UPDATE {table} SET {col} = substr({col}, 1, 19)")
        store.conn.execute("UPDATE sessions SET created_at = substr(created_at, 1, 19)")
        return

    def strip(conn) -> None:  # noqa: ANN001
        for table, cols in columns.items():
            for col in cols:
                conn.execute(f"UPDATE {store._s}.{table} SET {col} = left({col}, 19)")

    store.routes.write(["u"], strip)  # the reads that follow see it, on a replica too


class OurStores:
    """Beyond the contract: what `SQLiteStore` and `PostgresStore` both offer."""

    def test_rows_written_without_an_offset_read_back_as_utc(self, store) -> None:
        """An older version wrote naive times: they come back aware (UTC), never mixed."""
        when = datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc)
        store.add_turns([{"user_id": "u", "session_id": "s", "role": "user", "text": "a",
                          "timestamp": when}])  # fmt: skip
        draft = MemoryDraft("s", "turn", "a", "a", ("s:0",), start_time=when, end_time=when)
        store.upsert_memories("u", [draft], np.ones((1, 3)), "m1")
        _strip_offsets(store)
        (turn,) = store.turns("u")
        assert turn.timestamp == when and turn.timestamp.tzinfo is not None
        info = store.session("u", "s")
        assert (info.first_time, info.last_time) == (when, when) and info.created_at.tzinfo
        (memory,) = store.memories("u")
        assert (memory.start_time, memory.end_time) == (when, when)
        store.add_turns([{"user_id": "u", "session_id": "s", "role": "user", "text": "b",
                          "timestamp": datetime.now(timezone.utc)}])  # fmt: skip
        assert sorted(t.timestamp for t in store.turns("u"))[0] == when

    def test_set_keys_clears_the_embedding_and_bumps_the_version(self, store) -> None:
        d = MemoryDraft("s", "item", "text", "old key", (), id="i1")
        store.upsert_memories("u", [d], np.ones((1, 3)), "m1")
        v = store.version("u")
        store.set_keys("u", ["i1"], ["new key"])
        ids, keys, blobs, models = store.embeddings("u")
        assert keys == ["new key"] and blobs == [None] and store.version("u") > v
        assert store.memories("u")[0].key == "new key"


class TestSQLiteMemory(MemoryStoreContract, OurStores):
    @pytest.fixture
    def store(self):
        s = SQLiteStore(None)
        yield s
        s.close()

    def test_capabilities(self, store) -> None:
        """The embedded store searches in-process, keeps no shared state and needs no lock."""
        assert isinstance(store, MemoryStore)
        assert not isinstance(store, ServerSearch | SessionBuildLock | StateHolder)


class TestSQLiteFile(MemoryStoreContract, OurStores):
    @pytest.fixture
    def store(self, tmp_path):
        s = SQLiteStore(tmp_path / "m.sqlite3")
        yield s
        s.close()


class TestPostgres(MemoryStoreContract, OurStores):
    @pytest.fixture
    def store(self, pg_dsn):
        from reflective_memory.storage.postgres import PostgresStore

        s = PostgresStore(pg_dsn, schema=pg_schema(), pool_max=4)
        yield s
        s.close()

    def test_capabilities(self, store) -> None:
        """The server store offers every optional capability."""
        for capability in (MemoryStore, ServerSearch, SessionBuildLock, StateHolder):
            assert isinstance(store, capability), capability.__name__
        assert isinstance(store.state, StateStore)

    def test_delete_user_deletes_the_users_state(self, store) -> None:
        """The user's learned state goes with `delete_user`; the shared and others' stay."""
        store.add_turns([{"user_id": "u", "session_id": "s", "role": "user", "text": "hi"}])
        for owner in ("u", "v", "__shared__"):
            store.state.update(owner, "rmm.reranker", lambda _v, _d: b"weights")
        store.delete_user("u")
        assert store.state.names("u") == []
        assert store.state.names("v") == ["rmm.reranker"]
        assert store.state.get("__shared__", "rmm.reranker")[1] == b"weights"


class TestPostgresReplica(MemoryStoreContract, OurStores):
    """The same contract with reads on a hot standby (read-your-writes by WAL position)."""

    @pytest.fixture
    def store(self, pg_replicated):
        from reflective_memory.storage.postgres import PostgresStore

        primary, replica = pg_replicated
        s = PostgresStore(primary, read_dsn=replica, schema=pg_schema(), pool_max=4)
        yield s
        s.close()

    def test_reads_are_answered_by_the_replica(self, store) -> None:
        """Right after a write, its reads come from the standby, which has the write."""
        from reflective_memory.storage.reads import reads_of_call

        store.add_turns([{"user_id": "u", "session_id": "s", "role": "user", "text": "hi"}])
        with reads_of_call() as log:
            assert [t.text for t in store.turns("u")] == ["hi"]
            assert store.session("u", "s").n_turns == 1
        (server,) = log.servers
        assert server.startswith("replica ") and log.servers[server] == 2 and not log.notes
        (replica,) = store.routes.replicas
        assert replica.db.dsn_label.endswith(server.rsplit(":", 1)[1])


class _Partial:
    """Most of a store, without `vectors`, `count` or `closed`."""

    def __getattr__(self, name: str):
        if name in ("vectors", "count", "closed") or name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


def test_open_store_names_what_a_store_object_lacks() -> None:
    with pytest.raises(InvalidInputError, match=r"missing closed, count, vectors\)"):
        open_store(_Partial())
    with pytest.raises(InvalidInputError, match="store contract"):
        ReflectiveMemory(store=object(), embedder=HashingEmbedder(16))
    store = SQLiteStore(None)
    assert open_store(store) is store
    store.close()
