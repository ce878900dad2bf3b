"""Argument checks shared by the public API: bad input fails before any work is done.

One layer for both backends: every public method of `ReflectiveMemory` checks its arguments
with these functions before any store call, so a hostile value (wrong type, NUL, lone
surrogate, blank id) is an `InvalidInputError` on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from reflective_memory.errors import InvalidInputError

__all__ = [
    "check_id",
    "check_ids",
    "check_optional_id",
    "check_optional_ids",
    "check_str",
    "check_storable",
    "check_text",
    "check_query",
    "check_texts",
    "check_flag",
    "check_choice",
    "check_numbers",
    "check_numbering",
    "check_json_object",
    "check_positive",
    "check_role",
    "check_encodable",
    "canonical_role",
    "role_or",
    "ROLE_ALIASES",
    "message_time",
    "json_strings",
    "MESSAGE_TIME_KEY",
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
    """Check that an id is a non-blank str of at most `MAX_ID_CHARS`, no NUL; return it.

    Example:
        >>> check_id("user_id", "ana")
        'ana'
        >>> check_id("user_id", "a" + chr(0))
        Traceback (most recent call last):
        ...
        reflective_memory.errors.InvalidInputError: user_id contains a NUL character (0x00)
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInputError(f"{name} is longer than {MAX_ID_CHARS} characters")
    if "\x00" in value:
        raise InvalidInputError(f"{name} contains a NUL character (0x00)")
    return check_encodable(name, value)


def check_optional_id(name: str, value: Any) -> str | None:
    """`check_id` that lets None through."""
    return None if value is None else check_id(name, value)


def _items(name: str, values: Any) -> list[Any]:
    """The items of a collection argument (not a str, bytes or mapping), as a list."""
    if isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise InvalidInputError(f"{name} must be a collection, got {type(values).__name__}")
    return list(values)


def check_ids(name: str, values: Any) -> list[str]:
    """Check a collection of ids (not a str or bytes; each passes `check_id`); return a list.

    Example:
        >>> check_ids("turn_ids", ("t1", "t2"))
        ['t1', 't2']
        >>> check_ids("turn_ids", "t1")
        Traceback (most recent call last):
        ...
        reflective_memory.errors.InvalidInputError: turn_ids must be a collection, got str
    """
    return [check_id(f"{name}[{i}]", v) for i, v in enumerate(_items(name, values))]


def check_optional_ids(name: str, values: Any) -> list[str | None]:
    """`check_ids` whose items may also be None."""
    return [check_optional_id(f"{name}[{i}]", v) for i, v in enumerate(_items(name, values))]


def check_text(name: str, value: Any) -> str:
    """Check that `value` is a non-blank str, without NUL, that can be stored as UTF-8.

    PostgreSQL cannot store a NUL in text; it is refused on every backend alike.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty or whitespace")
    if "\x00" in value:
        raise InvalidInputError(f"{name} contains a NUL character (0x00)")
    return check_encodable(name, value)


def check_query(value: Any, max_chars: int) -> str:
    """Check a search query: `check_text`, and at most `max_chars` characters; return it.

    Raises:
        InvalidInputError: Not a non-blank str, or longer than `max_chars` (the message names
            `max_query_chars`, the setting that bounds it).

    Example:
        >>> check_query("why do dogs bark", 20_000)
        'why do dogs bark'
    """
    check_text("query", value)
    if len(value) > max_chars:
        raise InvalidInputError(
            f"query has {len(value):,} characters, more than max_query_chars={max_chars:,}"
        )
    return value


def check_str(name: str, value: Any) -> str:
    """Check that `value` is a str (blank allowed) that can be stored as UTF-8; return it."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    return check_encodable(name, value)


def check_storable(name: str, value: Any) -> str:
    """`check_str` that also refuses a NUL: a str (blank allowed) both backends can store.

    PostgreSQL cannot store a NUL in text, so a field the API may leave blank (a memory's
    key) is still refused one.

    Example:
        >>> check_storable("key", "")
        ''
        >>> check_storable("key", "a" + chr(0))
        Traceback (most recent call last):
        ...
        reflective_memory.errors.InvalidInputError: key contains a NUL character (0x00)
    """
    check_str(name, value)
    if "\x00" in value:
        raise InvalidInputError(f"{name} contains a NUL character (0x00)")
    return value


def check_texts(name: str, values: Any) -> list[str]:
    """Check a collection of str (each encodable, blank allowed); return it as a list."""
    return [check_str(f"{name}[{i}]", v) for i, v in enumerate(_items(name, values))]


def check_flag(name: str, value: Any) -> bool | None:
    """Check that `value` is a bool or None; return it."""
    if value is not None and not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be True, False or None, got {type(value).__name__}")
    return value


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """Check that `value` is one of `choices`; return it."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidInputError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_numbers(name: str, values: Any) -> list[int]:
    """Check a collection of non-negative ints (citation numbers, positions); return a list."""
    out = _items(name, values)
    if not all(_is_int(v) and v >= 0 for v in out):
        raise InvalidInputError(f"{name} must hold non-negative integers, got {out!r:.80}")
    return out


def check_numbering(name: str, value: Any) -> dict[int, int | None] | None:
    """Check a mapping of non-negative int -> non-negative int or None (or None); return it."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{name} must be a mapping or None, got {type(value).__name__}")
    for k, v in value.items():
        if not (_is_int(k) and k >= 0) or not (v is None or (_is_int(v) and v >= 0)):
            raise InvalidInputError(
                f"{name} must map non-negative integers to non-negative integers or None, "
                f"got {k!r}: {v!r}"
            )
    return dict(value)


