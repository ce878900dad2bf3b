"""The guarded LlamaIndex import: a clear install message when `llama-index-core` is missing."""

from __future__ import annotations

__all__ = ["INSTALL_HINT", "require_llama_index"]

INSTALL_HINT = (
    "llamaindex_reflective needs LlamaIndex (llama-index-core>=0.14,<0.15): "
    "pip install reflective-memory[llamaindex]"
)


def require_llama_index() -> None:
    """Import `llama_index.core` or raise `ImportError` that says how to install it.

    Raises:
        ImportError: LlamaIndex is not installed.
    """
    try:
        import llama_index.core  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
