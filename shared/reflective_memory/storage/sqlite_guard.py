"""Corruption guard of `SQLiteStore`: SQLite's "damaged file" errors become a typed error."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from reflective_memory.errors import StoreCorruptedError

__all__ = ["guarded", "is_corruption", "result_code"]

# SQLite result codes (low byte) that mean the file is damaged or is no database at all.
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB

_F = TypeVar("_F", bound=Callable[..., Any])


def result_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code (low byte) of `exc`; None when SQLite did not raise it."""
    code = getattr(exc, "sqlite_errorcode", None)  # set only on errors SQLite itself reported
    return None if code is None else int(code) & 0xFF


def is_corruption(exc: sqlite3.Error) -> bool:
    """Whether `exc` says the database file is damaged or is no database."""
    code = result_code(exc)
    if code is not None:
        return code in _CORRUPT_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def guarded(method: _F) -> _F:
    """Turn SQLite's corruption errors into `StoreCorruptedError` naming the database."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError) or not is_corruption(exc):
                raise
            raise StoreCorruptedError(
                f"the memory database {str(self.path or ':memory:')!r} is damaged ({exc}); "
                "restore it from a backup or move the directory away"
            ) from exc

    return wrapper  # type: ignore[return-value]
