"""Time on the LangChain surfaces (issue 49): `now=` on each of them, a message's own time as
`now`, a model's undated reply at its question's time, and idle sessions in live and replayed
chats. The surface contract (`tests/test_surface_contract.py`) drives the per-call `now` of the
middleware and the classic memory; this file covers the constructor fields, the retriever and
the memory tool, and ends with the reported failure on the real MiniLM."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from lc_helpers import recording_model
from reflective_memory import HashingEmbedder, InvalidInputError, ReflectiveMemory
from time_cases import ASKED, CURRY, QUESTION, SOUP, first_cooked

from langchain_reflective import (
    ReflectiveChatMemory,
    ReflectiveMemoryMiddleware,
    ReflectiveRetriever,
    create_memory_tool,
)

UTC = timezone.utc


def test_retriever_now_as_field_and_per_call(cooked: ReflectiveMemory) -> None:
    default = ReflectiveRetriever(memory=cooked, user_id="ana", k=2)
    assert SOUP in default.invoke(QUESTION)[0].page_content
    assert CURRY in default.invoke(QUESTION, now=ASKED)[0].page_content
    fixed = ReflectiveRetriever(memory=cooked, user_id="ana", k=2, now=ASKED)
    assert fixed.now == datetime(2025, 4, 20, 12, tzinfo=UTC)  # naive read as UTC
    assert CURRY in fixed.invoke(QUESTION)[0].page_content
    assert SOUP in fixed.invoke(QUESTION, now="2025-05-04T20:00:00")[0].page_content
    with pytest.raises(InvalidInputError, match="no known format"):
        ReflectiveRetriever(memory=cooked, user_id="ana", now="someday")


async def test_retriever_now_async(cooked: ReflectiveMemory) -> None:
    r = ReflectiveRetriever(memory=cooked, user_id="ana", k=1)
    assert CURRY in (await r.ainvoke(QUESTION, now=ASKED))[0].page_content


def test_classic_memory_now_field_and_an_inputs_own_time(cooked: ReflectiveMemory) -> None:
    chat = ReflectiveChatMemory(memory=cooked, user_id="ana", k=2, now=ASKED, recent_turns=0)
    assert first_cooked(chat.load_memory_variables({"input": QUESTION})["history"]) == CURRY
    free = ReflectiveChatMemory(memory=cooked, user_id="ana", k=2, recent_turns=0)
    assert first_cooked(free.load_memory_variables({"input": QUESTION})["history"]) == SOUP
    asked = {"input": QUESTION, "timestamp": ASKED}
    assert first_cooked(free.load_memory_variables(asked)["history"]) == CURRY
    free.save_context(asked, {"output": "The lentil curry."})
    q, a = cooked.turns("ana", free.session_id)
    assert q.timestamp == a.timestamp == datetime(2025, 4, 20, 12, tzinfo=UTC)
    with pytest.raises(InvalidInputError):
        ReflectiveChatMemory(memory=cooked, user_id="ana", now=[2025])


def test_middleware_now_field_and_the_messages_own_time(cooked: ReflectiveMemory) -> None:
    fixed = ReflectiveMemoryMiddleware(memory=cooked, user_id="ana", k=2, now=ASKED)
    agent = create_agent(recording_model("Curry.", "Stew."), middleware=[fixed])
    agent.invoke({"messages": [HumanMessage(QUESTION)]})
    assert CURRY in fixed.last_retrieval.hits[0].memory.text  # type: ignore[union-attr]
    own = HumanMessage(QUESTION, additional_kwargs={"timestamp": "2025-05-18T09:00:00"})
    agent.invoke({"messages": [own]})  # the message's own time wins: two weeks before 18 May
    assert "fish stew" in fixed.last_retrieval.hits[0].memory.text  # type: ignore[union-attr]
    with pytest.raises(InvalidInputError):
        ReflectiveMemoryMiddleware(memory=cooked, user_id="ana", now="soon")


def test_memory_tool_now_and_the_messages_own_time_in_an_agent(cooked: ReflectiveMemory) -> None:
    tool = create_memory_tool(memory=cooked, user_id="ana", k=1, now=ASKED)
    assert set(tool.args) == {"query", "k"}  # the runtime is never asked of the model
    assert CURRY in tool.invoke({"query": QUESTION})
    call = {"name": "search_memory", "args": {"query": QUESTION}, "id": "1"}
    model = recording_model(AIMessage("", tool_calls=[call]), "Found it.")
    plain = create_memory_tool(memory=cooked, user_id="ana", k=1)
    assert SOUP in plain.invoke({"query": QUESTION})
    agent = create_agent(model, tools=[plain])
    asked = HumanMessage("What did I cook?", additional_kwargs={"timestamp": ASKED})
    state = agent.invoke({"messages": [asked]})
    (found,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert CURRY in found.text
    with pytest.raises(InvalidInputError):
        create_memory_tool(memory=cooked, user_id="ana", now="whenever")


def test_a_replayed_chat_through_the_middleware_stays_in_its_time(cooked) -> None:  # noqa: ANN001
    """User messages with their own (naive) times, model replies without: every reply is
    stored at its question's time, the session does not end on idle although it is stored
    today, and a reply never moves the default `now` to today."""
    mw = ReflectiveMemoryMiddleware(
        memory=cooked, user_id="ana", session_id="replay", idle_timeout_seconds=1800
    )
    agent = create_agent(recording_model("Yes.", "Sure.", "Right."), middleware=[mw])
    start = datetime(2025, 5, 10, 8, 0)
    for i in range(3):
        said = (start + timedelta(minutes=10 * i)).isoformat()
        agent.invoke(
            {"messages": [HumanMessage(f"Note {i}.", additional_kwargs={"timestamp": said})]}
        )
    turns = cooked.turns("ana", "replay")
    assert len(turns) == 6 and mw.session_id == "replay"
    assert [t.timestamp for t in turns[1::2]] == [t.timestamp for t in turns[::2]]
    assert sorted(t.timestamp for t in cooked.turns("ana"))[-1] == turns[-1].timestamp  # type: ignore[type-var]
    assert turns[-1].timestamp == datetime(2025, 5, 10, 8, 20, tzinfo=UTC)


def test_a_live_chat_without_times_ends_only_after_a_real_pause(wall_clock) -> None:  # noqa: ANN001
    """A live chat (no message carries a time) through an adapter with an idle timeout: twelve
    exchanges ten minutes apart stay one session; after a 45-minute pause the next exchange
    begins a new session, stamped with the clock."""
    with ReflectiveMemory(embedder=HashingEmbedder(64)) as m:
        chat = ReflectiveChatMemory(
            memory=m, user_id="ana", session_id="live", idle_timeout_seconds=1800
        )
        for i in range(12):
            chat.load_memory_variables({"input": f"Question {i}?"})
            chat.save_context({"input": f"Question {i}?"}, {"output": f"Answer {i}."})
            wall_clock.advance(minutes=10)
        assert chat.session_id == "live" and len(m.turns("ana", "live")) == 24
        wall_clock.advance(minutes=35)
        chat.save_context({"input": "Back again."}, {"output": "Welcome back."})
        assert chat.session_id != "live" and "live" not in m.open_sessions("ana")
        new = m.turns("ana", chat.session_id)
        assert [t.timestamp for t in new] == [wall_clock.now, wall_clock.now]


# -- the reported failure, on the real MiniLM ---------------------------------------------------
#: One thing done a week, from Monday 6 January 2025 (naive times, as a log gives them).
WEEKS = [
    "I went bouldering at the climbing gym with Jonas.",
    "I visited the Munch museum and loved The Scream.",
    "I started a pottery class and made a wobbly bowl.",
    "I ran a half marathon along the river in 1:52.",
    "I baked sourdough bread for the first time.",
    "I went skiing in Trysil with my cousins.",
    "I repainted the kitchen a pale green colour.",
    "I adopted a kitten from the shelter and named her Miso.",
    "I saw a jazz concert at the opera house.",
    "I planted tomatoes and basil on the balcony.",
    "I had a job interview at the city hospital.",
]


@pytest.mark.integration
def test_ten_weeks_ago_through_the_middleware_on_minilm() -> None:
    """The issue's report: a 2025 conversation dated with naive times goes through the agent
    middleware with a fake chat model whose replies carry no time. Before, the replies were
    stored today (aware): sorting the times raised `TypeError`, and the default `now` jumped to
    today, so "ten weeks ago" resolved to the wrong turn."""
    week0 = datetime(2025, 1, 6, 18, 0)
    replies = [AIMessage(f"Noted, week {i}.") for i in range(len(WEEKS))]
    with ReflectiveMemory() as mem:  # the default: MiniLM
        model = GenericFakeChatModel(messages=iter([*replies, AIMessage("[NO_CITE]")]))
        mw = ReflectiveMemoryMiddleware(memory=mem, user_id="ana", session_id="week-0", k=3)
        agent = create_agent(model, middleware=[mw])
        for i, text in enumerate(WEEKS):
            if i:
                mw.end_session(next_session_id=f"week-{i}")
            said = (week0 + timedelta(weeks=i)).isoformat()
            agent.invoke({"messages": [HumanMessage(text, additional_kwargs={"timestamp": said})]})
        mw.end_session(next_session_id="today")
        asked = (week0 + timedelta(weeks=len(WEEKS), hours=1)).isoformat()  # 24 March 2025
        question = HumanMessage(
            "What did I do ten weeks ago?", additional_kwargs={"timestamp": asked}
        )
        agent.invoke({"messages": [question]})

        times = sorted(t.timestamp for t in mem.turns("ana"))  # type: ignore[type-var]
        assert all(t.tzinfo is not None and t.year == 2025 for t in times)
        retrieval = mw.last_retrieval
        assert retrieval is not None and retrieval.hits
        assert WEEKS[1] in retrieval.hits[0].memory.text, [h.memory.text for h in retrieval.hits]
