"""The PostgreSQL schema of `PostgresStore`: tables, indexes and migrations.

Every table that holds a user's data has `user_id` leading its primary key, so the tables can be
hash-partitioned by user or distributed by user (Citus-style) without changing a query: every
statement of the store names the user. Two small tables are global: `kv` (component settings and
reports) and `schema_info` (the migration level).

`migrate(conn, schema)` brings a schema to `SCHEMA_VERSION` under an advisory lock, so several
processes starting at once create it once. `ensure_vector_index(conn, schema, dim)` adds the HNSW
index for one embedding size (a partial expression index: the `vector` column itself has no fixed
size, so different embedders can share the tables).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from reflective_memory.errors import ConfigError
from reflective_memory.storage.checksum import text_crc

__all__ = ["SCHEMA_VERSION", "check_schema_name", "migrate", "ensure_vector_index", "schema_level"]

#: The schema level this code writes and reads.
SCHEMA_VERSION = 3

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

#: Statements of level 1, `{s}` is the quoted schema name.
_LEVEL_1 = [
    "CREATE TABLE IF NOT EXISTS {s}.turns ("
    " user_id text NOT NULL, session_id text NOT NULL, position integer NOT NULL,"
    " seq bigint GENERATED ALWAYS AS IDENTITY, turn_id text NOT NULL, role text NOT NULL,"
    " text text NOT NULL, ts text,"
    " PRIMARY KEY (user_id, session_id, position),"
    " UNIQUE (user_id, session_id, turn_id))",
    "CREATE INDEX IF NOT EXISTS turns_by_user_seq ON {s}.turns (user_id, seq)",
    "CREATE TABLE IF NOT EXISTS {s}.sessions ("
    " user_id text NOT NULL, session_id text NOT NULL, status text NOT NULL,"
    " n_turns integer NOT NULL, first_ts text, last_ts text,"
    " created_at timestamptz NOT NULL, ended_at timestamptz,"
    " builds integer NOT NULL DEFAULT 0,"
    " PRIMARY KEY (user_id, session_id))",
    "CREATE SEQUENCE IF NOT EXISTS {s}.memories_seq",
    "CREATE TABLE IF NOT EXISTS {s}.memories ("
    " user_id text NOT NULL, id text NOT NULL,"
    " seq bigint NOT NULL DEFAULT nextval('{s}.memories_seq'),"
    " session_id text NOT NULL, granularity text NOT NULL, text text NOT NULL,"
    " key text NOT NULL, lex text NOT NULL,"
    " tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, lex)) STORED,"
    " turn_ids jsonb NOT NULL, start_ts text, end_ts text,"
    " created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, metadata jsonb NOT NULL,"
    " embedding vector, embed_dim integer, embed_model text,"
    " PRIMARY KEY (user_id, id))",
    # keep vectors and lexemes inside the row (pgvector's default is out-of-line TOAST
    # storage, which makes a per-user scan read every vector through the TOAST table); the
    # raw texts are what gets compressed or moved out of line when a row is too long
    "ALTER TABLE {s}.memories ALTER COLUMN embedding SET STORAGE MAIN",
    "ALTER TABLE {s}.memories ALTER COLUMN tsv SET STORAGE MAIN",
    "CREATE INDEX IF NOT EXISTS memories_by_user_seq ON {s}.memories (user_id, seq)",
    "CREATE INDEX IF NOT EXISTS memories_by_session ON {s}.memories (user_id, session_id)",
    "CREATE INDEX IF NOT EXISTS memories_lexical ON {s}.memories USING gin (user_id, tsv)",
    "CREATE TABLE IF NOT EXISTS {s}.user_state ("
    " user_id text PRIMARY KEY, version bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.turn_extra ("
    " user_id text NOT NULL, session_id text NOT NULL, turn_id text NOT NULL,"
    " data jsonb NOT NULL, PRIMARY KEY (user_id, session_id, turn_id))",
    "CREATE TABLE IF NOT EXISTS {s}.blobs ("
    " owner text NOT NULL, name text NOT NULL, version bigint NOT NULL, data bytea NOT NULL,"
    " updated_at timestamptz NOT NULL, PRIMARY KEY (owner, name))",
    "CREATE TABLE IF NOT EXISTS {s}.kv (key text PRIMARY KEY, value jsonb NOT NULL)",
]

#: Level 2: user versions come from one store-wide sequence, so a user id that is deleted and
#: used again never sees a version it had before (derived caches are keyed by it).
_LEVEL_2 = [
    "CREATE SEQUENCE IF NOT EXISTS {s}.version_seq",
    "SELECT setval('{s}.version_seq',"
    " GREATEST((SELECT COALESCE(MAX(version), 0) FROM {s}.user_state), 1))",
]


def _fill_checksums(conn: Any, s: str) -> None:
    """Level 3: fill the checksum columns of rows written before they existed.

    Computed here, not in SQL: the checksum is CRC-32 of the UTF-8 text, which PostgreSQL has
    no function for. Rows are read through a server-side cursor, so memory stays bounded.
    """
    for table, keys, cols in (
        ("turns", ("user_id", "session_id", "position"), ("text",)),
        ("memories", ("user_id", "id"), ("text", "key")),
    ):
        sets = ", ".join(f"{c}_crc=%s" for c in cols)
        where = " AND ".join(f"{k}=%s" for k in keys)
        with conn.cursor(name=f"fill_{table}_crc") as read, conn.cursor() as write:
            read.execute(f"SELECT {', '.join(keys + cols)} FROM {s}.{table}")
            while rows := read.fetchmany(2000):
                write.executemany(
                    f"UPDATE {s}.{table} SET {sets} WHERE {where}",
                    [(*(text_crc(v) for v in r[len(keys) :]), *r[: len(keys)]) for r in rows],
                )


#: Level 3: a CRC-32 of each turn's text and each memory's text and key, written with the row
#: and checked on read (`reflective_memory.storage.checksum`); existing rows are filled in.
_LEVEL_3: list[str | Callable[[Any, str], None]] = [
    "ALTER TABLE {s}.turns ADD COLUMN IF NOT EXISTS text_crc bigint",
    "ALTER TABLE {s}.memories ADD COLUMN IF NOT EXISTS text_crc bigint",
    "ALTER TABLE {s}.memories ADD COLUMN IF NOT EXISTS key_crc bigint",
    _fill_checksums,
]

_MIGRATIONS: dict[int, list[str | Callable[[Any, str], None]]] = {
    1: list(_LEVEL_1),
    2: list(_LEVEL_2),
    3: _LEVEL_3,
}


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case SQL identifier, else raise `ConfigError`."""
    if not isinstance(schema, str) or not _NAME.match(schema):
        raise ConfigError(
            f"schema must be a lower-case SQL identifier (letters, digits, _), got {schema!r}"
        )
    return schema


