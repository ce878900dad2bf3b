"""The LLM protocol the core talks to, adapters for plain callables, and usage accounting.

Any of these is accepted wherever the core takes an `llm`:

* a callable `prompt -> str`;
* an object with `complete(prompt) -> str` (and optionally `async acomplete(prompt) -> str`);
* an `LLM` built here.

LLM-backed steps always go through `LLMClient.complete`, which counts calls, characters and
tokens into a `Usage`, bounds every call in time (`timeout_s`) and size (`max_chars`), and turns
exceptions and timeouts into `LLMError` so callers can fall back offline. With a tracer provider
set, each call is a `text_completion` span with its token usage (`reflective_memory.tracing`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from reflective_memory import tracing
from reflective_memory.errors import InvalidInputError, LLMError
from reflective_memory.settings import check_int, check_number
from reflective_memory.types import Usage

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["LLM", "LLMClient", "LLMConfig", "as_llm", "count_tokens"]

logger = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
#: ASCII characters `_TOKEN_RE` counts one by one (neither word characters nor spaces).
_PUNCT = bytes(c for c in range(128) if not (chr(c).isalnum() or chr(c) in "_" or chr(c).isspace()))
_SPACES = bytes(c for c in range(128) if chr(c).isspace())
_BLANKS = bytes.maketrans(_PUNCT + _SPACES, b" " * (len(_PUNCT) + len(_SPACES)))


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
    if text.isascii():  # the same count without the regex: punctuation and spaces to blanks
        raw = text.encode("ascii")
        return len(raw.translate(_BLANKS).split()) + len(raw) - len(raw.translate(None, _PUNCT))
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class LLMConfig:
    """Bounds on every LLM call a `ReflectiveMemory` makes.

    Attributes:
        timeout_s: Longest wait for one call, in seconds; a call that takes longer counts as
            failed and its step falls back offline (`None`: wait forever).
        max_chars: Longest reply used; a longer one is cut to this many characters before
            parsing (lenient parsers read what fits; the rest is repaired offline).
    """

    timeout_s: float | None = 60.0
    max_chars: int = 200_000

    def __post_init__(self) -> None:
        check_number("llm.timeout_s", self.timeout_s, 0, open_low=True, optional=True)
        check_int("llm.max_chars", self.max_chars)


@runtime_checkable
class LLM(Protocol):
    """What the core needs from a language model: text in, text out."""

    def complete(self, prompt: str) -> str:
        """Return the model's completion of `prompt`."""
        ...


def _model_name(llm: Any) -> str | None:
    """The model's name for traces (`gen_ai.request.model`), when the object tells it."""
    for obj in (llm, getattr(llm, "model", None)):
        for field in ("model_name", "model", "model_id"):
            name = getattr(obj, field, None)
            if isinstance(name, str) and name:
                return name
    return None


