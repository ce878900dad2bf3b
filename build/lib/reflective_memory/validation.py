"""Argument checks shared by the public API: bad input fails before any work is done."""

from __future__ import annotations

from typing import Any

from reflective_memory.errors import InvalidInputError

__all__ = ["check_id", "check_positive", "MAX_ID_CHARS"]

#: Longest accepted id (user, session, turn, role).
MAX_ID_CHARS = 512


def check_id(name: str, value: Any) -> str:
    """Check that an id is a non-blank str of at most `MAX_ID_CHARS`; return it."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInputError(f"{name} is longer than {MAX_ID_CHARS} characters")
    return value


def check_positive(name: str, value: Any) -> int | None:
    """Check that `value` is None or a positive int; return it."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer or None, got {value!r}")
    return value
