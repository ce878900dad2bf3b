"""The chat's answerers (offline extractive, LLM with fallback) and `--llm module:factory`."""

from __future__ import annotations

import re
import sys
import textwrap
import time

import pytest
from reflective_memory.errors import ConfigError
from reflective_memory.serve.answer import LLMAnswerer, OfflineAnswerer, make_answerer
from reflective_memory.serve.chat import ChatService
from reflective_memory.serve.llm_spec import load_llm

from tests.fakes import Scripted


def _hits(mem, user, query, k=5):
    return list(mem.retrieve(user, query, k=k).hits)


def test_offline_answer_quotes_and_cites_the_memory_it_uses(smem):
    hits = _hits(smem, "ana", "What is my dog called?")
    ans = OfflineAnswerer().answer("What is my dog called?", hits)
    assert ans.source == "offline" and ans.cited and not ans.no_cite
    quoted = hits[ans.cited[0]].memory
    assert "Pixel" in quoted.text and "Pixel" in ans.text
    assert f"[{ans.cited[0]}]" in ans.raw and "[" not in ans.text
    for pos in ans.cited:  # every cited memory is quoted word for word
        sentence = re.findall(r"\u201c([^\u201d]*)\u201d", ans.text)
        assert any(s in hits[pos].memory.text for s in sentence)


def test_offline_answer_says_so_when_nothing_matches(smem):
    hits = _hits(smem, "ana", "quantum chromodynamics lecture")
    ans = OfflineAnswerer().answer("quantum chromodynamics lecture", hits)
    assert ans.cited == () and ans.no_cite and "no earlier memory" in ans.text
    assert OfflineAnswerer().answer("anything?", []).no_cite


def test_offline_answer_ignores_question_words():
    ans = OfflineAnswerer().answer("Do you remember my name? Tell me.", [])
    assert ans.no_cite


def test_llm_answer_with_citations(smem):
    llm = Scripted("Your dog is called Pixel. [0]")
    hits = _hits(smem, "ana", "What is my dog called?")
    ans = LLMAnswerer(llm).answer("What is my dog called?", hits, "user: hi")
    assert ans.source == "llm" and ans.cited == (0,) and ans.text == "Your dog is called Pixel."
    assert ans.usage.llm_calls == 1 and ans.usage.prompt_tokens > 0
    prompt = llm.prompts[0]
    assert "=== Memory [0] ===" in prompt and "What is my dog called?" in prompt
    assert "Current conversation so far" in prompt


@pytest.mark.parametrize(
    "llm, reason",
    [
        (Scripted(RuntimeError("service down")), "service down"),
        (Scripted("   "), "empty reply"),
        (Scripted("[0]"), "only citations"),
    ],
)
def test_llm_failures_fall_back_to_the_offline_answer(smem, llm, reason):
    hits = _hits(smem, "ana", "What is my dog called?")
    ans = LLMAnswerer(llm).answer("What is my dog called?", hits)
    assert ans.source == "offline" and reason in ans.fallback_reason
    assert ans.cited and "Pixel" in ans.text
    assert ans.usage.llm_calls == 1


def test_hanging_llm_is_abandoned_after_the_timeout(smem):
    def slow(prompt):
        time.sleep(3)
        return "late [0]"

    hits = _hits(smem, "ana", "What is my dog called?")
    t0 = time.perf_counter()
    ans = LLMAnswerer(slow, timeout_s=0.2).answer("What is my dog called?", hits)
    assert time.perf_counter() - t0 < 2
    assert ans.source == "offline" and "within 0.2 s" in ans.fallback_reason


def test_make_answerer():
    assert isinstance(make_answerer(None), OfflineAnswerer)
    assert isinstance(make_answerer(lambda p: "x"), LLMAnswerer)
    with pytest.raises(Exception, match="callable"):
        LLMAnswerer(42)


def test_chat_feeds_llm_citations_back_but_not_offline_ones(smem):
    llm_chat = ChatService(smem, LLMAnswerer(Scripted("Pixel, the beagle. [0]")))
    ex = llm_chat.send("ana", "c1", "What is my dog called?")
    assert ex.answer.source == "llm" and ex.auto_feedback is not None
    assert ex.auto_feedback.learned and ex.auto_feedback.cited == (0,)
    offline_chat = ChatService(smem, OfflineAnswerer())
    ex2 = offline_chat.send("ana", "c2", "What is my dog called?")
    assert ex2.auto_feedback is None and ex2.answer.cited
    # a user's marks override the reply's own citations
    r = offline_chat.mark("ana", ex2.exchange_id, ex2.answer.cited[0], False)
    assert ex2.answer.cited[0] not in r.cited
    assert r.rewards[ex2.retrieval.hits[ex2.answer.cited[0]].memory.id] < 0


