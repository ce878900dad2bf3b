"""The tables of `SQLiteStore` (created if missing when a store opens)."""

__all__ = ["SCHEMA"]

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
    embed_model TEXT
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
