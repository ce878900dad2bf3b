"""Load the chat LLM named on the command line as `module:factory`.

The factory (a function or class, called without arguments) or the attribute itself may be a
LangChain language model, a LlamaIndex LLM, or anything `reflective_memory.llm.as_llm` accepts
(a callable `prompt -> str` or an object with `complete`). Framework models are wrapped in their
adapters (`langchain_reflective.LangChainLLM`, `llamaindex_reflective.LlamaIndexLLM`); the
frameworks are imported only when the object comes from them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from reflective_memory.errors import ConfigError

__all__ = ["load_llm", "adapt_llm"]


def _from_framework(obj: Any, module_prefix: str) -> bool:
    return any(
        (getattr(k, "__module__", "") or "").startswith(module_prefix) for k in type(obj).__mro__
    )


def adapt_llm(obj: Any) -> Any:
    """Wrap a LangChain or LlamaIndex model in its adapter; return other LLM objects as they are.

    Raises:
        ConfigError: The object is no model the core can call.
    """
    if _from_framework(obj, "langchain_core") and "langchain_core" in sys.modules:
        from langchain_core.language_models import BaseLanguageModel

        if isinstance(obj, BaseLanguageModel):
            from langchain_reflective.llm import LangChainLLM

            return LangChainLLM(obj)
    if _from_framework(obj, "llama_index") and "llama_index.core" in sys.modules:
        from llama_index.core.llms import LLM as LlamaLLM

        if isinstance(obj, LlamaLLM):
            from llamaindex_reflective.llm import LlamaIndexLLM

            return LlamaIndexLLM(llm=obj)
    if callable(getattr(obj, "complete", None)) or callable(obj):
        return obj
    raise ConfigError(
        f"the --llm factory returned a {type(obj).__name__}: expected a LangChain chat model, "
        "a LlamaIndex LLM, a callable prompt -> str or an object with complete(prompt)"
    )


def _takes_arguments(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in params
    )


def load_llm(spec: str) -> Any:
    """Import `module:factory`, call the factory and adapt what it returns.

    Args:
        spec: `package.module:name`; `name` is a function or class called without arguments,
            a ready model object, or a function `prompt -> str` (one required argument).

    Returns:
        An LLM object the core accepts.

    Raises:
        ConfigError: The spec is malformed, the module or name is missing, or the factory
            raised or returned something that is no LLM.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"--llm must look like package.module:factory, got {spec!r}")
    module_name, attr = (part.strip() for part in spec.split(":"))
    if not module_name or not attr:
        raise ConfigError(f"--llm must look like package.module:factory, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--llm: cannot import module {module_name!r}: {exc}") from exc
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--llm: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if (inspect.isfunction(target) or inspect.ismethod(target)) and _takes_arguments(target):
        return adapt_llm(target)  # a `prompt -> str` function is the LLM itself
    if inspect.isfunction(target) or inspect.isclass(target) or inspect.ismethod(target):
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"--llm: calling {spec} failed: {exc}") from exc
    return adapt_llm(target)
