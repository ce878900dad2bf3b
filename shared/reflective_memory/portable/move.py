"""Move a store onto another (an embedded store onto PostgreSQL), then verify it per user.

The move is an export streamed straight into an import (no file in between): the same checks,
the same skipping of what the target holds, so a move that was killed finishes when run again,
without duplicates. Vectors move as they are. At the end every user's counts and checksum (the
`Digest` of its lines) are computed on both sides and compared.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from reflective_memory.portable.endpoints import Endpoint, endpoint
from reflective_memory.portable.export import (
    SHARED_OWNERS,
    ExportReport,
    iter_records,
    user_records,
)
from reflective_memory.portable.importer import Importer, ImportReport

__all__ = ["migrate", "verify_user", "MigrationReport", "UserCheck"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UserCheck:
    """One user's counts and checksum on both sides of a move.

    Attributes:
        user_id: The user.
        source: Counts in the source (`turns`, `sessions`, `open_sessions`, `memories`).
        target: The same counts in the target.
        source_checksum: The user's `Digest` in the source.
        target_checksum: The user's `Digest` in the target.
    """

    user_id: str
    source: dict[str, int]
    target: dict[str, int]
    source_checksum: str
    target_checksum: str

    @property
    def ok(self) -> bool:
        """Whether the target holds exactly what the source does."""
        return self.source == self.target and self.source_checksum == self.target_checksum

    def summary(self) -> str:
        """One line: the counts and whether they and the checksum match."""
        parts = []
        for k in ("turns", "sessions", "open_sessions", "memories"):
            a, b = self.source.get(k, 0), self.target.get(k, 0)
            parts.append(f"{k.replace('_', ' ')} {b}" + ("" if a == b else f" (source {a})"))
        same = self.source_checksum == self.target_checksum
        verdict = "ok" if self.ok else "MISMATCH"
        return (
            f"{self.user_id}: {', '.join(parts)}; checksum {'matches' if same else 'differs'}"
            f" [{verdict}]"
        )


@dataclass
class MigrationReport:
    """What a move wrote and what the verification found.

    Attributes:
        imported: What was added and skipped (a re-run skips what the first run moved).
        users: Per-user verification (empty when not verified).
        shared_state_ok: Whether the shared learned state (the reranker's prior) is the same.
    """

    imported: ImportReport
    users: list[UserCheck] = field(default_factory=list)
    shared_state_ok: bool = True

    @property
    def ok(self) -> bool:
        """Whether every user and the shared state verified."""
        return self.shared_state_ok and all(u.ok for u in self.users)


def _counts(ep: Endpoint, user_id: str) -> dict[str, int]:
    c = ep.store.count(user_id)
    out = {k: int(c[k]) for k in ("turns", "sessions", "open_sessions", "memories")}
    out.update({f"memories:{g}": int(n) for g, n in c["memories_by_granularity"].items()})
    return out


def verify_user(source: Endpoint, target: Endpoint, user_id: str, checksum: str) -> UserCheck:
    """Compare one user's counts, and its checksum with `checksum` (the source's)."""
    seen = ExportReport()
    deque(user_records(target, user_id, report=seen), maxlen=0)  # digest only, nothing kept
    return UserCheck(
        user_id,
        _counts(source, user_id),
        _counts(target, user_id),
        checksum,
        seen.checksums[user_id],
    )


def _shared_state_ok(source: Endpoint, target: Endpoint) -> bool:
    if source.state is None or target.state is None:
        return source.state is None
    for owner in SHARED_OWNERS:
        for name in source.state.names(owner):
            a, b = source.state.get(owner, name), target.state.get(owner, name)
            if (a is None) != (b is None) or (a is not None and b is not None and a[1] != b[1]):
                logger.warning("shared learned state %s/%s differs in the target", owner, name)
                return False
    return True


def migrate(source: Any, target: Any, *, verify: bool = True) -> MigrationReport:
    """Move everything of `source` into `target`, then verify it per user.

    Run it again after an interruption (a kill, a lost connection): what was moved is skipped
    and the rest is moved. Do not serve from the target before it finishes (its sessions are
    ended and its times restored per user at the end of each user's records).

    Args:
        source: A `ReflectiveMemory`, a `MemoryStore` or an `Endpoint` to read.
        target: The same kinds, to write (typically a `PostgresStore`).
        verify: Compare counts and checksums per user at the end.

    Returns:
        The import counts and, with `verify`, one `UserCheck` per user.
    """
    src, dst = endpoint(source), endpoint(target)
    exported = ExportReport()
    name = "<migrate>"
    imported = Importer(dst, path=name, reembed=False).run(iter_records(src, report=exported))
    report = MigrationReport(imported)
    if verify:
        for user_id in exported.users:
            report.users.append(verify_user(src, dst, user_id, exported.checksums[user_id]))
        report.shared_state_ok = _shared_state_ok(src, dst)
    return report
