"""Sealed learned state: a checksum around the bytes a learning component stores.

`Rerankers` stores every state blob sealed, `MAGIC + SHA-256(payload) + payload`, whatever the
`StateStore` (files, PostgreSQL or a third party's), and checks the seal on every read, so a
blob damaged at rest or in transit is detected before its weights are used. Blobs written
before seals existed (plain safetensors or JSON: neither starts with `MAGIC`) are read as they
are, once, and stored again sealed.

Example:
    >>> unseal(seal(b"weights"))
    (b'weights', True)
    >>> unseal(b'{"old": "json"}')
    (b'{"old": "json"}', False)
"""

from __future__ import annotations

import hashlib

from reflective_memory.errors import ModelLoadError

__all__ = ["seal", "unseal", "MAGIC"]

#: First bytes of a sealed blob (no safetensors file or JSON document starts with them).
MAGIC = b"RMSEAL1\n"
_DIGEST = 32  # SHA-256


def seal(payload: bytes) -> bytes:
    """`payload` with its checksum in front (what `unseal` checks)."""
    return MAGIC + hashlib.sha256(payload).digest() + bytes(payload)


def unseal(data: bytes) -> tuple[bytes, bool]:
    """The payload of a sealed blob, checked, and whether it was sealed at all.

    Bytes without the seal's `MAGIC` come back unchanged with `False` (state written before
    seals existed; the caller checks what they hold and stores them again sealed).

    Raises:
        ModelLoadError: The blob is sealed but its payload does not match the checksum
            (damaged or truncated).
    """
    raw = bytes(data)
    if not raw.startswith(MAGIC):
        return raw, False
    start = len(MAGIC) + _DIGEST
    if len(raw) < start:
        raise ModelLoadError(f"sealed state truncated to {len(raw)} bytes")
    payload = raw[start:]
    if hashlib.sha256(payload).digest() != raw[len(MAGIC) : start]:
        raise ModelLoadError(f"checksum mismatch in sealed state ({len(payload)} payload bytes)")
    return payload, True
