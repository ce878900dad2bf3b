"""Any LangChain language model as the core's LLM.

`LangChainLLM` gives `reflective_memory.ReflectiveMemory` (segmentation, reflection, conditional
memory) the
`complete` / `acomplete` interface it expects, backed by a `BaseChatModel` or `BaseLLM`. When the
model reports `usage_metadata`, the token counts are exposed as `last_usage`, which the core's
`LLMClient` reads into its `Usage` report instead of estimating.
"""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import BaseMessage
from reflective_memory.errors import InvalidInputError, LLMError

__all__ = ["LangChainLLM"]


class LangChainLLM:
    """Adapter from a LangChain language model to the core's LLM protocol.

    Args:
        model: Any `BaseChatModel` or `BaseLLM` (a `BaseLanguageModel`).
        **invoke_kwargs: Extra keyword arguments for every `invoke` (e.g. `stop`).

    Example:
        >>> from langchain_core.language_models import FakeListChatModel
        >>> llm = LangChainLLM(FakeListChatModel(responses=["hello"]))
        >>> llm.complete("Say hello")
        'hello'
    """

    def __init__(self, model: BaseLanguageModel, **invoke_kwargs: Any) -> None:
        if not isinstance(model, BaseLanguageModel):
            raise InvalidInputError(
                f"model must be a LangChain BaseLanguageModel, got {type(model).__name__}"
            )
        self.model = model
        self.invoke_kwargs = invoke_kwargs
        self._local = threading.local()

    @property
    def last_usage(self) -> dict[str, int] | None:
        """Token counts of this thread's last call (`prompt_tokens`, `completion_tokens`).

        `None` when the model did not report usage (the core then estimates).
        """
        return getattr(self._local, "usage", None)

    def _convert(self, out: Any) -> str:
        usage = None
        if isinstance(out, BaseMessage):
            meta = getattr(out, "usage_metadata", None)
            if meta:
                usage = {
                    "prompt_tokens": int(meta.get("input_tokens") or 0),
                    "completion_tokens": int(meta.get("output_tokens") or 0),
                }
            text = str(out.text)
        elif isinstance(out, str):
            text = out
        else:
            raise LLMError(f"the model returned {type(out).__name__}, not a message or text")
        self._local.usage = usage
        return text

    def complete(self, prompt: str) -> str:
        """Send `prompt` as one user message and return the text of the reply."""
        self._local.usage = None
        return self._convert(self.model.invoke(prompt, **self.invoke_kwargs))

    async def acomplete(self, prompt: str) -> str:
        """Async twin of `complete` (uses the model's own `ainvoke`)."""
        self._local.usage = None
        return self._convert(await self.model.ainvoke(prompt, **self.invoke_kwargs))

    def __repr__(self) -> str:
        return f"LangChainLLM({type(self.model).__name__})"
