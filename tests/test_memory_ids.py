"""A memory id is unique per user on both backends (issue 39, near miss).

PostgreSQL keyed memories by (user, id) while SQLite keyed them by id alone, so a PostgreSQL
store could hold one id for two users and its export failed to import into SQLite ("memory id
... belongs to another user"). Now both key by (user, id): the export imports, and an embedded
store written before is re-keyed once when it opens, rows and order kept.
"""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pytest
from pg_cluster import pg_schema
from portable_data import fill, open_memory, rankings, snapshot
from reflective_memory.cli import main
from reflective_memory.portable import endpoint, export_memory, import_memory
from reflective_memory.storage.sqlite import SQLiteStore

#: The memories table as SQLite stores wrote it before ids were per user.
_OLD_MEMORIES = """
CREATE TABLE memories (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL, session_id TEXT NOT NULL,
    granularity TEXT NOT NULL, text TEXT NOT NULL, key TEXT NOT NULL, turn_ids TEXT NOT NULL,
    start_ts TEXT, end_ts TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    metadata TEXT NOT NULL, embedding BLOB, embed_model TEXT, text_crc INTEGER, key_crc INTEGER
);
CREATE INDEX memories_by_user ON memories (user_id, granularity);
CREATE INDEX memories_by_session ON memories (user_id, session_id);
"""


def _shared_ids(mem) -> None:
    """Two users whose direct memories carry the same ids (as a PostgreSQL store allows)."""
    fill(mem)
    for user in ("user-0", "user-1"):
        mem.put_memory(user, f"{user} keeps a cat.", memory_id="shared-1")
        mem.put_memory(user, f"{user} drinks coffee.", memory_id="shared-2", granularity="note")


def test_a_postgres_export_with_one_id_for_two_users_imports_into_sqlite(tmp_path, pg_dsn):
    from reflective_memory.storage.postgres import PostgresStore

    with open_memory(store=PostgresStore(pg_dsn, schema=pg_schema())) as mem:
        _shared_ids(mem)
        snap, before = snapshot(endpoint(mem)), rankings(mem, mem.users())
        export_memory(mem, tmp_path / "pg.jsonl")
    with open_memory(tmp_path / "dst") as mem:
        import_memory(mem, tmp_path / "pg.jsonl")
        assert snapshot(endpoint(mem)) == snap
        assert rankings(mem, mem.users()) == before
        for user in ("user-0", "user-1"):
            assert mem.get_memory(user, "shared-1").text == f"{user} keeps a cat."
    # the command line into a fresh embedded store
    assert main(["import", "--db", str(tmp_path / "cli"), str(tmp_path / "pg.jsonl")]) == 0
    with open_memory(tmp_path / "cli") as mem:
        assert snapshot(endpoint(mem)) == snap


def test_an_embedded_store_keyed_by_id_alone_is_rekeyed_at_open(tmp_path) -> None:
    with open_memory(tmp_path / "new") as mem:
        fill(mem)
        snap = snapshot(endpoint(mem))
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "new", old)
    db = old / "memory.sqlite3"
    conn = sqlite3.connect(db)
    marks = conn.execute("SELECT user_id, id, rowid FROM memories ORDER BY rowid").fetchall()
    conn.executescript(  # the old table, same rows and rowids
        "ALTER TABLE memories RENAME TO m_copy; DROP INDEX memories_by_user;"
        "DROP INDEX memories_by_session;"
        + _OLD_MEMORIES
        + "INSERT INTO memories (rowid, id, user_id, session_id, granularity, text, key, "
        "turn_ids, start_ts, end_ts, created_at, updated_at, metadata, embedding, embed_model, "
        "text_crc, key_crc) SELECT rowid, id, user_id, session_id, granularity, text, key, "
        "turn_ids, start_ts, end_ts, created_at, updated_at, metadata, embedding, embed_model, "
        "text_crc, key_crc FROM m_copy; DROP TABLE m_copy;"
    )
    conn.close()

    with open_memory(old) as mem:
        assert snapshot(endpoint(mem)) == snap
        mem.put_memory("user-1", "Mine too.", memory_id="item-0")  # user-0's id
        assert mem.get_memory("user-0", "item-0").text == "Likes tea."
    conn = sqlite3.connect(db)
    pk = {r[1]: r[5] for r in conn.execute("PRAGMA table_info(memories)")}
    assert (pk["user_id"], pk["id"]) == (1, 2)
    kept = conn.execute("SELECT user_id, id, rowid FROM memories ORDER BY rowid").fetchall()
    assert kept[: len(marks)] == marks  # the key listing's marks are kept
    indexes = {r[1] for r in conn.execute("PRAGMA index_list(memories)")}
    assert {"memories_by_user", "memories_by_session"} <= indexes
    conn.close()
    SQLiteStore(db).close()  # a second open finds nothing to do


def test_the_rekeying_is_all_or_nothing(tmp_path, monkeypatch) -> None:
    """A failure half-way through leaves the old table as it was; the next open re-keys."""
    db = tmp_path / "memory.sqlite3"
    conn = sqlite3.connect(db)
    conn.executescript(_OLD_MEMORIES)
    conn.execute(
        "INSERT INTO memories (id, user_id, session_id, granularity, text, key, turn_ids, "
        "created_at, updated_at, metadata, embedding, embed_model) VALUES "
        "('m1', 'a', 's', 'item', 'x', 'x', '[]', '2025-01-01T00:00:00+00:00', "
        "'2025-01-01T00:00:00+00:00', '{}', ?, 'f')",
        (np.ones(3, np.float32).tobytes(),),
    )
    conn.commit()
    conn.close()
    from reflective_memory.storage import sqlite_schema

    def boom(*_a, **_k):
        raise RuntimeError("cut")

    monkeypatch.setattr(sqlite_schema.logger, "info", boom)
    with pytest.raises(RuntimeError, match="cut"):
        SQLiteStore(db)
    conn = sqlite3.connect(db)
    assert {r[1]: r[5] for r in conn.execute("PRAGMA table_info(memories)")}["id"] == 1
    assert (
        conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '%by_user_id'").fetchall()
        == []
    )
    conn.close()
    monkeypatch.undo()
    store = SQLiteStore(db)
    try:
        assert [m.text for m in store.memories("a")] == ["x"]
    finally:
        store.close()
