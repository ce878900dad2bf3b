"""The LLM protocol the core talks to, adapters for plain callables, and usage accounting.

Any of these is accepted wherever the core takes an `llm`:

* a callable `prompt -> str`;
* an object with `complete(prompt) -> str` (and optionally `async acomplete(prompt) -> str`);
* an `LLM` built here.

LLM-backed steps always go through `LLMClient.complete`, which counts calls, characters and
tokens into a `Usage`, and turns exceptions into `LLMError` so callers can fall back offline.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from reflective_memory.errors import InvalidInputError, LLMError
from reflective_memory.types import Usage

__all__ = ["LLM", "LLMClient", "as_llm", "count_tokens"]

logger = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def count_tokens(text: str) -> int:
    """Estimate a text's token count: one token per word and per punctuation mark.

    This is the counting rule used for every token budget in the library. It is within about
    10-25% of common BPE tokenizers on English chat text, needs no model, and is deterministic.

    Args:
        text: Any text.

    Returns:
        The number of word and punctuation pieces.

    Example:
        >>> count_tokens("I moved to Berlin, last year.")
        8
    """
    return len(_TOKEN_RE.findall(text))


@runtime_checkable
class LLM(Protocol):
    """What the core needs from a language model: text in, text out."""

    def complete(self, prompt: str) -> str:
        """Return the model's completion of `prompt`."""
        ...


class LLMClient:
    """Wraps any supported LLM object, counts usage and normalises failures.

    Args:
        llm: A callable `prompt -> str`, or an object with `complete` (and maybe `acomplete`).
            Objects may also expose `last_usage` (a dict with `prompt_tokens` /
            `completion_tokens`) after a call; the framework adapters do.
    """

    def __init__(self, llm: Any) -> None:
        if isinstance(llm, LLMClient):
            llm = llm.llm
        has_complete = callable(getattr(llm, "complete", None))
        if not has_complete and not callable(llm):
            raise InvalidInputError(
                "llm must be a callable prompt -> str or an object with complete(prompt) -> str, "
                f"got {type(llm).__name__}"
            )
        self.llm = llm
        self._sync: Callable[[str], Any] = llm.complete if has_complete else llm
        acomplete = getattr(llm, "acomplete", None)
        self._async: Callable[[str], Awaitable[Any]] | None = (
            acomplete if callable(acomplete) else None
        )
        self.usage = Usage()
        self._lock = threading.Lock()

    def _record(self, prompt: str, out: str | None, usage: Usage | None) -> None:
        with self._lock:
            for u in (self.usage, usage):
                if u is None:
                    continue
                u.llm_calls += 1
                u.prompt_chars += len(prompt)
                if out is None:
                    u.failures += 1
                    continue
                u.completion_chars += len(out)
                reported = getattr(self.llm, "last_usage", None)
                if isinstance(reported, dict) and reported.get("prompt_tokens") is not None:
                    u.prompt_tokens += int(reported.get("prompt_tokens") or 0)
                    u.completion_tokens += int(reported.get("completion_tokens") or 0)
                else:
                    u.prompt_tokens += count_tokens(prompt)
                    u.completion_tokens += count_tokens(out)

    @staticmethod
    def _text(out: Any) -> str:
        if isinstance(out, str):
            return out
        for attr in ("text", "content"):
            val = getattr(out, attr, None)
            if isinstance(val, str):
                return val
        if out is None:
            raise LLMError("the LLM returned None")
        return str(out)

    def complete(self, prompt: str, usage: Usage | None = None) -> str:
        """Call the LLM once.

        Args:
            prompt: The prompt.
            usage: An operation-level `Usage` to add this call to (the client keeps its own total).

        Returns:
            The completion text.

        Raises:
            LLMError: The LLM raised or returned nothing usable.
        """
        try:
            out = self._text(self._sync(prompt))
        except Exception as exc:
            self._record(prompt, None, usage)
            logger.warning("LLM call failed: %s", exc)
            raise LLMError(f"LLM call failed: {exc}") from exc
        self._record(prompt, out, usage)
        return out

    async def acomplete(self, prompt: str, usage: Usage | None = None) -> str:
        """Async twin of `complete`; runs a sync-only LLM in a worker thread."""
        try:
            if self._async is not None:
                out = self._text(await self._async(prompt))
            else:
                out = self._text(await asyncio.to_thread(self._sync, prompt))
        except Exception as exc:
            self._record(prompt, None, usage)
            logger.warning("LLM call failed: %s", exc)
            raise LLMError(f"LLM call failed: {exc}") from exc
        self._record(prompt, out, usage)
        return out


def as_llm(llm: Any | None) -> LLMClient | None:
    """Wrap an LLM-like object in an `LLMClient`; `None` stays `None` (offline)."""
    if llm is None:
        return None
    return LLMClient(llm)
