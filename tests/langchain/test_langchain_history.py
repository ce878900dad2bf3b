from __future__ import annotations

import warnings

from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from lc_helpers import new_memory, recording_model

from langchain_reflective import ReflectiveChatMessageHistory


def test_messages_round_trip_with_roles(mem):
    h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="h1")
    h.add_messages(
        [
            SystemMessage("Be brief."),
            HumanMessage("My bike is blue."),
            AIMessage("Got it."),
            ChatMessage(role="coach", content="Stretch first."),
            AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "1"}]),
            ToolMessage("tool output", tool_call_id="1"),
        ]
    )
    got = h.messages
    assert [type(m) for m in got] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        ChatMessage,
        ChatMessage,
    ]
    assert [m.text for m in got] == [
        "Be brief.",
        "My bike is blue.",
        "Got it.",
        "Stretch first.",
        "tool output",
    ]
    assert got[3].role == "coach" and got[4].role == "tool"
    assert [t.role for t in mem.turns("ana", "h1")] == [
        "system",
        "user",
        "assistant",
        "coach",
        "tool",
    ]
    # other users and sessions are separate
    assert ReflectiveChatMessageHistory(memory=mem, user_id="bob", session_id="h1").messages == []
    assert ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="h2").messages == []


def test_durable_across_reopen_and_end_session_builds_memories(tmp_path):
    with new_memory(path=tmp_path) as mem:
        h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="d")
        h.add_user_message("I keep bees on my roof.")
        h.add_ai_message("How many hives?")
    with new_memory(path=tmp_path) as mem:
        h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="d")
        assert [m.text for m in h.messages] == ["I keep bees on my roof.", "How many hives?"]
        # each turn is indexed at once as a turn unit; ending the session adds its segments
        assert {m.granularity for m in mem.memories("ana")} == {"turn"}
        assert mem.retrieve("ana", "bees roof").hits
        built = h.end_session()
        assert built and "bees" in built[0].text
        assert mem.retrieve("ana", "bees roof").hits
        assert (
            ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="none").end_session()
            == []
        )


def test_clear_deletes_the_session_only(mem):
    h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="s1")
    h.clear()
    assert h.messages == [] and all(m.session_id != "s1" for m in mem.memories("ana"))
    assert mem.turns("ana", "s2")
    h.clear()  # idempotent


def test_runnable_with_message_history(mem):
    from langchain_core.runnables.history import RunnableWithMessageHistory

    model = recording_model("Hello Ana!", "You said your name is Ana.")
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{input}")]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chain = RunnableWithMessageHistory(
            prompt | model,
            ReflectiveChatMessageHistory.factory(memory=mem, user_id="ana"),
            input_messages_key="input",
            history_messages_key="history",
        )
    cfg = {"configurable": {"session_id": "rw"}}
    chain.invoke({"input": "Hi, I'm Ana."}, config=cfg)
    chain.invoke({"input": "What's my name?"}, config=cfg)
    second_call = model.seen[1]
    assert [m.text for m in second_call[1:3]] == ["Hi, I'm Ana.", "Hello Ana!"]
    assert [t.text for t in mem.turns("ana", "rw")] == [
        "Hi, I'm Ana.",
        "Hello Ana!",
        "What's my name?",
        "You said your name is Ana.",
    ]


async def test_async_methods(mem):
    h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="as")
    await h.aadd_messages([HumanMessage("async hello"), AIMessage("async hi")])
    assert [m.text for m in await h.aget_messages()] == ["async hello", "async hi"]
    assert await h.aend_session()
    await h.aclear()
    assert await h.aget_messages() == []
