from __future__ import annotations

import time
import warnings

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from lc_helpers import recording_model
from reflective_memory import InvalidInputError

from langchain_reflective import ReflectiveChatMemory


def _chain(model, memory):
    from langchain_classic.chains import ConversationChain

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ConversationChain(llm=model, memory=memory)


def test_conversation_chain_sees_numbered_memories_records_and_feeds_back(fmem):
    model = recording_model("Your cat is called Miso [1].", "Sure, noted [NO_CITE].")
    chat = ReflectiveChatMemory(memory=fmem, user_id="ana", session_id="live")
    chain = _chain(model, chat)

    out = chain.invoke({"input": "What is my cat called?"})
    assert out["response"] == "Your cat is called Miso [1]."
    prompt = model.seen[0][0].content
    assert "[0]" in prompt and "[1]" in prompt and "cite" in prompt
    assert "Miso" in prompt
    retrieval = chat.last_retrieval
    assert retrieval is None  # consumed by save_context
    ((fed, answer),) = fmem.feedback_calls
    assert answer == "Your cat is called Miso [1]."
    assert fed.query == "What is my cat called?" and fed.user_id == "ana"

    chain.invoke({"input": "I also have a hamster."})
    turns = fmem.turns("ana", "live")
    assert [(t.role, t.text) for t in turns] == [
        ("user", "What is my cat called?"),
        ("assistant", "Your cat is called Miso."),
        ("user", "I also have a hamster."),
        ("assistant", "Sure, noted."),
    ]
    assert all(t.timestamp is not None for t in turns)
    # the second prompt shows the current conversation verbatim
    assert "Human: What is my cat called?" in model.seen[1][0].content
    assert len(fmem.feedback_calls) == 2


def test_no_feedback_when_core_lacks_it(mem):
    chat = ReflectiveChatMemory(memory=mem, user_id="ana")
    assert not hasattr(mem, "feedback") or callable(mem.feedback)
    chat.load_memory_variables({"input": "cat"})
    chat.save_context({"input": "cat"}, {"response": "Miso [0]"})
    assert [t.role for t in mem.turns("ana", chat.session_id)] == ["user", "assistant"]


def test_end_session_builds_memories_and_starts_new_session(mem):
    chat = ReflectiveChatMemory(memory=mem, user_id="ana", session_id="trip")
    chat.save_context({"input": "I am flying to Reykjavik on Friday."}, {"output": "Have fun!"})
    assert "trip" in mem.open_sessions("ana")
    built = chat.end_session(next_session_id="after-trip")
    assert built and all(m.session_id == "trip" for m in built)
    assert chat.session_id == "after-trip"
    assert "trip" not in mem.open_sessions("ana")
    text = chat.load_memory_variables({"input": "Where am I flying to?"})["history"]
    assert "Reykjavik" in text
    assert "Earlier in this session" not in text  # the new session is empty
    assert chat.end_session() == []  # nothing recorded in after-trip


def test_idle_timeout_ends_the_session(mem):
    chat = ReflectiveChatMemory(
        memory=mem, user_id="ana", session_id="a", idle_timeout_seconds=0.05
    )
    chat.save_context({"input": "My sister Lea lives in Porto."}, {"output": "Nice city."})
    time.sleep(0.1)
    chat.load_memory_variables({"input": "where does Lea live"})
    assert chat.session_id != "a"
    assert "a" not in mem.open_sessions("ana")
    assert any(m.session_id == "a" for m in mem.memories("ana"))


def test_return_messages_and_custom_keys(mem):
    chat = ReflectiveChatMemory(
        memory=mem,
        user_id="ana",
        return_messages=True,
        memory_key="memories",
        input_key="question",
        output_key="answer",
    )
    chat.save_context({"question": "hello", "extra": 1}, {"answer": "hi", "other": "x"})
    msgs = chat.load_memory_variables({"question": "marathon", "extra": 2})["memories"]
    assert isinstance(msgs[0], SystemMessage) and "[0]" in msgs[0].content
    assert isinstance(msgs[1], HumanMessage) and msgs[1].content == "hello"
    assert chat.memory_variables == ["memories"]


def test_ambiguous_inputs_raise(mem):
    chat = ReflectiveChatMemory(memory=mem, user_id="ana")
    with pytest.raises(InvalidInputError):
        chat.load_memory_variables({"a": "x", "b": "y"})
    with pytest.raises(InvalidInputError):
        chat.save_context({"input": "x"}, {"a": "1", "b": "2"})
    with pytest.raises(ValueError):
        ReflectiveChatMemory(memory=mem, user_id="ana", unknown=1)
    with pytest.raises(ValueError, match="idle_timeout_seconds"):
        ReflectiveChatMemory(memory=mem, user_id="ana", idle_timeout_seconds=0)


def test_clear_scopes(mem):
    chat = ReflectiveChatMemory(memory=mem, user_id="ana", session_id="tmp")
    chat.save_context({"input": "temporary"}, {"output": "ok"})
    chat.clear()
    assert mem.turns("ana", "tmp") == []
    assert mem.turns("ana", "s1")  # older sessions stay
    chat.clear()  # clearing an empty session is fine
    ReflectiveChatMemory(memory=mem, user_id="bob", clear_scope="user").clear()
    assert mem.turns("bob") == [] and mem.memories("bob") == []
    assert mem.memories("ana")


async def test_async_chain(fmem):
    model = recording_model("Lyon [0]")
    chat = ReflectiveChatMemory(memory=fmem, user_id="ana", session_id="async")
    out = await _chain(model, chat).ainvoke({"input": "Which half marathon am I training for?"})
    assert out["response"] == "Lyon [0]"
    assert len(fmem.turns("ana", "async")) == 2
    assert len(fmem.feedback_calls) == 1


def test_recent_turns_are_shown_once_not_as_memories(mem):
    chat = ReflectiveChatMemory(memory=mem, user_id="ana", session_id="s1", recent_turns=2)
    chat.save_context({"input": "My sister Zoraida lives in Tromsø."}, {"output": "Noted."})
    chat.save_context({"input": "I adopted a parrot named Kiwiko."}, {"output": "Lovely!"})
    asked = {"input": "Where does my sister live? And my parrot?"}
    text = chat.load_memory_variables(asked)["history"]
    memories, recent = text.split("Earlier in this session:")
    assert "Zoraida lives in Tromsø" in memories  # an earlier turn of the session: a memory
    assert "Kiwiko" not in memories and "Human: I adopted a parrot named Kiwiko." in recent
    assert text.count("Kiwiko") == 1
