"""One exception hierarchy for everything the core raises on bad input or bad state."""

from __future__ import annotations

__all__ = [
    "ReflectiveMemoryError",
    "InvalidInputError",
    "InvalidFileError",
    "UnknownUserError",
    "UnknownSessionError",
    "UnknownMemoryError",
    "StoreClosedError",
    "StoreCorruptedError",
    "SessionChangedError",
    "LLMError",
    "LLMOutputError",
    "ConfigError",
    "ModelLoadError",
    "EmbeddingError",
    "StoreUnavailableError",
    "StoreError",
    "NoStoreError",
]


class ReflectiveMemoryError(Exception):
    """Base class of every error raised by reflective-memory."""


class InvalidInputError(ReflectiveMemoryError, ValueError):
    """An argument has the wrong type or an unusable value (empty text, bad role, ...)."""


class InvalidFileError(InvalidInputError):
    """A file given to read (a conversation file) is missing, too large or malformed.

    Attributes:
        path: The file.
        where: The path inside the file (`sessions[0].turns[3].text`; empty for the whole file).
        problem: What is wrong there.
    """

    def __init__(self, path: object, where: str, problem: str) -> None:
        self.path, self.where, self.problem = str(path), where, problem
        super().__init__(f"{self.path}: {where + ': ' if where else ''}{problem}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.where, self.problem))


class UnknownUserError(ReflectiveMemoryError, KeyError):
    """The named user has nothing stored."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else "unknown user"


class UnknownSessionError(ReflectiveMemoryError, KeyError):
    """The named session does not exist for that user."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown session"


class UnknownMemoryError(ReflectiveMemoryError, KeyError):
    """The named memory id does not exist for that user."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown memory"


class StoreClosedError(ReflectiveMemoryError, RuntimeError):
    """The memory store was closed; open a new ReflectiveMemory to continue."""


class StoreCorruptedError(ReflectiveMemoryError, RuntimeError):
    """The database is damaged, not a database, or vanished while its derived files remain.

    Nothing is repaired or recreated silently: restore the directory from a backup, or move it
    away to start an empty store.
    """


class SessionChangedError(ReflectiveMemoryError, RuntimeError):
    """A session's turns changed while its memories were being built (the build was discarded).

    `ReflectiveMemory.end_session` rebuilds on this; a store raises it from
    `replace_session_memories(..., fence=...)` when the fence no longer matches.
    """


class LLMError(ReflectiveMemoryError, RuntimeError):
    """The configured LLM raised or could not be called."""


class LLMOutputError(ReflectiveMemoryError, ValueError):
    """The LLM answered, but its output could not be parsed even after repair."""


class ConfigError(ReflectiveMemoryError, ValueError):
    """A configuration value is out of range or inconsistent."""


class ModelLoadError(ReflectiveMemoryError, RuntimeError):
    """A model (embedder, compressor) could not be loaded; the message says how to provide it."""


class EmbeddingError(ReflectiveMemoryError, RuntimeError):
    """The embedder raised on an input (a remote API refusing a text, say).

    The embedder's own error is the `__cause__`. A write it cannot serve stores nothing:
    `add_turn` / `add_turns` embed a turn before they commit it, so a turn the embedder
    refuses is never acknowledged, and `end_session` leaves the session open (its turns stay
    stored and searchable).
    """


class StoreUnavailableError(ReflectiveMemoryError, ConnectionError):
    """A database server backing the store could not be reached or refused the request."""


class StoreError(ReflectiveMemoryError, RuntimeError):
    """The database driver failed in a way no other error names (its error is the `__cause__`).

    Bad input, damage and an unreachable server have their own errors (`InvalidInputError`,
    `StoreCorruptedError`, `StoreUnavailableError`); this one is left for the rest, e.g. an SQL
    statement the database refused, and is worth a bug report.
    """


class NoStoreError(ReflectiveMemoryError, FileNotFoundError):
    """A call that only reads (or erases) named a store directory that holds no store.

    Reading never creates a store, so a mistyped path is reported instead of answered with an
    empty store made on the spot.
    """
