"""The tables of `SQLiteStore` (created if missing when a store opens) and their upgrades."""

from __future__ import annotations

import logging
import sqlite3

from reflective_memory.storage.checksum import text_crc

__all__ = ["SCHEMA", "add_checksums"]

logger = logging.getLogger(__name__)

#: Checksum columns (see `reflective_memory.storage.checksum`) and the column each covers.
_CHECKSUMS = {"turns": {"text_crc": "text"}, "memories": {"text_crc": "text", "key_crc": "key"}}

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
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
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
    key_crc INTEGER
);
CREATE INDEX IF NOT EXISTS memories_by_user ON memories (user_id, granularity);
CREATE INDEX IF NOT EXISTS memories_by_session ON memories (user_id, session_id);
CREATE TABLE IF NOT EXISTS user_state (
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
"""


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
