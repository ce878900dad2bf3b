"""Argument checks shared by the public API: bad input fails before any work is done."""

from __future__ import annotations

from typing import Any

from reflective_memory.errors import InvalidInputError

__all__ = [
    "check_id",
    "check_positive",
    "check_role",
    "check_encodable",
    "role_or",
    "MAX_ID_CHARS",
    "MAX_ROLE_CHARS",
]

#: Longest accepted id (user, session, turn, role).
MAX_ID_CHARS = 512
#: Longest accepted speaker label.
MAX_ROLE_CHARS = 64


def check_encodable(name: str, value: str) -> str:
    """Check that a str can be stored as UTF-8 (no lone surrogates); return it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{name} is not valid Unicode text (lone surrogate at index {exc.start})"
        ) from None
    return value


def check_id(name: str, value: Any) -> str:
    """Check that an id is a non-blank str of at most `MAX_ID_CHARS`; return it."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInputError(f"{name} is longer than {MAX_ID_CHARS} characters")
    return check_encodable(name, value)


def check_role(value: Any) -> str:
    """Check a speaker label: one printable line of at most `MAX_ROLE_CHARS`, no brackets.

    Labels are shown to LLMs as `role: text`; a newline, control character, bracket or colon
    in a label could make a prompt show a turn that was never said.
    """
    check_id("role", value)
    if len(value) > MAX_ROLE_CHARS:
        raise InvalidInputError(f"role is longer than {MAX_ROLE_CHARS} characters")
    bad = [c for c in value if not c.isprintable() or c in "[]{}<>:|\\"]
    if bad:
        raise InvalidInputError(
            f"role {value!r} contains {bad[0]!r}; a speaker label is one line without "
            "control characters, brackets, colons or bars"
        )
    return value


def role_or(name: Any, fallback: str) -> str:
    """A speaker `name` as a role when it is a valid label (`check_role`), else `fallback`.

    Framework messages may carry the speaker's name (LangChain `name`, LlamaIndex message
    metadata); it is stored as the turn's role so questions naming that person find its turns.

    Example:
        >>> role_or("Kate", "user"), role_or("Kate: hi", "user"), role_or(None, "assistant")
        ('Kate', 'user', 'assistant')
    """
    if isinstance(name, str) and name.strip():
        try:
            return check_role(name.strip())
        except InvalidInputError:
            pass
    return fallback


def check_positive(name: str, value: Any) -> int | None:
    """Check that `value` is None or a positive int; return it."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer or None, got {value!r}")
    return value