class LLMClient:
    """Wraps any supported LLM object, counts usage, bounds calls and normalises failures.

    A sync call runs in a daemon worker thread and is abandoned after `timeout_s` (Python
    cannot stop a thread: the call finishes in the background and its answer is dropped); an
    async call is cancelled. Either way it counts as a failure and raises `LLMError`.

    Args:
        llm: A callable `prompt -> str`, or an object with `complete` (and maybe `acomplete`).
            Objects may also expose `last_usage` (a dict with `prompt_tokens` /
            `completion_tokens`) after a call; the framework adapters do. Another `LLMClient`
            is unwrapped (its bounds are kept unless given here).
        timeout_s: Longest wait for one call in seconds (`None`: no limit).
        max_chars: Longest reply used; longer replies are cut to this length (`None`: no cut).
    """

    llm: Any
    timeout_s: float | None
    max_chars: int | None

    def __init__(
        self, llm: Any, *, timeout_s: float | None = None, max_chars: int | None = None
    ) -> None:
        if isinstance(llm, LLMClient):
            timeout_s = llm.timeout_s if timeout_s is None else timeout_s
            max_chars = llm.max_chars if max_chars is None else max_chars
            llm = llm.llm
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0
        ):
            raise InvalidInputError(f"timeout_s must be None or > 0, got {timeout_s!r}")
        if max_chars is not None and (
            isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1
        ):
            raise InvalidInputError(f"max_chars must be None or a positive int, got {max_chars!r}")
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.max_chars = max_chars
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
        model = _model_name(llm)
        self._span_name = "text_completion" if model is None else f"text_completion {model}"
        self._span_attributes = {"gen_ai.operation.name": "text_completion"}
        if model is not None:
            self._span_attributes["gen_ai.request.model"] = model

    def _span(self) -> AbstractContextManager[Span | None]:
        """The span of one call (`reflective_memory.tracing`)."""
        return tracing.span(self._span_name, self._span_attributes, kind="client")

    def _failed(self, prompt: str, usage: Usage | None, exc: Exception) -> LLMError:
        """Count and log a failed call; the error to raise from `exc`."""
        self._record(prompt, None, usage)
        logger.warning("LLM call failed: %s", exc)
        return LLMError(f"LLM call failed: {exc}")

    def _record(
        self, prompt: str, out: str | None, usage: Usage | None, span: Span | None = None
    ) -> None:
        """Count one call into the usages (and its tokens into its span)."""
        counted = None
        if out is not None:
            reported = getattr(self.llm, "last_usage", None)
            if isinstance(reported, dict) and reported.get("prompt_tokens") is not None:
                try:
                    counted = (
                        int(reported.get("prompt_tokens") or 0),
                        int(reported.get("completion_tokens") or 0),
                    )
                except (TypeError, ValueError):
                    counted = None  # unusable report: count ourselves
            if counted is None:
                counted = (count_tokens(prompt), count_tokens(out))
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
                assert counted is not None
                u.prompt_tokens += counted[0]
                u.completion_tokens += counted[1]
        if counted is not None:
            tracing.describe(span, tracing.usage_attributes, *counted)

    def _text(self, out: Any) -> str:
        if not isinstance(out, str):
            for attr in ("text", "content"):
                val = getattr(out, attr, None)
                if isinstance(val, str):
                    out = val
                    break
            else:
                if out is None:
                    raise LLMError("the LLM returned None")
                out = str(out)
        if self.max_chars is not None and len(out) > self.max_chars:
            logger.warning("LLM reply of %d characters cut to %d", len(out), self.max_chars)
            out = out[: self.max_chars]
        try:
            out.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates cannot be stored: mark them as unknown
            out = out.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return out

    def _bounded(self, prompt: str) -> Any:
        """Call the sync LLM, giving up after `timeout_s`."""
        if self.timeout_s is None:
            return self._sync(prompt)
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["out"] = self._sync(prompt)
            except BaseException as exc:  # handed to the caller below
                box["exc"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name="reflective-memory-llm", daemon=True).start()
        if not done.wait(self.timeout_s):
            raise TimeoutError(f"no answer within {self.timeout_s:g} s")
        if "exc" in box:
            raise box["exc"]
        return box["out"]

    def complete(self, prompt: str, usage: Usage | None = None) -> str:
        """Call the LLM once.

        Args:
            prompt: The prompt.
            usage: An operation-level `Usage` to add this call to (the client keeps its own total).

        Returns:
            The completion text.

        Raises:
            LLMError: The LLM raised, timed out or returned nothing usable.
        """
        with self._span() as span:
            try:
                out = self._text(self._bounded(prompt))
            except Exception as exc:
                raise self._failed(prompt, usage, exc) from exc
            self._record(prompt, out, usage, span)
        return out

    async def acomplete(self, prompt: str, usage: Usage | None = None) -> str:
        """Async twin of `complete`; runs a sync-only LLM in a worker thread."""
        with self._span() as span:
            try:
                if self._async is not None:
                    out = self._text(await asyncio.wait_for(self._async(prompt), self.timeout_s))
                else:
                    out = self._text(await asyncio.to_thread(self._bounded, prompt))
            except Exception as exc:
                raise self._failed(prompt, usage, exc) from exc
            self._record(prompt, out, usage, span)
        return out


def as_llm(
    llm: Any | None, *, timeout_s: float | None = None, max_chars: int | None = None
) -> LLMClient | None:
    """Wrap an LLM-like object in an `LLMClient`; `None` stays `None` (offline).

    An `LLMClient` given without new bounds is returned as it is (its usage counts go on).
    """
    if llm is None:
        return None
    if isinstance(llm, LLMClient) and timeout_s is None and max_chars is None:
        return llm
    return LLMClient(llm, timeout_s=timeout_s, max_chars=max_chars)
