"""Long-term memory for LangChain 1.x agents (`langchain.agents.create_agent`).

`ReflectiveMemoryMiddleware` is the one-object drop-in: add it to `middleware=[...]` and the agent
sees the user's relevant memories (numbered, with a citation instruction) in its system message,
every exchange is recorded in the core store, and the answer's citations train the reranker.
`create_memory_tool` builds a `search_memory` tool for agents that prefer to look things up
themselves (the middleware can register it too, with `expose_tool=True`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool
from pydantic import BaseModel, Field
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError
from reflective_memory.memory_block import shown_memories
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Memory, Retrieval
from reflective_memory.validation import message_time
from typing_extensions import NotRequired

from ._common import (
    CITATION_INSTRUCTION,
    RetrievalCache,
    SessionTracker,
    format_memories,
    send_feedback,
    speaker_role,
    stored_text,
)

__all__ = [
    "ReflectiveMemoryMiddleware",
    "ReflectiveMemoryState",
    "SearchMemoryInput",
    "create_memory_tool",
]

logger = logging.getLogger(__name__)

_STATE_KEY = "reflective_memory_retrieval_id"


class ReflectiveMemoryState(AgentState[Any]):
    """Agent state with the id of the retrieval made for the current input (internal)."""

    reflective_memory_retrieval_id: NotRequired[Annotated[str | None, PrivateStateAttr]]


class SearchMemoryInput(BaseModel):
    """Arguments of the `search_memory` tool."""

    query: str = Field(description="What to look for in the user's past conversations.")
    k: int | None = Field(
        default=None,
        ge=1,
        le=50,
        description="How many past turns to return (default: passages of about 500 tokens).",
    )
    runtime: Annotated[Any, InjectedToolArg] = Field(
        default=None,
        description="The agent's `ToolRuntime`, injected by LangChain (never asked of the model): "
        "the newest user message's own time is the search's `now`.",
    )


def create_memory_tool(
    *,
    memory: ReflectiveMemory,
    user_id: str,
    k: int | None = None,
    name: str = "search_memory",
    description: str | None = None,
    now: datetime | str | float | None = None,
) -> BaseTool:
    """A tool that searches one user's long-term memory and returns numbered memories.

    Args:
        memory: The core memory store.
        user_id: Whose memories the tool searches.
        k: Turns returned when the model does not ask for a number (None: passages filling
            the core's `search.default_budget_tokens`).
        name: Tool name.
        description: Tool description shown to the model.
        now: When questions are asked, for "two weeks ago" (any timestamp `add_turn` takes;
            None: the user's newest turn). Inside an agent the newest user message's own
            time (`additional_kwargs["timestamp"]`) takes its place when it has one.

    Returns:
        A `StructuredTool` with sync and async implementations.

    Raises:
        InvalidInputError: `now` is no timestamp.
    """
    if description is None:
        description = (
            "Search the user's long-term memory of earlier conversations (facts, preferences, "
            "events they told you). Returns numbered memories, most relevant first."
        )
    fixed_now = parse_timestamp(now)

    def _format(retrieval: Retrieval) -> str:
        if not retrieval.hits:
            return "No memories found."
        return format_memories(retrieval.hits, instruction=None)

    def _options(k: int | None, runtime: Any) -> dict[str, Any]:
        state = getattr(runtime, "state", None)
        messages = state.get("messages") if isinstance(state, dict) else None
        asked = _last_messages(messages)[0] if isinstance(messages, list) else None
        said = None if asked is None else message_time(asked.additional_kwargs)
        return {"k": default_k if k is None else k, "now": fixed_now if said is None else said}

    def search(query: str, k: int | None = None, runtime: Any = None) -> str:
        return _format(memory.retrieve(user_id, query, **_options(k, runtime)))

    async def asearch(query: str, k: int | None = None, runtime: Any = None) -> str:
        return _format(await memory.aretrieve(user_id, query, **_options(k, runtime)))

    default_k = k
    return StructuredTool.from_function(
        func=search,
        coroutine=asearch,
        name=name,
        description=description,
        args_schema=SearchMemoryInput,
        infer_schema=False,
    )


def _last_messages(
    messages: list[AnyMessage],
) -> tuple[HumanMessage | None, AIMessage | None]:
    """The last human message and the final AI answer (with text) after it."""
    for i in range(len(messages) - 1, -1, -1):
        question = messages[i]
        if isinstance(question, HumanMessage):
            for m in reversed(messages[i + 1 :]):
                if isinstance(m, AIMessage) and str(m.text).strip():
                    return question, m
            return question, None
    return None, None


def _with_memories(system: SystemMessage | None, block: str) -> SystemMessage:
    if system is None:
        return SystemMessage(content=block)
    return SystemMessage(
        content=[*system.content_blocks, {"type": "text", "text": f"\n\n{block}"}]  # type: ignore[list-item]
    )


class ReflectiveMemoryMiddleware(AgentMiddleware[ReflectiveMemoryState, Any, Any]):
    """Give a `create_agent` agent long-term memory of one user.

    Per agent run: before the first model call the user's latest message is used to retrieve
    memories; every model call of the run sees them in its system message, numbered and with an
    instruction to cite them; after the run the user's message and the final answer are stored
    as turns of the current session and the answer's citations are sent to the engine's reranker
    (`memory.feedback`; skipped when `config.rerank.enabled` is off). Sessions end on
    `end_session()`
    or after `idle_timeout_seconds` without turns, and then become memories.

    Args:
        memory: The core memory store.
        user_id: The user the agent talks to.
        session_id: The current session (`None`: a random id).
        k: Turns injected per run (None: passages filling the budget).
        budget_tokens: Token budget of the injected block, its citation instruction and
            numbering included (core token rule; None with `k` None: the core's
            `search.default_budget_tokens`, 500).
        citation_instruction: Text above the numbered memories (`None`: none).
        idle_timeout_seconds: Idle time after which the session ends at the next run.
        inject: Put the memories into the system message.
        record: Store each exchange as turns.
        expose_tool: Also give the agent the `search_memory` tool.
        now: When questions are asked, for "two weeks ago" (any timestamp `add_turn` takes;
            None: the user's newest turn). The user's message's own time
            (`additional_kwargs["timestamp"]`) takes its place when it has one; the model's
            answer, stored without a time, takes the time of the message it answers when that
            is a replayed one (`ReflectiveMemory.turn_time`).

    Example:
        >>> from langchain.agents import create_agent
        >>> from langchain_core.language_models import FakeListChatModel
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> agent = create_agent(
        ...     FakeListChatModel(responses=["Noted."]),
        ...     middleware=[ReflectiveMemoryMiddleware(memory=mem, user_id="ana")],
        ... )
        >>> agent.invoke({"messages": [("user", "I live in Lyon.")]})["messages"][-1].text
        'Noted.'
        >>> [t.role for t in mem.turns("ana")]
        ['user', 'assistant']
    """

    state_schema = ReflectiveMemoryState

    def __init__(
        self,
        *,
        memory: ReflectiveMemory,
        user_id: str,
        session_id: str | None = None,
        k: int | None = None,
        budget_tokens: int | None = None,
        citation_instruction: str | None = CITATION_INSTRUCTION,
        idle_timeout_seconds: float | None = None,
        inject: bool = True,
        record: bool = True,
        expose_tool: bool = False,
        now: datetime | str | float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(memory, ReflectiveMemory):
            raise InvalidInputError(
                f"memory must be a ReflectiveMemory, got {type(memory).__name__}"
            )
        if not isinstance(user_id, str) or not user_id.strip():
            raise InvalidInputError("user_id must be a non-empty str")
        self.memory = memory
        self.user_id = user_id
        self.k = k
        self.budget_tokens = budget_tokens
        self.citation_instruction = citation_instruction
        self.inject = inject
        self.record = record
        self.now = parse_timestamp(now)
        self._tracker = SessionTracker(memory, user_id, session_id, idle_timeout_seconds)
        self._retrievals = RetrievalCache()
        self._last: Retrieval | None = None
        self.tools = (
            [create_memory_tool(memory=memory, user_id=user_id, k=k, now=self.now)]
            if expose_tool
            else []
        )

    @property
    def session_id(self) -> str:
        """The session exchanges are currently recorded into."""
        return self._tracker.session_id

    def end_session(self, next_session_id: str | None = None) -> list[Memory]:
        """End the current session (its turns become memories) and start the next one."""
        return self._tracker.end(next_session_id)

    @property
    def last_retrieval(self) -> Retrieval | None:
        """The most recent retrieval this middleware made (any run), for inspection."""
        return self._last

    # -- hooks ------------------------------------------------------------------------------
    def before_agent(self, state: ReflectiveMemoryState, runtime: Any) -> dict[str, Any] | None:
        """Retrieve memories for the user's latest message (once per run)."""
        if not self.inject:
            return None
        asked, _ = _last_messages(state["messages"])
        question = None if asked is None else str(asked.text)
        if question is None or not question.strip():
            return {_STATE_KEY: None}
        said = message_time(asked.additional_kwargs) if asked is not None else None
        sid = self._tracker.current(said)
        retrieval = shown_memories(
            self.memory,
            self.user_id,
            question,
            k=self.k,
            budget_tokens=self.budget_tokens,
            instruction=self.citation_instruction,
            exclude_turns=self._shown(state["messages"], sid),
            now=self.now if said is None else said,
            message=True,
        )[0]
        self._last = retrieval
        return {_STATE_KEY: self._retrievals.put(retrieval)}

    def _shown(self, messages: list[AnyMessage], session_id: str) -> list[str]:
        """Ids of the session's stored turns the model reads anyway among `messages`."""
        said = {
            stored_text(str(m.text), isinstance(m, AIMessage)).strip()
            for m in messages
            if isinstance(m, (HumanMessage, AIMessage))
        }
        turns = self.memory.turns(self.user_id, session_id)
        return [t.turn_id for t in turns if t.text.strip() in said]

    async def abefore_agent(
        self, state: ReflectiveMemoryState, runtime: Any
    ) -> dict[str, Any] | None:
        """Async twin of `before_agent`."""
        return await self.memory.arun(self.before_agent, state, runtime)

    def _request(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        retrieval = self._retrievals.get(request.state.get(_STATE_KEY))
        if retrieval is None or not retrieval.hits:
            return request
        block = format_memories(retrieval.hits, self.citation_instruction)
        return request.override(system_message=_with_memories(request.system_message, block))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        """Add the numbered memories to the system message of every model call of the run."""
        return handler(self._request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        """Async twin of `wrap_model_call`."""
        return await handler(self._request(request))

    def after_agent(self, state: ReflectiveMemoryState, runtime: Any) -> dict[str, Any] | None:
        """Record the exchange and send the answer's citations as feedback.

        A message's `name` (when a valid speaker label) is its stored role; the answer is stored
        without our citation marks, and feedback reads it with them.
        """
        asked, answered = _last_messages(state["messages"])
        question = None if asked is None else str(asked.text)
        answer = None if answered is None else str(answered.text)
        retrieval = self._retrievals.get(state.get(_STATE_KEY))
        if self.record and asked is not None:
            sid = self._tracker.current(message_time(asked.additional_kwargs))
            said = [(speaker_role(asked.name, "user"), question, asked)]
            if answered is not None:
                role = speaker_role(answered.name, "assistant")
                said.append((role, stored_text(answer, True), answered))
            turns = [
                {
                    "user_id": self.user_id,
                    "session_id": sid,
                    "role": r,
                    "text": t,
                    "timestamp": message_time(m.additional_kwargs),
                }
                for r, t, m in said
                if t is not None and t.strip()
            ]
            if turns:
                self.memory.add_turns(turns)
        if retrieval is not None:
            self._retrievals.pop(retrieval.retrieval_id)
            if answer is not None and retrieval.query == question:
                send_feedback(self.memory, retrieval, answer)
        return None

    async def aafter_agent(
        self, state: ReflectiveMemoryState, runtime: Any
    ) -> dict[str, Any] | None:
        """Async twin of `after_agent`."""
        return await self.memory.arun(self.after_agent, state, runtime)
