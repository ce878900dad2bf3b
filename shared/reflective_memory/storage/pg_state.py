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

from reflective_memory.storage.pg_replicas import PgRoutes
from reflective_memory.storage.state import StateUpdate, check_state_key, state_bytes

__all__ = ["DatabaseStateStore", "delete_owner_rows"]


def delete_owner_rows(conn: Any, qualified: str, owner: str) -> int:
    """Delete every state of `owner` in the transaction of `conn`; return how many."""
    return int(conn.execute(f"DELETE FROM {qualified}.blobs WHERE owner=%s", (owner,)).rowcount)


class DatabaseStateStore:
    """`StateStore` on the `blobs` table of a `PostgresStore` schema.

    Reads (`version`, `get`, `names`) may go to a read replica: they see every update this
    process made to the owner's states (read-your-writes, `PgRoutes`); updates and deletions
    run on the primary.

    Args:
        routes: The store's transactions (shared with the store; closing the store closes
            them); the schema is the primary's.
    """

    def __init__(self, routes: PgRoutes) -> None:
        self.routes = routes
        self.db = routes.primary
        self._s = self.db.qualified

    def __repr__(self) -> str:
        return f"DatabaseStateStore(schema={self.db.schema!r})"

    def version(self, owner: str, name: str) -> int:
        """See `StateStore.version`."""
        check_state_key(owner, name)
        row = self._row(owner, name, "version")
        return 0 if row is None else int(row[0])

    def _row(self, owner: str, name: str, columns: str) -> Any:
        """`columns` of the state `(owner, name)`, read where reads go; None when absent."""
        sql = f"SELECT {columns} FROM {self._s}.blobs WHERE owner=%s AND name=%s"
        return self.routes.read(owner, lambda conn: conn.execute(sql, (owner, name)).fetchone())

    def get(self, owner: str, name: str) -> tuple[int, bytes] | None:
        """See `StateStore.get`."""
        check_state_key(owner, name)
        row = self._row(owner, name, "version, data")
        return None if row is None else (int(row[0]), bytes(row[1]))

    def update(self, owner: str, name: str, fn: StateUpdate) -> tuple[int, bytes | None]:
        """See `StateStore.update`: `fn` runs while the advisory lock is held."""
        check_state_key(owner, name)
        s = self._s
        where = "WHERE owner=%s AND name=%s"

        def write(conn: Any) -> tuple[int, bytes | None]:
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))",
                (f"blob\x1f{self.db.schema}\x1f{owner}\x1f{name}",),
            )
            row = conn.execute(f"SELECT version, data FROM {s}.blobs {where}", (owner, name))
            row = row.fetchone()
            version = 0 if row is None else int(row[0])
            new = fn(version, None if row is None else bytes(row[1]))
            if new is None:
                if row is not None:
                    conn.execute(f"DELETE FROM {s}.blobs {where}", (owner, name))
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

        return self.routes.write((owner,), write)

    def delete(self, owner: str, name: str) -> bool:
        """See `StateStore.delete`."""
        check_state_key(owner, name)
        sql = f"DELETE FROM {self._s}.blobs WHERE owner=%s AND name=%s"
        n = self.routes.write((owner,), lambda conn: conn.execute(sql, (owner, name)).rowcount)
        return n > 0

    def delete_owner(self, owner: str) -> int:
        """See `StateStore.delete_owner`."""
        check_state_key(owner)
        return self.routes.write((owner,), lambda conn: delete_owner_rows(conn, self._s, owner))

    def names(self, owner: str) -> list[str]:
        """See `StateStore.names`."""
        check_state_key(owner)
        sql = f"SELECT name FROM {self._s}.blobs WHERE owner=%s"
        rows = self.routes.read(owner, lambda conn: conn.execute(sql, (owner,)).fetchall())
        return sorted(r[0] for r in rows)
