"""`DatabaseStateStore`: learned state in PostgreSQL, shared by every process on the database.

The `StateStore` of `PostgresStore` (`PostgresStore.state`), over the schema's `blobs` table
(`owner, name, version, data, updated_at`). An update is a read-modify-write under a
transaction-level advisory lock on `(owner, name)`, so concurrent updates from several processes
apply one after the other and none is lost. New versions come from the schema's store-wide
`version_seq` (and always exceed the state's previous version), so a state deleted and written
again never gets a version it had before. `PostgresStore.delete_user` deletes the user's states
in its own transaction (`delete_owner_rows`).
"""

from __future__ import annotations

from typing import Any

from reflective_memory.storage.pg_database import PgDatabase
from reflective_memory.storage.state import StateUpdate, check_state_key, state_bytes

__all__ = ["DatabaseStateStore", "delete_owner_rows"]


def delete_owner_rows(conn: Any, qualified: str, owner: str) -> int:
    """Delete every state of `owner` in the transaction of `conn`; return how many."""
    return int(conn.execute(f"DELETE FROM {qualified}.blobs WHERE owner=%s", (owner,)).rowcount)


class DatabaseStateStore:
    """`StateStore` on the `blobs` table of a `PostgresStore` schema.

    Args:
        db: The connections and schema (shared with the store; closing the store closes it).
    """

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._s = db.qualified

    def __repr__(self) -> str:
        return f"DatabaseStateStore(schema={self.db.schema!r})"

    def version(self, owner: str, name: str) -> int:
        """See `StateStore.version`."""
        check_state_key(owner, name)
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT version FROM {self._s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def get(self, owner: str, name: str) -> tuple[int, bytes] | None:
        """See `StateStore.get`."""
        check_state_key(owner, name)
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT version, data FROM {self._s}.blobs WHERE owner=%s AND name=%s",
                (owner, name),
            ).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def update(self, owner: str, name: str, fn: StateUpdate) -> tuple[int, bytes | None]:
        """See `StateStore.update`: `fn` runs while the advisory lock is held."""
        check_state_key(owner, name)
        s = self._s
        with self.db.transaction() as conn:
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))",
                (f"blob\x1f{self.db.schema}\x1f{owner}\x1f{name}",),
            )
            row = conn.execute(
                f"SELECT version, data FROM {s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).fetchone()
            version = 0 if row is None else int(row[0])
            new = fn(version, None if row is None else bytes(row[1]))
            if new is None:
                if row is not None:
                    conn.execute(f"DELETE FROM {s}.blobs WHERE owner=%s AND name=%s", (owner, name))
                return 0, None
            data = state_bytes(new)
            (stored,) = conn.execute(
                f"INSERT INTO {s}.blobs (owner, name, version, data, updated_at) VALUES"
                f" (%s, %s, GREATEST(%s, nextval('{s}.version_seq')), %s, now())"
                " ON CONFLICT (owner, name) DO UPDATE SET version = EXCLUDED.version,"
                " data = EXCLUDED.data, updated_at = now() RETURNING version",
                (owner, name, version + 1, data),
            ).fetchone()
        return int(stored), data

    def delete(self, owner: str, name: str) -> bool:
        """See `StateStore.delete`."""
        check_state_key(owner, name)
        with self.db.transaction() as conn:
            n = conn.execute(
                f"DELETE FROM {self._s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).rowcount
        return n > 0

    def delete_owner(self, owner: str) -> int:
        """See `StateStore.delete_owner`."""
        check_state_key(owner)
        with self.db.transaction() as conn:
            return delete_owner_rows(conn, self._s, owner)

    def names(self, owner: str) -> list[str]:
        """See `StateStore.names`."""
        check_state_key(owner)
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"SELECT name FROM {self._s}.blobs WHERE owner=%s", (owner,)
            ).fetchall()
        return sorted(r[0] for r in rows)
