"""State stores run the shipped contract (`reflective_memory.testing.StateStoreContract`).

`FileStateStore` on disk and in memory, and PostgreSQL's `DatabaseStateStore` (skipped without
a local PostgreSQL + pgvector, failed with REFLECTIVE_REQUIRE_POSTGRES=1). The file store's own
promises follow: it survives a reopen, its file names never contain an id, a damaged file reads
as no state, writes leave no temporary files, and processes sharing a directory lose no update.
"""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import pytest
from pg_cluster import pg_schema
from reflective_memory.storage.state import FileStateStore
from reflective_memory.testing import StateStoreContract


class TestFileStateStoreOnDisk(StateStoreContract):
    @pytest.fixture
    def state_store(self, tmp_path):
        return FileStateStore(tmp_path / "state")


class TestFileStateStoreInMemory(StateStoreContract):
    @pytest.fixture
    def state_store(self):
        return FileStateStore(None)


class TestDatabaseStateStore(StateStoreContract):
    @pytest.fixture
    def state_store(self, pg_dsn):
        from reflective_memory.storage.postgres import PostgresStore

        store = PostgresStore(pg_dsn, schema=pg_schema(), pool_max=6)
        yield store.state
        store.close()


def _put(data: bytes):
    return lambda _version, _old: data


def test_state_survives_a_reopen_and_versions_keep_rising(tmp_path: Path) -> None:
    a = FileStateStore(tmp_path)
    v1, _ = a.update("alice", "rmm.reranker", _put(b"weights"))
    a.delete("alice", "rmm.reranker")
    b = FileStateStore(tmp_path)
    assert b.get("alice", "rmm.reranker") is None
    v2, _ = b.update("alice", "rmm.reranker", _put(b"new"))
    c = FileStateStore(tmp_path)
    assert c.get("alice", "rmm.reranker") == (v2, b"new") and v2 > v1
    assert c.names("alice") == ["rmm.reranker"]


def test_files_are_named_by_hashes_and_stay_inside_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = FileStateStore(root)
    for owner in ("../../escape", "/etc/passwd", "alice"):
        store.update(owner, "../../x", _put(b"secret"))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(root in p.parents for p in files)
    assert not any("alice" in str(p) or "escape" in str(p) or "passwd" in str(p) for p in files)
    assert store.delete_owner("alice") == 1
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == sorted(
        {p.parent.name for p in root.rglob("*.state")}
    )


def test_a_damaged_file_reads_as_no_state(tmp_path: Path, caplog) -> None:
    store = FileStateStore(tmp_path)
    store.update("u", "w", _put(b"good data"))
    (path,) = tmp_path.rglob("*.state")
    raw = path.read_bytes()
    path.write_bytes(raw[:-3] + b"bad")
    with caplog.at_level(logging.WARNING):
        assert store.get("u", "w") is None
    assert "damaged" in caplog.text
    path.write_bytes(b"garbage")
    assert store.get("u", "w") is None and store.version("u", "w") == 0
    v, _ = store.update("u", "w", _put(b"fresh"))
    assert store.get("u", "w") == (v, b"fresh")


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    for i in range(5):
        store.update("u", "w", _put(bytes([i]) * 1000))

    def boom(version: int, data: bytes | None) -> bytes:
        raise RuntimeError("fail")

    with pytest.raises(RuntimeError):
        store.update("u", "w", boom)
    assert not list(tmp_path.rglob("*.tmp"))
    assert len(list(tmp_path.rglob("*.state"))) == 1


def _count_up(directory: str, n: int) -> None:
    store = FileStateStore(directory)
    for _ in range(n):
        store.update("u", "counter", lambda _v, d: str(int(d or b"0") + 1).encode())


def test_processes_sharing_a_directory_lose_no_update(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_count_up, args=(str(tmp_path), 20)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert FileStateStore(tmp_path).get("u", "counter")[1] == b"60"
