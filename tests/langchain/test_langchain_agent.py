from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from lc_helpers import recording_model
from reflective_memory import InvalidInputError

from langchain_reflective import ReflectiveMemoryMiddleware, create_memory_tool


def _system_text(messages) -> str:
    assert isinstance(messages[0], SystemMessage)
    return messages[0].text


def test_middleware_injects_records_and_feeds_back(fmem):
    model = recording_model("Your cat is Miso [0].")
    mw = ReflectiveMemoryMiddleware(memory=fmem, user_id="ana", session_id="chat", k=3)
    agent = create_agent(model, system_prompt="You are kind.", middleware=[mw])
    state = agent.invoke({"messages": [("user", "What is the name of my cat?")]})
    assert state["messages"][-1].text == "Your cat is Miso [0]."

    system = _system_text(model.seen[0])
    assert system.startswith("You are kind.")
    assert "cite" in system and "[0]" in system and "[2]" in system and "[3]" not in system
    assert "Miso" in system

    assert [(t.role, t.text) for t in fmem.turns("ana", "chat")] == [
        ("user", "What is the name of my cat?"),
        ("assistant", "Your cat is Miso."),  # our citation mark is not stored
    ]
    ((retrieval, answer),) = fmem.feedback_calls
    assert answer == "Your cat is Miso [0]." and len(retrieval.hits) == 3
    assert mw.last_retrieval is retrieval
    assert "reflective_memory_retrieval_id" not in state  # private to the middleware


def test_every_model_call_of_a_run_sees_memories_and_only_final_answer_is_recorded(fmem):
    model = recording_model(
        AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": "c1"}]),
        "Done: Lyon [1].",
    )

    def lookup(q: str) -> str:
        """Look something up."""
        return "looked up"

    mw = ReflectiveMemoryMiddleware(memory=fmem, user_id="ana", session_id="t")
    agent = create_agent(model, tools=[lookup], middleware=[mw])
    agent.invoke({"messages": [("user", "Which race am I training for?")]})
    assert len(model.seen) == 2
    assert all("marathon" in _system_text(call) for call in model.seen)
    assert [t.text for t in fmem.turns("ana", "t")] == [
        "Which race am I training for?",
        "Done: Lyon.",
    ]
    assert len(fmem.feedback_calls) == 1


def test_agent_with_memory_tool_only(mem):
    model = recording_model(
        AIMessage(
            content="",
            tool_calls=[
                {"name": "search_memory", "args": {"query": "cat name", "k": 2}, "id": "1"}
            ],
        ),
        "It is Miso.",
    )
    mw = ReflectiveMemoryMiddleware(memory=mem, user_id="ana", inject=False, expose_tool=True)
    assert [t.name for t in mw.tools] == ["search_memory"]
    agent = create_agent(model, middleware=[mw])
    state = agent.invoke({"messages": [("user", "What's my cat called?")]})
    tool_msgs = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert len(tool_msgs) == 1 and "[0]" in tool_msgs[0].text and "[2]" not in tool_msgs[0].text
    assert "Miso" in tool_msgs[0].text
    assert not isinstance(model.seen[0][0], SystemMessage)  # nothing injected
    assert [t.text for t in mem.turns("ana", mw.session_id)][-1] == "It is Miso."


def test_memory_tool_standalone(mem):
    tool = create_memory_tool(memory=mem, user_id="bob", k=3)
    assert tool.name == "search_memory"
    assert set(tool.args) == {"query", "k"}
    out = tool.invoke({"query": "cat"})
    assert "Tiger" in out and "Miso" not in out
    assert create_memory_tool(memory=mem, user_id="nobody").invoke({"query": "x"}) == (
        "No memories found."
    )


def test_checkpointed_thread_records_each_exchange_once(mem):
    from langgraph.checkpoint.memory import InMemorySaver

    model = recording_model("First.", "Second.")
    mw = ReflectiveMemoryMiddleware(memory=mem, user_id="ana", session_id="th")
    agent = create_agent(model, middleware=[mw], checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "1"}}
    agent.invoke({"messages": [("user", "one")]}, cfg)
    agent.invoke({"messages": [("user", "two")]}, cfg)
    assert [t.text for t in mem.turns("ana", "th")] == ["one", "First.", "two", "Second."]


def test_end_session_and_idle_timeout(mem):
    mw = ReflectiveMemoryMiddleware(memory=mem, user_id="ana", session_id="x")
    agent = create_agent(recording_model("ok"), middleware=[mw])
    agent.invoke({"messages": [("user", "My favourite tea is genmaicha.")]})
    built = mw.end_session("y")
    assert built and mw.session_id == "y"
    hits = mem.retrieve("ana", "favourite tea genmaicha", k=1).hits
    assert hits[0].memory.session_id == "x"


def test_bad_construction(mem):
    with pytest.raises(InvalidInputError):
        ReflectiveMemoryMiddleware(memory="nope", user_id="ana")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        ReflectiveMemoryMiddleware(memory=mem, user_id="")


async def test_async_agent(fmem):
    model = recording_model("Nurse [0].")
    mw = ReflectiveMemoryMiddleware(memory=fmem, user_id="ana", session_id="aa")
    agent = create_agent(model, middleware=[mw])
    state = await agent.ainvoke({"messages": [("user", "What is my job now?")]})
    assert state["messages"][-1].text == "Nurse [0]."
    assert "nurse" in _system_text(model.seen[0])
    assert len(fmem.turns("ana", "aa")) == 2 and len(fmem.feedback_calls) == 1
    tool = create_memory_tool(memory=fmem, user_id="ana")
    assert "nurse" in await tool.ainvoke({"query": "job nurse"})
