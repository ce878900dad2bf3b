"""Sealed learned state: a checksum around the bytes a learning component stores.

`Rerankers` stores every state blob sealed (`reflective_memory.storage.checksum.seal`:
`MAGIC + SHA-256(payload) + payload`), whatever the
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

from reflective_memory.errors import ModelLoadError
from reflective_memory.storage import checksum
from reflective_memory.storage.checksum import MAGIC, seal

__all__ = ["seal", "unseal", "MAGIC"]


def unseal(data: bytes) -> tuple[bytes, bool]:
    """The payload of a sealed blob, checked, and whether it was sealed at all.

    Bytes without the seal's `MAGIC` come back unchanged with `False` (state written before
    seals existed; the caller checks what they hold and stores them again sealed).

    Raises:
        ModelLoadError: The blob is sealed but its payload does not match the checksum
            (damaged or truncated).
    """
    try:
        return checksum.unseal(data)
    except ValueError as exc:
        raise ModelLoadError(f"{exc} (learned state)") from exc
