"""Checks the per-stage configs share: each stage's frozen config validates its own fields.

Every check raises `ConfigError` naming the field as `group.field`, before anything is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from reflective_memory.errors import ConfigError

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_names",
    "check_fields",
    "coerce",
    "set_field",
]

C = TypeVar("C")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_bool(name: str, value: Any) -> None:
    """`value` must be True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


def check_int(name: str, value: Any, low: int = 1, *, optional: bool = False) -> None:
    """`value` must be an int `>= low` (or None when `optional`)."""
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        none = "None or " if optional else ""
        raise ConfigError(f"{name} must be {none}an integer >= {low}, got {value!r}")


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    optional: bool = False,
) -> None:
    """`value` must be a number in `[low, high]` (`(low, high]` with `open_low`)."""
    if optional and value is None:
        return
    ok = _is_number(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        lo = "" if low is None else (f"> {low}" if open_low else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        bounds = " and ".join(b for b in (lo, hi) if b) or "any number"
        none = "None or " if optional else ""
        raise ConfigError(f"{name} must be {none}a number {bounds}, got {value!r}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """`value` must be one of `choices`."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")


def check_names(
    name: str, value: Any, allowed: Iterable[str] | None = None, *, distinct: bool = True
) -> tuple[str, ...]:
    """A str or an iterable of non-empty strs (from `allowed`), as a tuple."""
    if isinstance(value, str):
        value = (value,)
    try:
        out = tuple(value)
    except TypeError:
        raise ConfigError(f"{name} must be a sequence of names, got {value!r}") from None
    ok = all(isinstance(v, str) and v for v in out)
    if ok and allowed is not None:
        allowed = tuple(allowed)
        ok = all(v in allowed for v in out)
    if ok and distinct:
        ok = len(set(out)) == len(out)
    if not ok:
        choose = f" from {tuple(allowed)}" if allowed is not None else ""
        raise ConfigError(f"{name} must be distinct names{choose}, got {value!r}")
    return out


def set_field(obj: Any, name: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass inside its `__post_init__`."""
    object.__setattr__(obj, name, value)


def check_fields(cls: type, names: Iterable[str], group: str) -> None:
    """Every name must be a field of the config class `cls`.

    A name the class lists in its `RETIRED` mapping (an old field -> what took its place)
    raises `ConfigError` saying so; any other unknown name raises one listing the fields.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(names) - known)
    retired: Mapping[str, str] = getattr(cls, "RETIRED", {})
    for name in unknown:
        if name in retired:
            raise ConfigError(f"{group}.{name} {retired[name]}")
    if unknown:
        raise ConfigError(f"unknown {group} settings: {unknown}; known: {sorted(known)}")


def coerce(cls: type[C], value: Any, name: str) -> C:
    """An instance of the config class `cls` from an instance, a dict of fields or None.

    A dict gives only the fields it changes; unknown keys raise `ConfigError` naming them
    (`check_fields`).
    """
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        check_fields(cls, value, name)
        return cls(**value)
    raise ConfigError(f"{name} must be a {cls.__name__} or a dict of its fields, got {value!r}")
