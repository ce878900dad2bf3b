"""Driver and decoding errors of either backend, raised as the library's typed errors.

`typed_errors` wraps each public method of `ReflectiveMemory`: an `sqlite3.Error`, a
`psycopg.Error` or a `UnicodeError` escaping a store becomes a `ReflectiveMemoryError` subclass
with the original chained as its `__cause__`. Nothing else is caught, so a bug in the library
(a `TypeError`, a `KeyError`) still surfaces as itself.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from reflective_memory.errors import (
    InvalidInputError,
    ReflectiveMemoryError,
    StoreCorruptedError,
    StoreError,
    StoreUnavailableError,
)
from reflective_memory.storage.sqlite_guard import is_corruption, result_code

__all__ = ["typed_error", "typed_errors"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# SQLite result codes (low byte) of a database that cannot be used right now: busy, locked,
# out of memory, read-only, I/O error, disk full, cannot open, lock protocol.
_SQLITE_UNAVAILABLE = frozenset({5, 6, 7, 8, 10, 13, 14, 15})


def _sqlite_error(exc: sqlite3.Error) -> ReflectiveMemoryError:
    if isinstance(exc, sqlite3.DatabaseError) and is_corruption(exc):
        return StoreCorruptedError(f"the memory database is damaged ({exc})")
    if isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError)):
        return InvalidInputError(f"SQLite refused a value: {exc}")
    if isinstance(exc, sqlite3.OperationalError) and result_code(exc) in _SQLITE_UNAVAILABLE:
        return StoreUnavailableError(f"SQLite request failed: {exc}")
    return StoreError(f"SQLite error: {type(exc).__name__}: {exc}")


def _psycopg_error(exc: Exception, psycopg: Any) -> ReflectiveMemoryError | None:
    """The typed error of a psycopg error, or None when `exc` is not one."""
    if not isinstance(exc, psycopg.Error):
        return None
    errors = psycopg.errors
    if isinstance(exc, (errors.DataCorrupted, errors.IndexCorrupted)):
        return StoreCorruptedError(f"the PostgreSQL database is damaged ({exc})")
    if isinstance(exc, (psycopg.DataError, psycopg.IntegrityError)):
        return InvalidInputError(f"PostgreSQL refused a value: {exc}")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailableError(f"PostgreSQL request failed: {exc}")
    return StoreError(f"PostgreSQL error: {type(exc).__name__}: {exc}")


def typed_error(exc: Exception) -> ReflectiveMemoryError | None:
    """The library error standing for a driver or decoding error, or None for any other error.

    Example:
        >>> type(typed_error(UnicodeDecodeError("utf-8", bytes([255]), 0, 1, "bad"))).__name__
        'StoreCorruptedError'
        >>> typed_error(KeyError("a bug")) is None
        True
    """
    if isinstance(exc, ReflectiveMemoryError):
        return None
    if isinstance(exc, UnicodeEncodeError):
        return InvalidInputError(f"text is not valid Unicode ({exc.reason})")
    if isinstance(exc, UnicodeDecodeError):
        return StoreCorruptedError(f"stored text is not valid UTF-8 ({exc.reason})")
    if isinstance(exc, sqlite3.Error):
        return _sqlite_error(exc)
    psycopg = sys.modules.get("psycopg")  # loaded by the PostgreSQL store; never imported here
    return None if psycopg is None else _psycopg_error(exc, psycopg)


def typed_errors(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Raise driver and decoding errors from `method` as typed errors (`typed_error`)."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            typed = typed_error(exc)
            if typed is None:
                raise
            raise typed from exc

    return wrapper