#: The names of the two sides of a chat, in any case, and the role each is stored as. Every
#: surface maps them alike: `add_turn` / `add_turns` (so the LangChain and LlamaIndex adapters and
#: MCP `remember`), and conversation files and chat logs read by `reflective_memory.io`. The
#: names are those of the common formats: LangChain's message types (`human`, `ai`), LlamaIndex's
#: `MessageRole` (`chatbot`, `model`), Gemini's `model`, chat exports' `User` / `Assistant` /
#: `bot`. Any other label (`system`, `tool`, a speaker's name such as `Kate`) is stored as given.
ROLE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "user": "user",
        "human": "user",
        "assistant": "assistant",
        "ai": "assistant",
        "bot": "assistant",
        "chatbot": "assistant",
        "model": "assistant",
    }
)


def canonical_role(value: str) -> str:
    """The role a label is stored as: `user` / `assistant` for their aliases, else the label.

    Example:
        >>> canonical_role("Human"), canonical_role("AI"), canonical_role("Kate")
        ('user', 'assistant', 'Kate')
    """
    return ROLE_ALIASES.get(value.strip().casefold(), value)


def check_role(value: Any) -> str:
    """Check a speaker label; return the role it is stored as (`canonical_role`).

    A label is one printable line of at most `MAX_ROLE_CHARS`, without brackets, colons or
    bars. Labels are shown to LLMs as `role: text`; a newline, control character, bracket or
    colon in a label could make a prompt show a turn that was never said.

    Example:
        >>> check_role("User"), check_role("bot"), check_role("Kate")
        ('user', 'assistant', 'Kate')
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
    return canonical_role(value)


def role_or(name: Any, fallback: str) -> str:
    """A speaker `name` as a role when it is a valid label (`check_role`), else `fallback`.

    Framework messages may carry the speaker's name (LangChain `name`, LlamaIndex message
    metadata); it is stored as the turn's role so questions naming that person find its turns.
    A name that is a role alias (`ROLE_ALIASES`: `User`, `AI`, ...) names no person: the
    message's own role (`fallback`) is kept, so a human message named `Bot` stays the user's.

    Example:
        >>> role_or("Kate", "user"), role_or("Kate: hi", "user"), role_or(None, "assistant")
        ('Kate', 'user', 'assistant')
        >>> role_or("Bot", "user"), role_or("User", "user")
        ('user', 'user')
    """
    if isinstance(name, str) and name.strip() and name.strip().casefold() not in ROLE_ALIASES:
        try:
            return check_role(name.strip())
        except InvalidInputError:
            pass
    return fallback


#: Where a framework message carries its own time: LangChain `additional_kwargs`, LlamaIndex
#: `additional_kwargs` (a datetime, Unix seconds or a date string).
MESSAGE_TIME_KEY = "timestamp"


def message_time(kwargs: Any) -> Any:
    """A framework message's own time from its extra fields, else None.

    Every surface reads a message's time the same way; a turn stored without one takes its
    conversation's time (`ReflectiveMemory.turn_time`).

    Example:
        >>> message_time({"timestamp": "2025-03-01T09:30:00"}), message_time({}), message_time(None)
        ('2025-03-01T09:30:00', None, None)
    """
    if not isinstance(kwargs, Mapping):
        return None
    return kwargs.get(MESSAGE_TIME_KEY)


def check_positive(name: str, value: Any) -> int | None:
    """Check that `value` is None or a positive int; return it."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def json_strings(value: Any) -> Iterator[str]:
    """Every str in a JSON value: keys and values, nested.

    Example:
        >>> list(json_strings({"a": ["b", {"c": 1}]}))
        ['a', 'b', 'c']
    """
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from json_strings(k)
            yield from json_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from json_strings(v)


def check_json_object(name: str, value: Any) -> dict[str, Any] | None:
    """Check that `value` is None or a dict both backends store as JSON; return it.

    JSON here is strict: no NaN or infinity, and no NUL or lone surrogate in any string
    (PostgreSQL's `jsonb` refuses them).

    Example:
        >>> check_json_object("metadata", {"tags": ["a", "b"], "n": 1})
        {'tags': ['a', 'b'], 'n': 1}
        >>> check_json_object("metadata", {"x": ["a" + chr(0)]})
        Traceback (most recent call last):
        ...
        reflective_memory.errors.InvalidInputError: metadata contains a NUL character (0x00)
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{name} must be a dict or None, got {type(value).__name__}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{name} is not JSON: {exc}") from exc
    for text in json_strings(value):
        if "\x00" in text:
            raise InvalidInputError(f"{name} contains a NUL character (0x00)")
        check_encodable(name, text)
    return value