def test_failing_llm_gives_no_auto_feedback(smem):
    chat = ChatService(smem, LLMAnswerer(Scripted(RuntimeError("boom"))))
    ex = chat.send("ana", "c3", "What is my dog called?")
    assert ex.answer.fallback_reason and ex.auto_feedback is None


# ------------------------------------------------------------------ --llm module:factory
@pytest.fixture
def llm_module(tmp_path, monkeypatch):
    src = textwrap.dedent(
        """
        from langchain_core.language_models import FakeListChatModel

        def langchain_model():
            return FakeListChatModel(responses=["Pixel. [0]"])

        def llamaindex_model():
            from llama_index.core.llms import MockLLM
            return MockLLM(max_tokens=5)

        def plain(prompt):
            return "plain reply [0]"

        class Completer:
            def complete(self, prompt):
                return "completer reply [0]"

        ready = Completer()

        def broken():
            raise RuntimeError("no API key")

        def not_a_model():
            return 42
        """
    )
    (tmp_path / "my_llms.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_llms"
    sys.modules.pop("my_llms", None)


def test_load_llm_adapts_langchain_models(llm_module):
    pytest.importorskip("langchain_core")
    from langchain_reflective.llm import LangChainLLM

    llm = load_llm(f"{llm_module}:langchain_model")
    assert isinstance(llm, LangChainLLM) and llm.complete("hi") == "Pixel. [0]"


def test_load_llm_adapts_llamaindex_models(llm_module):
    pytest.importorskip("llama_index.core")
    from llamaindex_reflective.llm import LlamaIndexLLM

    llm = load_llm(f"{llm_module}:llamaindex_model")
    assert isinstance(llm, LlamaIndexLLM) and isinstance(llm.complete("hello there"), str)


def test_load_llm_plain_objects(llm_module):
    assert load_llm(f"{llm_module}:plain")("x") == "plain reply [0]"
    assert load_llm(f"{llm_module}:Completer").complete("x") == "completer reply [0]"
    assert load_llm(f"{llm_module}:ready").complete("x") == "completer reply [0]"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "must look like"),
        ("a:b:c", "must look like"),
        (":x", "must look like"),
        ("surely_no_such_module_xyz:f", "cannot import"),
        ("{mod}:missing", "has no attribute"),
        ("{mod}:broken", "no API key"),
        ("{mod}:not_a_model", "returned a int"),
    ],
)
def test_load_llm_errors(llm_module, spec, message):
    with pytest.raises(ConfigError, match=message):
        load_llm(spec.format(mod=llm_module))


def test_offline_answer_with_an_embedder_uses_meaning_and_words(smem):
    from reflective_memory import HashingEmbedder

    hits = _hits(smem, "ana", "What is my dog called?")
    ans = OfflineAnswerer(HashingEmbedder(dim=128)).answer("What is my dog called?", hits)
    assert ans.cited and "Pixel" in ans.text


@pytest.mark.integration
def test_offline_answer_finds_a_paraphrase_with_minilm():
    from reflective_memory import MemoryConfig, ReflectiveMemory, default_embedder

    with ReflectiveMemory(embedder=default_embedder(), config=MemoryConfig()) as mem:
        for i, text in enumerate(
            [
                "We finally moved into our new flat in Berlin last week.",
                "Nice! How is the neighbourhood?",
                "Quiet, and the bakery downstairs makes great pretzels.",
                "That sounds lovely.",
            ]
        ):
            mem.add_turn("u", "s", "user" if i % 2 == 0 else "assistant", text)
        mem.end_session("u", "s")
        query = "Which city is my home now?"
        hits = list(mem.retrieve("u", query, k=3).hits)
        words_only = OfflineAnswerer().answer(query, hits)
        assert words_only.no_cite  # no content word in common
        ans = OfflineAnswerer(mem.embedder).answer(query, hits)
        assert len(ans.cited) == 1 and "Berlin" in ans.text
        assert "Berlin" in hits[ans.cited[0]].memory.text
