from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory import InvalidInputError, LLMClient, LLMError, Usage, as_llm, count_tokens


def test_callable_and_object_llms_count_usage() -> None:
    client = LLMClient(lambda p: "ok: " + p)
    op = Usage()
    assert client.complete("hello world", usage=op) == "ok: hello world"
    assert op.llm_calls == 1 and op.prompt_chars == 11 and op.completion_chars == 15
    assert op.prompt_tokens == count_tokens("hello world")
    assert client.usage.llm_calls == 1

    class Reporting:
        last_usage: dict[str, int] | None = None

        def complete(self, prompt: str) -> str:
            self.last_usage = {"prompt_tokens": 17, "completion_tokens": 3}
            return "fine"

    c2 = LLMClient(Reporting())
    u = Usage()
    c2.complete("x", usage=u)
    assert (u.prompt_tokens, u.completion_tokens) == (17, 3)


def test_failures_become_llm_errors_and_are_counted() -> None:
    def broken(prompt: str) -> str:
        raise TimeoutError("model timed out")

    client = LLMClient(broken)
    u = Usage()
    with pytest.raises(LLMError, match="model timed out"):
        client.complete("x", usage=u)
    assert u.failures == 1 and u.llm_calls == 1
    with pytest.raises(LLMError, match="returned None"):
        LLMClient(lambda p: None).complete("x")


def test_objects_with_text_attribute_and_async() -> None:
    class Resp:
        text = "from .text"

    assert LLMClient(lambda p: Resp()).complete("x") == "from .text"

    class AsyncLLM:
        def complete(self, prompt: str) -> str:
            return "sync"

        async def acomplete(self, prompt: str) -> str:
            return "async"

    assert asyncio.run(LLMClient(AsyncLLM()).acomplete("x")) == "async"
    assert asyncio.run(LLMClient(lambda p: "thread").acomplete("x")) == "thread"


def test_bad_llm_objects_are_rejected() -> None:
    with pytest.raises(InvalidInputError, match="llm must be a callable"):
        LLMClient(42)
    assert as_llm(None) is None
    c = as_llm(lambda p: p)
    assert as_llm(c).llm is c.llm  # type: ignore[union-attr]


def test_count_tokens_rule() -> None:
    assert count_tokens("") == 0
    assert count_tokens("I moved to Berlin, last year.") == 8
    assert count_tokens("don't") == 3


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=80)
    | st.text(alphabet=st.sampled_from(list("ab _.,!é\u00a0\u2028\x1c\t中")), max_size=30)
)
def test_count_tokens_equals_the_regex_rule(text: str) -> None:
    """The ASCII shortcut counts exactly what `\\w+|[^\\w\\s]` finds, for every character."""
    assert count_tokens(text) == len(re.findall(r"\w+|[^\w\s]", text))
