"""Any LlamaIndex `LLM` as the core's LLM (`complete` / `acomplete`, text in, text out)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ._compat import require_llama_index

require_llama_index()

from llama_index.core.llms import LLM as LlamaLLM  # noqa: E402
from reflective_memory.errors import InvalidInputError  # noqa: E402

__all__ = ["LlamaIndexLLM", "usage_from_response"]

_PROMPT_KEYS = ("prompt_tokens", "input_tokens", "prompt_token_count")
_COMPLETION_KEYS = ("completion_tokens", "output_tokens", "candidates_token_count")


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _counts(obj: Any) -> dict[str, int] | None:
    """Token counts from a mapping or object holding prompt/completion counts, else None."""
    if obj is None:
        return None
    prompt = next((_get(obj, k) for k in _PROMPT_KEYS if _get(obj, k) is not None), None)
    completion = next((_get(obj, k) for k in _COMPLETION_KEYS if _get(obj, k) is not None), None)
    if prompt is None and completion is None:
        return None
    try:
        return {"prompt_tokens": int(prompt or 0), "completion_tokens": int(completion or 0)}
    except (TypeError, ValueError):
        return None


def usage_from_response(response: Any) -> dict[str, int] | None:
    """Token counts reported with a LlamaIndex completion, if the integration gives any.

    Looks in `additional_kwargs` (several integrations put `prompt_tokens` /
    `completion_tokens` there) and in `raw` or `raw["usage"]` / `raw.usage` (OpenAI's
    `prompt_tokens`/`completion_tokens`, Anthropic's `input_tokens`/`output_tokens`, Gemini's
    `prompt_token_count`/`candidates_token_count`).

    Args:
        response: A `CompletionResponse` (or anything with those attributes).

    Returns:
        `{"prompt_tokens": int, "completion_tokens": int}` or None when nothing is reported.
    """
    found = _counts(getattr(response, "additional_kwargs", None))
    if found is not None:
        return found
    raw = getattr(response, "raw", None)
    if raw is None:
        return None
    for part in (_get(raw, "usage"), _get(raw, "usage_metadata"), raw):
        found = _counts(part)
        if found is not None:
            return found
    return None


class LlamaIndexLLM:
    """Adapter: a LlamaIndex `LLM` used as the core's LLM.

    Pass it as `ReflectiveMemory(llm=LlamaIndexLLM(llm=...))`. Chat and completion models both
    work (LlamaIndex maps `complete` onto chat for chat models). After each call `last_usage`
    holds the token counts the model reported, or None when it reported none (the core then
    estimates them).

    Args:
        llm: Any LlamaIndex LLM (`OpenAI`, `Ollama`, `MockLLM`, ...).
        complete_kwargs: Extra keyword arguments for every `complete` / `acomplete` call.

    Example:
        >>> from llama_index.core.llms import MockLLM
        >>> LlamaIndexLLM(llm=MockLLM()).complete("hello")
        'hello'
    """

    def __init__(self, *, llm: Any, complete_kwargs: dict[str, Any] | None = None) -> None:
        if not isinstance(llm, LlamaLLM):
            raise InvalidInputError(f"llm must be a llama_index.core LLM, got {type(llm).__name__}")
        self.llm = llm
        self.complete_kwargs = {} if complete_kwargs is None else dict(complete_kwargs)
        self._local = threading.local()

    @property
    def last_usage(self) -> dict[str, int] | None:
        """Token counts of this thread's last call, when the model reported them."""
        return getattr(self._local, "usage", None)

    def _done(self, response: Any) -> str:
        self._local.usage = usage_from_response(response)
        text = getattr(response, "text", None)
        if text is None:
            raise ValueError("the LlamaIndex LLM returned no text")
        return str(text)

    def complete(self, prompt: str) -> str:
        """Complete `prompt` and return the text."""
        self._local.usage = None
        return self._done(self.llm.complete(prompt, **self.complete_kwargs))

    async def acomplete(self, prompt: str) -> str:
        """Async twin of `complete`."""
        self._local.usage = None
        return self._done(await self.llm.acomplete(prompt, **self.complete_kwargs))

    def __repr__(self) -> str:
        return f"LlamaIndexLLM(llm={type(self.llm).__name__})"
