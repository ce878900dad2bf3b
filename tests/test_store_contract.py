"""Our stores run the shipped store contract (`reflective_memory.testing.MemoryStoreContract`).

Each backend has one class with a `store` fixture giving an empty store: SQLite in memory,
SQLite on disk, PostgreSQL (a fresh schema per test in the module's database; skipped without a
local PostgreSQL + pgvector, failed with REFLECTIVE_REQUIRE_POSTGRES=1). `OurStores` adds the
tests of what our two stores offer beyond the contract; the capability protocols are checked
for each.
"""

from __future__ import annotations

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


class OurStores:
    """Beyond the contract: what `SQLiteStore` and `PostgresStore` both offer."""

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
