"""`reflective-memory serve`: a local web app to inspect, search, chat with and prune memories.

Needs the `serve` extra (FastAPI, uvicorn, Jinja2). Modules: `app` (the application factory),
`pages` and `api` (routes), `rendering` (templates), `inspect` (reads and verified deletes),
`views` (JSON-ready views of memories and retrievals), `chat` (turns, retrieval, answers,
feedback), `answer` (offline extractive and LLM answerers), `llm_spec` (`--llm module:factory`),
`security` (tokens, CSRF, binds), `context` (per-request helpers), `server` (the command) and
`mcp` (`reflective-memory mcp`, the Model Context Protocol server; needs the `mcp` extra).

Example:
    >>> from reflective_memory import HashingEmbedder, ReflectiveMemory
    >>> from reflective_memory.serve import create_app
    >>> app = create_app(ReflectiveMemory(embedder=HashingEmbedder()))
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":  # imported on use: the package itself imports no web framework
        from reflective_memory.serve.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
