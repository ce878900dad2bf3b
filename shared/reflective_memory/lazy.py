"""Lazy package exports (PEP 562): a package names its public objects without importing them.

Packages whose modules pull heavy libraries (torch, FAISS, transformers) export through this, so
importing one light module of theirs (a stage's config, say) stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports", "LazyModule"]


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


class LazyModule:
    """A module imported on first attribute access (`torch = LazyModule("torch")`).

    A module whose only heavy import is used inside functions keeps its import light this way;
    type checkers should see the real import (`if TYPE_CHECKING: import torch`).

    Args:
        name: The module's full name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"LazyModule({self._name!r})"
