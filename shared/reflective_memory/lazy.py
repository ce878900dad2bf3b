"""Lazy package exports (PEP 562): a package names its public objects without importing them.

Packages whose modules pull heavy libraries (torch, FAISS, transformers) export through this, so
importing one light module of theirs (a stage's config, say) stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a package that imports its exports on first access.

    Args:
        package: The package's `__name__`.
        exports: Public name -> module (relative to the package, e.g. `".reranker"`).
        namespace: The package's `globals()`; loaded names are cached there.

    Returns:
        The package's `__getattr__` and `__dir__`.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