def schema_level(conn: Any, schema: str) -> int:
    """The migration level of `schema` (0 when it has no tables of ours)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".schema_info',)
    ).fetchone()
    if not row[0]:
        return 0
    row = conn.execute(f'SELECT level FROM "{schema}".schema_info').fetchone()
    return 0 if row is None else int(row[0])


def migrate(conn: Any, schema: str) -> int:
    """Create or upgrade `schema` to `SCHEMA_VERSION`; return the level it was at.

    Runs in one transaction under an advisory lock, so concurrent callers wait for the first.
    The `vector` and `btree_gin` extensions are created when missing (`vector` needs a
    superuser or the database owner with the extension already allowed; see the README).

    Raises:
        ConfigError: The schema was written by a newer version of this library.
    """
    s = f'"{check_schema_name(schema)}"'
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 17))", (schema,))
        for ext in ("vector", "btree_gin"):
            have = conn.execute("SELECT 1 FROM pg_extension WHERE extname=%s", (ext,)).fetchone()
            if have is None:
                conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.schema_info (level integer NOT NULL)")
        row = conn.execute(f"SELECT level FROM {s}.schema_info").fetchone()
        level = 0 if row is None else int(row[0])
        if level > SCHEMA_VERSION:
            raise ConfigError(
                f"schema {schema!r} is at level {level}, newer than this library's "
                f"{SCHEMA_VERSION}: upgrade reflective-memory"
            )
        for target in range(level + 1, SCHEMA_VERSION + 1):
            for stmt in _MIGRATIONS[target]:
                if isinstance(stmt, str):
                    conn.execute(stmt.format(s=s))
                else:
                    stmt(conn, s)
        if row is None:
            conn.execute(f"INSERT INTO {s}.schema_info (level) VALUES (%s)", (SCHEMA_VERSION,))
        else:
            conn.execute(f"UPDATE {s}.schema_info SET level=%s", (SCHEMA_VERSION,))
    return level


def vector_index_name(dim: int) -> str:
    """Name of the HNSW index for embeddings of size `dim`."""
    return f"memories_hnsw_{int(dim)}"


def ensure_vector_index(conn: Any, schema: str, dim: int, m: int = 16, ef: int = 64) -> bool:
    """Create the HNSW index (inner product) for `dim`-sized embeddings if it is missing.

    Returns:
        Whether the index was created now.
    """
    if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= 2000:
        raise ConfigError(f"pgvector HNSW indexes take 1..2000 dimensions, got {dim!r}")
    s = f'"{check_schema_name(schema)}"'
    name = vector_index_name(dim)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 18))", (schema,))
        found = conn.execute(
            "SELECT 1 FROM pg_indexes WHERE schemaname=%s AND indexname=%s", (schema, name)
        ).fetchone()
        if found is not None:
            return False
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {s}.memories USING hnsw "
            f"((embedding::vector({dim})) vector_ip_ops) WITH (m = {int(m)}, "
            f"ef_construction = {int(ef)}) WHERE embed_dim = {dim}"
        )
    return True
