"""The tables of `SQLiteStore` (created if missing when a store opens) and their upgrades."""

from __future__ import annotations

import logging
import sqlite3

from reflective_memory.storage.checksum import text_crc

__all__ = ["SCHEMA", "add_checksums", "key_memories_by_user"]

logger = logging.getLogger(__name__)

#: Checksum columns (see `reflective_memory.storage.checksum`) and the column each covers.
_CHECKSUMS = {"turns": {"text_crc": "text"}, "memories": {"text_crc": "text", "key_crc": "key"}}

#: The memories table (`{name}`): a memory id is unique per user, as on PostgreSQL.
_MEMORIES = """
CREATE TABLE IF NOT EXISTS {name} (
    id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    granularity TEXT NOT NULL,
    text TEXT NOT NULL,
    key TEXT NOT NULL,
    turn_ids TEXT NOT NULL,
    start_ts TEXT,
    end_ts TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    metadata TEXT NOT NULL,
    embedding BLOB,
    embed_model TEXT,
    text_crc INTEGER,
    key_crc INTEGER,
    PRIMARY KEY (user_id, id)
);
"""
_MEMORY_INDEXES = """
CREATE INDEX IF NOT EXISTS memories_by_user ON memories (user_id, granularity);
CREATE INDEX IF NOT EXISTS memories_by_session ON memories (user_id, session_id);
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    ts TEXT,
    text_crc INTEGER,
    UNIQUE (user_id, session_id, turn_id)
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (user_id, session_id, position);
CREATE TABLE IF NOT EXISTS sessions (
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    status TEXT NOT NULL,
    n_turns INTEGER NOT NULL,
    first_ts TEXT,
    last_ts TEXT,
    created_at TEXT NOT NULL,
    ended_at TEXT,
    PRIMARY KEY (user_id, session_id)
);
{memories}{memory_indexes}CREATE TABLE IF NOT EXISTS user_state (
    user_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS turn_extra (
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (user_id, session_id, turn_id)
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS store_clock (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO store_clock (id, value)
    VALUES (0, (SELECT COALESCE(MAX(version), 0) FROM user_state));
""".format(
    memories=_MEMORIES.format(name="memories").lstrip(), memory_indexes=_MEMORY_INDEXES.lstrip()
)


def _missing(conn: sqlite3.Connection) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table, columns in _CHECKSUMS.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        absent = [c for c in columns if c not in have]
        if absent:
            out[table] = absent
    return out


def add_checksums(conn: sqlite3.Connection) -> None:
    """Add the checksum columns to a database written before they existed, and fill them.

    Runs once per database (later opens find the columns: one `PRAGMA table_info` per table),
    in one transaction, so a crash leaves the file as it was and the next open does it again.
    """
    if not _missing(conn):
        return
    conn.create_function("rm_text_crc", 1, text_crc, deterministic=True)
    conn.execute("BEGIN IMMEDIATE")
    try:
        missing = _missing(conn)  # another process may have done it while we waited
        for table, absent in missing.items():
            for column in absent:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")
            sets = ", ".join(f"{c} = rm_text_crc({_CHECKSUMS[table][c]})" for c in absent)
            n = conn.execute(f"UPDATE {table} SET {sets}").rowcount
            logger.info("added checksums %s to %d rows of table %s", absent, n, table)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _ids_store_wide(conn: sqlite3.Connection) -> bool:
    """Whether `memories` is keyed by `id` alone (written before ids were per user)."""
    pk = {r[1]: r[5] for r in conn.execute("PRAGMA table_info(memories)")}
    return pk.get("id") == 1 and pk.get("user_id") == 0


def key_memories_by_user(conn: sqlite3.Connection) -> None:
    """Key `memories` by (user, id) in a database whose memory ids were unique store-wide.

    A memory id is unique per user on both backends, so one id may name two users' memories
    (an export from PostgreSQL may hold such ids). The table is rebuilt once, rows and their
    rowids (the key listing's marks) kept, in one transaction: a crash leaves the file as it
    was and the next open does it again. Run after `add_checksums` (every column exists).
    """
    if not _ids_store_wide(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _ids_store_wide(conn):  # another process may have done it while we waited
            columns = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(memories)"))
            conn.execute("DROP TABLE IF EXISTS memories_by_user_id")
            conn.execute(_MEMORIES.format(name="memories_by_user_id"))
            n = conn.execute(
                f"INSERT INTO memories_by_user_id (rowid, {columns}) "
                f"SELECT rowid, {columns} FROM memories"
            ).rowcount
            conn.execute("DROP TABLE memories")
            conn.execute("ALTER TABLE memories_by_user_id RENAME TO memories")
            for statement in _MEMORY_INDEXES.strip().splitlines():
                conn.execute(statement)
            logger.info("memory ids are now unique per user (%d memories re-keyed)", n)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
