from __future__ import annotations

import pytest
from langchain_core.language_models import FakeListChatModel, FakeListLLM, GenericFakeChatModel
from langchain_core.messages import AIMessage
from reflective_memory import InvalidInputError, LLMClient, LLMError, Usage, count_tokens

from langchain_reflective import LangChainLLM


def _with_usage(text: str, inp: int, out: int) -> AIMessage:
    return AIMessage(
        content=text,
        usage_metadata={"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out},
    )


def test_chat_model_text_and_reported_usage_flow_into_core_usage():
    model = GenericFakeChatModel(messages=iter([_with_usage("segment 1: 0-3", 120, 7)]))
    llm = LangChainLLM(model)
    client = LLMClient(llm)
    usage = Usage()
    assert client.complete("split this session", usage=usage) == "segment 1: 0-3"
    assert llm.last_usage == {"prompt_tokens": 120, "completion_tokens": 7}
    assert (usage.llm_calls, usage.prompt_tokens, usage.completion_tokens) == (1, 120, 7)
    assert client.usage.prompt_tokens == 120


def test_without_usage_metadata_the_core_estimates():
    llm = LangChainLLM(FakeListChatModel(responses=["two words"]))
    usage = Usage()
    LLMClient(llm).complete("a prompt here", usage=usage)
    assert llm.last_usage is None
    assert usage.prompt_tokens == count_tokens("a prompt here")
    assert usage.completion_tokens == 2


def test_plain_llm_returns_text():
    llm = LangChainLLM(FakeListLLM(responses=["plain"]))
    assert llm.complete("x") == "plain"
    assert llm.last_usage is None


async def test_async_twin_uses_ainvoke_and_reports_usage():
    llm = LangChainLLM(GenericFakeChatModel(messages=iter([_with_usage("async ok", 9, 2)])))
    usage = Usage()
    assert await LLMClient(llm).acomplete("hello", usage=usage) == "async ok"
    assert (usage.prompt_tokens, usage.completion_tokens) == (9, 2)


def test_model_errors_become_llm_errors_and_are_counted():
    llm = LangChainLLM(GenericFakeChatModel(messages=iter([])))  # raises StopIteration inside
    usage = Usage()
    with pytest.raises(LLMError):
        LLMClient(llm).complete("boom", usage=usage)
    assert usage.failures == 1


def test_rejects_non_models():
    with pytest.raises(InvalidInputError):
        LangChainLLM(lambda p: p)  # type: ignore[arg-type]


def test_core_accepts_adapter_as_its_llm():
    from lc_helpers import new_memory

    with new_memory(llm=LangChainLLM(FakeListChatModel(responses=["ok"]))) as mem:
        assert mem.llm is not None
        assert mem.llm.complete("ping") == "ok"
