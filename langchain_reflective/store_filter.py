"""Filters of `ReflectiveStore` searches and namespace listings, as LangGraph's stores read them.

A search filter compares an item's value field by field: exact match, nested dicts, lists, and
the operators `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`. A namespace match condition is a
prefix or suffix path where `*` matches any one element.
"""

from __future__ import annotations

from typing import Any

from langgraph.store.base import MatchCondition
from reflective_memory.errors import InvalidInputError

__all__ = ["check_filter", "matches", "path_matches"]

_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


def _compare(actual: Any, wanted: Any) -> bool:
    """Whether an item's field value satisfies one filter entry."""
    if isinstance(wanted, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(actual, op, arg) for op, arg in wanted.items())
        return isinstance(actual, dict) and all(
            _compare(actual.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted


def _operator(actual: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return actual == arg
    if op == "$ne":
        return actual != arg
    if op not in _OPERATORS:
        raise InvalidInputError(f"unsupported filter operator {op!r}; use one of {_OPERATORS}")
    try:
        a, b = float(actual), float(arg)
    except (TypeError, ValueError):
        return False
    if op == "$gt":
        return a > b
    if op == "$gte":
        return a >= b
    if op == "$lt":
        return a < b
    return a <= b


def check_filter(flt: Any) -> None:
    """Refuse filter operators the store does not know, before any item is compared."""
    if isinstance(flt, dict):
        for k, v in flt.items():
            if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                raise InvalidInputError(
                    f"unsupported filter operator {k!r}; use one of {_OPERATORS}"
                )
            check_filter(v)


def matches(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    """Whether an item's value passes a search filter (`None` or `{}`: every value does)."""
    return not flt or all(_compare(value.get(k), v) for k, v in flt.items())


def path_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether a namespace meets a `list_namespaces` prefix or suffix condition."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))
