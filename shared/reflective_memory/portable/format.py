"""The export format: one JSON object per line, checked line by line.

A file is a header line, one block of lines per user, the shared learned state and an end line::

    {"format": "reflective-memory-export", "version": 1, "library": "0.2.0", ...}
    {"kind": "user", "user_id": "ana"}
    {"kind": "session", "session_id": "s1", "status": "ended", "n_turns": 2, ...}
    {"kind": "turn", "session_id": "s1", "turn_id": "s1:0", "role": "user", "text": "...", ...}
    {"kind": "memory", "id": "turn-...", "granularity": "turn", "key": "...", "vector": "...", ...}
    {"kind": "value", "key": "rmm.reflection/ana/s1", "value": {...}}
    {"kind": "state", "owner": "ana", "name": "rmm.user_adapter", "data": "<base64>"}
    {"kind": "user_end", "user_id": "ana", "counts": {...}, "checksum": "<hex>"}
    {"kind": "state", "owner": "__shared__", "name": "rmm.reranker", "data": "<base64>"}
    {"kind": "end", "users": 1}

Times are ISO 8601 strings (store bookkeeping times in UTC); a memory's `vector` is its stored
embedding as base64 little-endian float32, `model` the embedder that made it. A user block's
`user_end` line counts its lines by kind and carries `checksum`, an order-free digest of them
(`Digest`), which `migrate` also computes on the target to verify the move.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.jsonfile import FileShape
from reflective_memory.storage.base import SessionInfo, text_time
from reflective_memory.types import GRANULARITIES, Memory, Turn
from reflective_memory.validation import (
    check_choice,
    check_id,
    check_ids,
    check_json_object,
    check_role,
    check_storable,
    check_str,
    check_text,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KINDS",
    "COUNTED",
    "Digest",
    "iso",
    "parse_time",
    "encode_vector",
    "decode_vector",
    "header_record",
    "session_record",
    "turn_record",
    "memory_record",
    "check_record",
    "check_header",
]

#: The `format` of a header line.
FORMAT_NAME = "reflective-memory-export"
#: The format version this library writes (and the newest it reads).
FORMAT_VERSION = 1
#: Line kinds after the header.
KINDS = ("user", "session", "turn", "memory", "value", "state", "user_end", "end")
#: Kinds counted in a user block's `user_end` line.
COUNTED = ("session", "turn", "memory", "value", "state")

_STATUSES = ("open", "ended")


def iso(value: datetime | None, *, utc: bool = False) -> str | None:
    """`value` as ISO 8601 (`utc`: an aware time converted to UTC first), or None."""
    if value is None:
        return None
    if utc and value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.isoformat()


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 string written by `iso` as an aware datetime (None stays None).

    A file an older version wrote may hold times without offset: they are read as UTC.
    """
    return text_time(value)


def encode_vector(vector: np.ndarray | bytes) -> str:
    """An embedding as base64 of its little-endian float32 bytes."""
    if isinstance(vector, bytes):
        return base64.b64encode(vector).decode("ascii")
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_vector(text: str) -> np.ndarray:
    """The float32 vector `encode_vector` wrote.

    Raises:
        InvalidInputError: `text` is not base64 of a whole number of float32 values, or holds
            NaN or infinity.
    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise InvalidInputError("vector is not base64") from None
    if not raw or len(raw) % 4:
        raise InvalidInputError(f"vector holds {len(raw)} bytes, not a float32 vector")
    vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.isfinite(vec).all():
        raise InvalidInputError("vector holds NaN or infinity")
    return vec


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


class Digest:
    """An order-free checksum of a user's lines: the sum of their SHA-256 values mod 2**256.

    A turn's `position` is left out (a store numbers positions itself), so the digest says
    whether two stores hold the same records, whatever order or numbering they keep them in.
    """

    def __init__(self) -> None:
        self._sum = 0
        self.counts: Counter[str] = Counter()

    def add(self, record: dict[str, Any]) -> None:
        """Count `record` in (its `kind` must be one of `COUNTED`)."""
        body = {k: v for k, v in record.items() if k != "position"}
        self._sum = (self._sum + int.from_bytes(hashlib.sha256(_canonical(body)).digest())) % (
            1 << 256
        )
        self.counts[record["kind"]] += 1

    def hexdigest(self) -> str:
        """The checksum as 64 hex digits."""
        return f"{self._sum:064x}"


# -- records -----------------------------------------------------------------------------------
def header_record(library: str, embedder: tuple[str, int] | None, vectors: bool) -> dict[str, Any]:
    """The first line: format, version, library version, embedder and whether vectors travel."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "library": library,
        "created_at": iso(datetime.now(timezone.utc)),
        "embedder": None if embedder is None else {"name": embedder[0], "dim": embedder[1]},
        "vectors": vectors,
    }


def session_record(info: SessionInfo) -> dict[str, Any]:
    """A session line: status (open or ended), counts and times."""
    return {
        "kind": "session",
        "session_id": info.session_id,
        "status": info.status,
        "n_turns": info.n_turns,
        "first_time": iso(info.first_time),
        "last_time": iso(info.last_time),
        "created_at": iso(info.created_at, utc=True),
        "ended_at": iso(info.ended_at, utc=True),
    }


def turn_record(turn: Turn, extra: dict[str, Any] | None) -> dict[str, Any]:
    """A turn line (with the turn's extra data, e.g. a framework message's fields)."""
    out = {
        "kind": "turn",
        "session_id": turn.session_id,
        "turn_id": turn.turn_id,
        "position": turn.position,
        "role": turn.role,
        "text": turn.text,
        "timestamp": iso(turn.timestamp),
    }
    if extra is not None:
        out["extra"] = extra
    return out


