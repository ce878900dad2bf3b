"""State of `PostgresStore` beside turns and memories: key/value, versioned blobs, turn extras.

Components that learn or record something (the RMM reranker, reflection reports, adapters'
markers) keep it here, and adapters attach framework message fields to turns, so every process
serving the same users reads the same state. Blobs carry a version that each write bumps;
`update_blob` is a read-modify-write under a cross-process advisory lock, so concurrent updates
apply one after the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["PgStateMixin"]


class PgStateMixin:
    """Key/value and blob methods of `PostgresStore` (needs its `_conn`, `_s`, `schema`)."""

    _s: str
    schema: str
    _conn: Any

    def get_value(self, key: str) -> Any | None:
        """Read a JSON value stored by `set_value`, or None."""
        with self._conn() as conn:
            row = conn.execute(f"SELECT value FROM {self._s}.kv WHERE key=%s", (key,)).fetchone()
        return None if row is None else row[0]

    def set_value(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value durably."""
        text = json.dumps(value)
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO {self._s}.kv (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (key, text),
            )

    def blob_version(self, owner: str, name: str) -> int:
        """Version of a stored blob (0 when there is none)."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT version FROM {self._s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def get_blob(self, owner: str, name: str) -> tuple[int, bytes] | None:
        """`(version, data)` of a stored blob, or None."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT version, data FROM {self._s}.blobs WHERE owner=%s AND name=%s",
                (owner, name),
            ).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def update_blob(
        self, owner: str, name: str, update: Callable[[int, bytes | None], bytes]
    ) -> int:
        """Read-modify-write a blob atomically across processes; return the new version.

        `update(version, data)` gets the current blob (0, None when absent) while a
        transaction-level advisory lock on `(owner, name)` is held, so concurrent updates from
        several processes apply one after the other and none is lost.
        """
        s = self._s
        with self._conn() as conn:
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))",
                (f"blob\x1f{self.schema}\x1f{owner}\x1f{name}",),
            )
            row = conn.execute(
                f"SELECT version, data FROM {s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).fetchone()
            version = 0 if row is None else int(row[0])
            data = update(version, None if row is None else bytes(row[1]))
            conn.execute(
                f"INSERT INTO {s}.blobs (owner, name, version, data, updated_at) "
                "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (owner, name) DO UPDATE SET "
                "version = EXCLUDED.version, data = EXCLUDED.data, updated_at = now()",
                (owner, name, version + 1, data),
            )
        return version + 1

    def delete_blob(self, owner: str, name: str) -> bool:
        """Delete a blob; return whether it existed."""
        with self._conn() as conn:
            n = conn.execute(
                f"DELETE FROM {self._s}.blobs WHERE owner=%s AND name=%s", (owner, name)
            ).rowcount
        return n > 0

    # -- per-turn extra data (adapters keep framework message fields here) ----------------
    def set_turn_extra(
        self, user_id: str, session_id: str, extras: dict[str, dict[str, Any]]
    ) -> None:
        """Attach JSON data to stored turns (by turn id); deleted together with the turns."""
        if not extras:
            return
        with self._conn() as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self._s}.turn_extra (user_id, session_id, turn_id, data) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (user_id, session_id, turn_id) "
                "DO UPDATE SET data = EXCLUDED.data",
                [
                    (user_id, session_id, tid, json.dumps(data, default=str))
                    for tid, data in extras.items()
                ],
            )

    def turn_extra(self, user_id: str, session_id: str) -> dict[str, dict[str, Any]]:
        """The extra data of a session's turns, by turn id."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT turn_id, data FROM {self._s}.turn_extra WHERE user_id=%s "
                "AND session_id=%s",
                (user_id, session_id),
            ).fetchall()
        return {r[0]: r[1] for r in rows}
