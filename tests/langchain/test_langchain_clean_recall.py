from __future__ import annotations

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from lc_helpers import recording_model

from langchain_reflective import (
    ReflectiveChatMemory,
    ReflectiveChatMessageHistory,
    ReflectiveMemoryMiddleware,
)


def test_middleware_stores_answer_without_marks_names_as_roles_and_feeds_back_raw(fmem):
    model = recording_model("Your cat is Miso [0]. [NO_CITE]")
    mw = ReflectiveMemoryMiddleware(memory=fmem, user_id="ana", session_id="named", k=3)
    agent = create_agent(model, middleware=[mw])
    agent.invoke({"messages": [HumanMessage("What is my cat called?", name="Ana")]})
    assert [(t.role, t.text) for t in fmem.turns("ana", "named")] == [
        ("Ana", "What is my cat called?"),
        ("assistant", "Your cat is Miso."),
    ]
    ((retrieval, answer),) = fmem.feedback_calls
    assert answer == "Your cat is Miso [0]. [NO_CITE]"
    assert all("What is my cat called?" not in h.memory.text for h in retrieval.hits)


def test_middleware_invalid_name_falls_back_to_user(fmem):
    mw = ReflectiveMemoryMiddleware(memory=fmem, user_id="ana", session_id="bad", k=3)
    agent = create_agent(recording_model("Sure."), middleware=[mw])
    agent.invoke({"messages": [HumanMessage("Hello there", name="A: B")]})
    assert [t.role for t in fmem.turns("ana", "bad")] == ["user", "assistant"]


def test_chat_memory_strips_marks_and_does_not_return_the_current_exchange(fmem):
    chat = ReflectiveChatMemory(memory=fmem, user_id="ana", session_id="cm", k=5)
    question = "Where does my sister Ines live these days?"
    got = chat.load_memory_variables({"input": question})["history"]
    assert question not in got
    chat.save_context({"input": question}, {"output": "In Porto, I believe. [0, 2]"})
    assert [t.text for t in fmem.turns("ana", "cm")] == [question, "In Porto, I believe."]
    assert fmem.feedback_calls[-1][1] == "In Porto, I believe. [0, 2]"


def test_history_names_round_trip_and_ai_marks_are_stripped(mem):
    h = ReflectiveChatMessageHistory(memory=mem, user_id="ana", session_id="h1")
    h.add_messages(
        [
            HumanMessage("I moved to Lyon.", name="Ana"),
            AIMessage("Noted, Lyon it is. [NO_CITE]", name="Coach"),
            HumanMessage("Also array[0] in Python [1] confuses me."),
            AIMessage("[1]"),
        ]
    )
    turns = mem.turns("ana", "h1")
    assert [(t.role, t.text) for t in turns] == [
        ("Ana", "I moved to Lyon."),
        ("Coach", "Noted, Lyon it is."),
        ("user", "Also array[0] in Python [1] confuses me."),  # user text is never rewritten
    ]
    back = h.messages
    assert [(m.type, m.name) for m in back] == [("human", "Ana"), ("ai", "Coach"), ("human", None)]