def memory_record(memory: Memory, model: str | None, vector: bytes | None) -> dict[str, Any]:
    """A memory line: the unit, its key and provenance, and its embedding if given."""
    return {
        "kind": "memory",
        "id": memory.id,
        "session_id": memory.session_id,
        "granularity": memory.granularity,
        "text": memory.text,
        "key": memory.key,
        "turn_ids": list(memory.turn_ids),
        "created_at": iso(memory.created_at, utc=True),
        "updated_at": iso(memory.updated_at, utc=True),
        "start_time": iso(memory.start_time),
        "end_time": iso(memory.end_time),
        "metadata": memory.metadata,
        "model": model if vector is not None else None,
        "vector": None if vector is None else encode_vector(vector),
    }


# -- checks --------------------------------------------------------------------------------------
def _time(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"must be an ISO 8601 string or null, got {type(value).__name__}")
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(f"{value[:40]!r} is not an ISO 8601 time") from None
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"must be a non-negative integer, got {value!r:.40}")
    return value


def _optional_id(value: Any) -> str:
    return check_str("session_id", value) if value == "" else check_id("session_id", value)


def _b64(value: Any) -> str:
    check_str("data", value)
    try:
        base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise InvalidInputError("is not base64") from None
    return value


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or set(value) != set(COUNTED):
        raise InvalidInputError(f"must be an object with the keys {', '.join(COUNTED)}")
    return {k: _count(v) for k, v in value.items()}


def _checksum(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 64 or set(value) - set("0123456789abcdef"):
        raise InvalidInputError("must be 64 lowercase hex digits")
    return value


_Check = Callable[[Any], Any]
_FIELDS: dict[str, dict[str, tuple[_Check, bool]]] = {
    # kind -> field -> (check, required)
    "user": {"user_id": (lambda v: check_id("user_id", v), True)},
    "session": {
        "session_id": (lambda v: check_id("session_id", v), True),
        "status": (lambda v: check_choice("status", v, _STATUSES), True),
        "n_turns": (_count, True),
        "first_time": (_time, False),
        "last_time": (_time, False),
        "created_at": (_time, True),
        "ended_at": (_time, False),
    },
    "turn": {
        "session_id": (lambda v: check_id("session_id", v), True),
        "turn_id": (lambda v: check_id("turn_id", v), True),
        "position": (_count, True),
        "role": (check_role, True),
        "text": (lambda v: check_text("text", v), True),
        "timestamp": (_time, False),
        "extra": (lambda v: check_json_object("extra", v), False),
    },
    "memory": {
        "id": (lambda v: check_id("id", v), True),
        "session_id": (_optional_id, True),
        "granularity": (lambda v: check_choice("granularity", v, GRANULARITIES), True),
        "text": (lambda v: check_text("text", v), True),
        "key": (lambda v: check_storable("key", v), True),
        "turn_ids": (lambda v: check_ids("turn_ids", v), True),
        "created_at": (_time, True),
        "updated_at": (_time, True),
        "start_time": (_time, False),
        "end_time": (_time, False),
        "metadata": (lambda v: check_json_object("metadata", v), True),
        "model": (lambda v: None if v is None else check_id("model", v), False),
        "vector": (lambda v: None if v is None else decode_vector(check_str("vector", v)), False),
    },
    "value": {
        "key": (lambda v: check_id("key", v), True),
        "value": (lambda v: check_json_object("value", {"v": v}), True),
    },
    "state": {
        "owner": (lambda v: check_id("owner", v), True),
        "name": (lambda v: check_id("name", v), True),
        "data": (_b64, True),
    },
    "user_end": {
        "user_id": (lambda v: check_id("user_id", v), True),
        "counts": (_counts, True),
        "checksum": (_checksum, True),
    },
    "end": {"users": (_count, True)},
}


def check_record(shape: FileShape, where: str, record: Any) -> dict[str, Any]:
    """`record` (one parsed line after the header) if its kind and fields are well formed.

    Raises:
        InvalidFileError: Naming `where` (the line) and the field at fault.
    """
    shape.expect(record, where, dict)
    kind = shape.field(record, "kind", where, str)
    fields = _FIELDS.get(kind)
    if fields is None:
        raise shape.fail(f"{where}.kind", f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    shape.only(record, where, {"kind", *fields})
    for name, (check, required) in fields.items():
        if name not in record:
            if required:
                raise shape.fail(where, f"missing key {name!r} in a {kind} line")
            continue
        if record[name] is None and not required:
            continue
        try:
            check(record[name])
        except InvalidInputError as exc:
            raise shape.fail(f"{where}.{name}", str(exc)) from None
    if kind == "memory" and (record.get("vector") is None) != (record.get("model") is None):
        raise shape.fail(where, "a memory's vector and model are given together or not at all")
    return record


def check_header(path: Path | str, record: Any) -> dict[str, Any]:
    """The header line, checked: this format, a version this library reads.

    Raises:
        InvalidFileError: Not an export file, or one from a newer version.
    """
    shape = FileShape(Path(path))
    where = "line 1"
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise shape.fail(where, f"is not a {FORMAT_NAME} header (is this an export file?)")
    version = shape.field(record, "version", where, int)
    if version < 1 or version > FORMAT_VERSION:
        raise shape.fail(
            f"{where}.version",
            f"format version {version} is not readable by this library (reads 1 to "
            f"{FORMAT_VERSION}; upgrade reflective-memory)",
        )
    shape.field(record, "library", where, str)
    shape.field(record, "vectors", where, bool)
    emb = shape.field(record, "embedder", where, dict, required=False)
    if emb is not None:
        shape.field(emb, "name", f"{where}.embedder", str)
        shape.field(emb, "dim", f"{where}.embedder", int)
    return record
