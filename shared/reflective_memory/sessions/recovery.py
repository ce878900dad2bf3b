"""Turns committed but never indexed (a process died in between) are indexed again.

`add_turns` commits a turn, then stores its `turn` unit (its vector and searchable key). A
process killed between the two leaves a stored turn nobody can find until its session ends.
`LostTurns` finds such turns and indexes them: for every user when a store is opened
(`run()`), and for a user at that user's first write in this process (`once`), so a sibling
process that died on a shared database is repaired too. Both ask the store one query about
open sessions (`TurnUnitAudit`); only a session it reports is read turn by turn. A store
without that capability is left to the retry path (re-sending the turn indexes it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from reflective_memory.retrieval.units import turn_unit_id
from reflective_memory.storage.base import MemoryStore, TurnUnitAudit
from reflective_memory.types import Turn

__all__ = ["LostTurns"]

logger = logging.getLogger(__name__)


class LostTurns:
    """Finds turns of open sessions that have no `turn` unit, and indexes them.

    A session this process is writing right now (`busy`) is left to its writer: its newest
    turns may be committed and their units a moment from stored, which is no loss.

    Args:
        store: The store of record.
        index_turns: Stores the `turn` units of turns (the writer's indexing step).
        enabled: Whether turns get `turn` units at all (`"turn"` is a configured granularity).
        busy: The `(user_id, session_id)` pairs being written by this process now.
    """

    def __init__(
        self,
        store: MemoryStore,
        index_turns: Callable[[Sequence[Turn]], None],
        *,
        enabled: bool = True,
        busy: Callable[[], set[tuple[str, str]]] = set,
    ) -> None:
        self.store = store
        self.index_turns = index_turns
        self.busy = busy
        self._audit: TurnUnitAudit | None = (
            store if enabled and isinstance(store, TurnUnitAudit) else None
        )
        self._checked: set[str] = set()
        self._guard = threading.Lock()

    def run(self, user_id: str | None = None) -> int:
        """Index the lost turns of `user_id` (None: of every user); return how many."""
        return self._run(user_id)[0]

    def _run(self, user_id: str | None) -> tuple[int, bool]:
        """(turns indexed, whether a session being written now was left for later)."""
        if self._audit is None:
            return 0, False
        lost: list[Turn] = []
        busy = self.busy()
        skipped = False
        for user, session in self._audit.sessions_missing_turn_units(user_id):
            if (user, session) in busy:
                skipped = True
                continue
            turns = self.store.turns(user, session)
            ids = [turn_unit_id(user, session, t.turn_id) for t in turns]
            have = {m.id for m in self.store.memories(user, ids)}
            lost += [t for t, mid in zip(turns, ids, strict=True) if mid not in have]
        if lost:
            logger.warning(
                "indexing %d turns stored but never indexed (a process stopped in between)",
                len(lost),
            )
            self.index_turns(lost)
        return len(lost), skipped

    def at_open(self) -> None:
        """`run` for every user, when a store is opened (failures are logged, not raised)."""
        try:
            self.run()
        except Exception:  # opening must not fail on a repair; each user's next write retries
            logger.exception("indexing lost turns at open failed")

    def once(self, user_ids: Iterable[str]) -> None:
        """`run` for each user not yet checked by this process (never fails the caller)."""
        for user_id in user_ids:
            with self._guard:
                if self._audit is None or user_id in self._checked:
                    continue
            try:
                _, skipped = self._run(user_id)
            except Exception:  # the caller's turns are committed; the next process retries
                logger.exception("indexing lost turns of user %s failed", user_id)
                continue
            if skipped:  # a session was being written: checked again at the next write
                continue
            with self._guard:
                self._checked.add(user_id)
