"""Export: a store's records as the lines of the export format, one user at a time.

Only the public reads of `MemoryStore` and `StateStore` are used, so any store exports. Memory
use is bounded by the largest user (one user's records are read at a time), not by the store.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from reflective_memory import __version__
from reflective_memory.errors import UnknownUserError
from reflective_memory.portable.endpoints import Endpoint
from reflective_memory.portable.format import (
    COUNTED,
    Digest,
    encode_vector,
    header_record,
    memory_record,
    session_record,
    turn_record,
)

__all__ = [
    "iter_records",
    "user_records",
    "write_records",
    "ExportReport",
    "SESSION_VALUE_KEYS",
    "SHARED_OWNERS",
]

logger = logging.getLogger(__name__)

#: The per-session values (`MemoryStore.get_value` keys) an export carries, as functions of
#: `(user_id, session_id)`: RMM's reflection report, and the LlamaIndex chat store's marks
#: (`llamaindex_reflective.chat_store`). The key/value area cannot be listed, so only known
#: keys travel.
SESSION_VALUE_KEYS: tuple[Callable[[str, str], str], ...] = (
    lambda u, s: f"rmm.reflection/{u}/{s}",
    lambda u, s: "llamaindex_reflective:marks:" + _json_list(u, s),
)

#: Owners of learned state shared by all users, exported after the user blocks: the turn
#: ranker's shared offsets (`reflective_memory.rmm.turn_learning.PRIOR_OWNER`).
SHARED_OWNERS = ("__shared__",)


def _json_list(*items: str) -> str:
    return json.dumps(list(items))


@dataclass
class ExportReport:
    """What an export wrote.

    Attributes:
        users: Users exported, in order.
        counts: Lines written by kind (`session`, `turn`, `memory`, `value`, `state`).
        checksums: Each user's `Digest` (hex).
        models: Memories whose vector was written, by the model that made it.
    """

    users: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)


def user_records(
    ep: Endpoint, user_id: str, *, vectors: bool = True, report: ExportReport | None = None
) -> Iterator[dict[str, Any]]:
    """The lines of one user's block, `user` to `user_end`."""
    store, digest = ep.store, Digest()
    yield {"kind": "user", "user_id": user_id}

    def counted(record: dict[str, Any]) -> dict[str, Any]:
        digest.add(record)
        return record

    sessions = store.sessions(user_id)
    extras: dict[str, dict[str, dict[str, Any]]] = {}
    for info in sessions:
        yield counted(session_record(info))
        extras[info.session_id] = store.turn_extra(user_id, info.session_id)
    for turn in store.turns(user_id):
        yield counted(turn_record(turn, extras.get(turn.session_id, {}).get(turn.turn_id)))
    del extras
    stored: dict[str, tuple[bytes | None, str]] = {}
    if vectors:
        ids, _, blobs, models = store.embeddings(user_id)
        stored = dict(zip(ids, zip(blobs, models, strict=True), strict=True))
        del ids, blobs, models
    for memory in store.memories(user_id):
        blob, model = stored.pop(memory.id, (None, None))
        if blob is not None and model and report is not None:
            report.models[model] = report.models.get(model, 0) + 1
        yield counted(memory_record(memory, model or None, blob if model else None))
    del stored
    for info in sessions:
        for key_of in SESSION_VALUE_KEYS:
            key = key_of(user_id, info.session_id)
            value = store.get_value(key)
            if value is not None:
                yield counted({"kind": "value", "key": key, "value": value})
    if ep.state is not None:
        yield from map(counted, _state_records(ep, user_id))
    if report is not None:
        report.users.append(user_id)
        report.checksums[user_id] = digest.hexdigest()
        for kind, n in digest.counts.items():
            report.counts[kind] = report.counts.get(kind, 0) + n
    yield {
        "kind": "user_end",
        "user_id": user_id,
        "counts": {k: digest.counts.get(k, 0) for k in COUNTED},
        "checksum": digest.hexdigest(),
    }


def _state_records(ep: Endpoint, owner: str) -> Iterator[dict[str, Any]]:
    assert ep.state is not None
    for name in ep.state.names(owner):
        got = ep.state.get(owner, name)
        if got is not None:
            yield {"kind": "state", "owner": owner, "name": name, "data": encode_vector(got[1])}


def iter_records(
    ep: Endpoint,
    *,
    users: Sequence[str] | None = None,
    vectors: bool = True,
    report: ExportReport | None = None,
) -> Iterator[dict[str, Any]]:
    """Every line of an export of `ep`, header first, as dicts (lazily, one user at a time).

    Args:
        ep: What to export.
        users: Only these users (default: every user of the store).
        vectors: Carry each memory's stored embedding (else an import re-embeds every key).
        report: Filled in as lines are produced.

    Raises:
        UnknownUserError: A user in `users` has nothing stored.
    """
    known = ep.store.users()
    if users is not None:
        missing = [u for u in users if u not in set(known)]
        if missing:
            raise UnknownUserError(f"the store has no user {missing[0]!r}")
        known = list(users)
    embedder = None if ep.embedder is None else (ep.embedder.name, int(ep.embedder.dim))
    yield header_record(__version__, embedder, vectors)
    for user_id in known:
        yield from user_records(ep, user_id, vectors=vectors, report=report)
    if ep.state is not None:
        for owner in SHARED_OWNERS:
            for record in _state_records(ep, owner):
                if report is not None:
                    report.counts["state"] = report.counts.get("state", 0) + 1
                yield record
    yield {"kind": "end", "users": len(known)}


def write_records(records: Iterator[dict[str, Any]], fp: IO[str]) -> int:
    """Write records as JSON Lines to a text stream; return the number of lines."""
    n = 0
    for record in records:
        fp.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        n += 1
    return n
