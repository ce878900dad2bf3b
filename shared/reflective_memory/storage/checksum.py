"""Checksums of stored text: written with each row, checked on every read.

Both stores keep a CRC-32 of a turn's text (`turns.text_crc`) and of a memory's text and key
(`memories.text_crc`, `memories.key_crc`), computed here from the UTF-8 bytes when the row is
written and compared when it is read back. A mismatch (a bit flipped on disk, a row changed
behind the store's back) raises `StoreCorruptedError` naming the row, instead of returning text
that differs from what was stored.

Rows written before the columns existed are filled in once, when a store first opens with this
version (`SQLiteStore` adds and fills the columns at open, `PostgresStore` at schema level 3).
A NULL checksum is read as "unchecked" (a row written by an older library into a migrated
SQLite file), never as damage.

Files and blobs are sealed instead (`seal` / `unseal`): `MAGIC + SHA-256(payload) + payload`,
checked before a byte of the payload is used (learned state, the index cache's files).

Example:
    >>> text_crc("lighthouse") == text_crc("lighthouse")
    True
    >>> try:
    ...     check_text("lighvhouse", text_crc("lighthouse"), "turn 't1'")
    ... except StoreCorruptedError as exc:
    ...     print(str(exc)[:45])
    stored text of turn 't1' does not match its c
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from reflective_memory.errors import StoreCorruptedError

__all__ = [
    "MAGIC",
    "text_crc",
    "check_text",
    "check_turn",
    "check_memory",
    "checked_keys",
    "turn_row",
    "memory_row",
    "seal",
    "unseal",
]

#: First bytes of a sealed blob (no safetensors, FAISS or JSON file starts with them).
MAGIC = b"RMSEAL1\n"
_DIGEST = 32  # SHA-256


def text_crc(text: str) -> int:
    """CRC-32 of `text`'s UTF-8 bytes (an unsigned 32-bit integer)."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _mismatch(where: str) -> StoreCorruptedError:
    return StoreCorruptedError(
        f"stored text of {where} does not match its checksum (damaged on disk or changed "
        "outside the store); restore the store from a backup"
    )


def check_text(text: str, expected: int | None, where: str) -> str:
    """Return `text` if it matches its stored checksum (`None`: unchecked legacy row).

    Raises:
        StoreCorruptedError: The text does not match; `where` names the row.
    """
    if expected is not None and zlib.crc32(text.encode("utf-8", "surrogatepass")) != expected:
        raise _mismatch(where)
    return text


def check_turn(
    text: str, expected: int | None, user_id: str, session_id: str, turn_id: str
) -> None:
    """Check a turn row's text (the row is named only when it fails: reads stay cheap)."""
    if expected is not None and zlib.crc32(text.encode("utf-8", "surrogatepass")) != expected:
        raise _mismatch(turn_row(user_id, session_id, turn_id))


def check_memory(
    text: str, key: str, text_sum: int | None, key_sum: int | None, user_id: str, memory_id: str
) -> None:
    """Check a memory row's text and key."""
    if text_sum is not None and zlib.crc32(text.encode("utf-8", "surrogatepass")) != text_sum:
        raise _mismatch(memory_row(user_id, memory_id))
    if key_sum is not None and zlib.crc32(key.encode("utf-8", "surrogatepass")) != key_sum:
        raise _mismatch(memory_row(user_id, memory_id) + " key")


def turn_row(user_id: str, session_id: str, turn_id: str) -> str:
    """How a checksum error names a turn."""
    return f"turn {turn_id!r} of session {session_id!r} of user {user_id!r} (table turns)"


def memory_row(user_id: str, memory_id: str) -> str:
    """How a checksum error names a memory."""
    return f"memory {memory_id!r} of user {user_id!r} (table memories)"


def checked_keys(user_id: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """The keys of `(memory id, key, key checksum)` rows of one user, each checked."""
    out = []
    for mid, key, expected in rows:
        if expected is not None and zlib.crc32(key.encode("utf-8", "surrogatepass")) != expected:
            raise _mismatch(memory_row(user_id, mid) + " key")
        out.append(key)
    return out


def seal(payload: bytes) -> bytes:
    """`payload` with its checksum in front (what `unseal` checks)."""
    return MAGIC + hashlib.sha256(payload).digest() + bytes(payload)


def unseal(data: bytes) -> tuple[bytes, bool]:
    """The payload of a sealed blob, checked, and whether it was sealed at all.

    Bytes without `MAGIC` come back unchanged with `False` (written before seals existed).

    Raises:
        ValueError: The blob is sealed but truncated, or its payload does not match the
            checksum.
    """
    raw = bytes(data)
    if not raw.startswith(MAGIC):
        return raw, False
    start = len(MAGIC) + _DIGEST
    if len(raw) < start:
        raise ValueError(f"sealed data truncated to {len(raw)} bytes")
    payload = raw[start:]
    if hashlib.sha256(payload).digest() != raw[len(MAGIC) : start]:
        raise ValueError(f"checksum mismatch in sealed data ({len(payload)} payload bytes)")
    return payload, True
