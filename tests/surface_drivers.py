"""One driver per surface for the surface contract (`reflective_memory.testing.surfaces`).

Each driver uses its surface the way that surface's users do (its README or docstring), gives a
message's own time wherever the framework has a place for one (`additional_kwargs["timestamp"]`
of LangChain and LlamaIndex messages, the MCP `timestamp` argument, the file's `timestamp`
field), and moves from one session to the next as the surface's documented use does. The core
records are read back from the surface's `ReflectiveMemory` (in-process surfaces) or from the
store file (MCP server, CLI).

The surfaces that take feedback are also `FeedbackDriver`s: they ask a question and send the
answer back the surface's way (the middleware and the classic chain memory send the model's
answer themselves, the LlamaIndex memory block and the MCP server take it in a call, the
LangChain compressor and the LlamaIndex postprocessor over the user's turns as another
retriever's documents); the turn ranker is read from the memory (`ranker_weights`), or for the
MCP server from its store with `reflective-memory weights`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

from hashing_cli import CONFIG_ENV
from langchain.agents import create_agent
from langchain_core._api import LangChainDeprecationWarning
from langchain_core.documents import Document
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.base.response.schema import Response
from llama_index.core.memory import Memory
from llama_index.core.schema import NodeWithScore, TextNode
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult
from pydantic import Field
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.cli import main as cli_main
from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.testing.surfaces import (
    BUDGET_TOKENS,
    USER_ID,
    Answered,
    Cites,
    CoreDriver,
    CoreView,
    Evidence,
    Message,
    answer_citing,
    answered,
)
from reflective_memory.types import Memory as CoreMemory
from reflective_memory.types import Turn
from test_mcp_server import _free_port, _ok, _text

from langchain_reflective import (
    CitationReranker,
    ReflectiveChatMemory,
    ReflectiveChatMessageHistory,
    ReflectiveMemoryMiddleware,
    ReflectiveStore,
)
from llamaindex_reflective import (
    ReflectiveDBChatStore,
    ReflectiveMemoryBlock,
    ReflectiveNodePostprocessor,
)

__all__ = [
    "HASHING_CLI",
    "MINILM_CLI",
    "CliDriver",
    "ChatMemoryDriver",
    "CompressorDriver",
    "HistoryDriver",
    "LlamaIndexDriver",
    "McpDriver",
    "MiddlewareDriver",
    "PostprocessorDriver",
    "StoreDriver",
    "StoreView",
    "readme_memory",
]

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
#: `python <these> ...` runs this checkout's `reflective-memory` with the hashing embedder.
HASHING_CLI = [str(ROOT / "tests" / "hashing_cli.py")]
#: `python <these> ...` runs this checkout's `reflective-memory` as installed (MiniLM).
MINILM_CLI = [
    "-c",
    f"import sys; sys.path[:0] = [{str(ROOT / 'shared')!r}, {str(ROOT)!r}]; "
    "from reflective_memory.cli import main; sys.exit(main(sys.argv[1:]))",
]
#: The README's `Memory` token limit (examples/llamaindex_chat.py).
README_TOKEN_LIMIT = 4000
#: An answer that cites nothing: stored as nothing (citation marks are stripped).
_NO_ANSWER = "[NO_CITE]"


def _time_kwargs(m: Message) -> dict[str, Any]:
    """A message's own time as LangChain and LlamaIndex messages carry it."""
    return _at(m.timestamp)


def _at(when: datetime | None) -> dict[str, Any]:
    """`{"timestamp": <ISO-8601>}`, or nothing for None."""
    return {} if when is None else {"timestamp": when.isoformat()}


def _stamped(m: Message) -> dict[str, Any]:
    """A turn as JSON (MCP `remember`, the CLI file): role, text and its own time if any."""
    return {"role": m.role, "text": m.text, **_time_kwargs(m)}


class StoreView:
    """The core records of a store directory another process writes (a `CoreView`)."""

    def __init__(self, directory: Path) -> None:
        self.store = SQLiteStore(directory / "memory.sqlite3")

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns, in order."""
        return self.store.turns(user_id, session_id)

    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the open sessions."""
        return [s.session_id for s in self.store.sessions(user_id, status="open")]

    def memories(self, user_id: str) -> list[CoreMemory]:
        """The user's memories."""
        return self.store.memories(user_id)

    def close(self) -> None:
        """Close the store."""
        self.store.close()


class _InProcess:
    """A surface over a `ReflectiveMemory` in this process (closed with the driver)."""

    name = ""
    carries_message_time = True

    def __init__(self, memory: ReflectiveMemory) -> None:
        self.memory = memory

    def finish(self) -> None:
        """Every message is stored as it is said."""

    def core(self) -> CoreView:
        """The surface's memory."""
        return self.memory

    def ranker(self, user_id: str) -> Mapping[str, Any]:
        """`ranker_weights(user_id)` of the surface's memory."""
        return self.memory.ranker_weights(user_id)

    def close(self) -> None:
        """Close the memory."""
        self.memory.close()


class _LoopThread:
    """An event loop in a thread: coroutines run on it from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


# -- LangChain -------------------------------------------------------------------------------------
class _ScriptedModel(GenericFakeChatModel):
    """A fake chat model answering with the queued messages; it keeps every prompt it got."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


class _Answers:
    """The iterator a `GenericFakeChatModel` reads its answers from, filled as we go.

    An answer may be a function, called when the model answers (it may read what the model
    was shown).
    """

    def __init__(self) -> None:
        self.queue: deque[AIMessage | Callable[[], AIMessage]] = deque()

    def __iter__(self) -> Iterator[AIMessage]:
        return self

    def __next__(self) -> AIMessage:
        answer = self.queue.popleft()
        return answer if isinstance(answer, AIMessage) else answer()


class MiddlewareDriver(_InProcess):
    """`ReflectiveMemoryMiddleware` in a `create_agent` agent, one checkpointer thread a session.

    The model is a fake that answers with the script's answer and keeps the prompts: the
    evidence is the system message the model sees. A new session is begun with the
    middleware's `end_session(next_session_id=...)`.
    """

    name = "LangChain middleware"
    takes_numbers = False

    def __init__(self, memory: ReflectiveMemory) -> None:
        super().__init__(memory)
        self._answers = _Answers()
        self.model = _ScriptedModel(messages=self._answers)
        self.middleware: ReflectiveMemoryMiddleware | None = None
        self.agent: Any = None
        self._thread = ""

    def _start(self, session_id: str) -> None:
        self.middleware = ReflectiveMemoryMiddleware(
            memory=self.memory,
            user_id=USER_ID,
            session_id=session_id,
            budget_tokens=BUDGET_TOKENS,
        )
        self.agent = create_agent(
            self.model,
            middleware=[self.middleware],
            checkpointer=InMemorySaver(),
            **self._agent_extras(),
        )
        self._thread = session_id

    def _agent_extras(self) -> dict[str, Any]:
        """What else `create_agent` is given (nothing: the middleware alone)."""
        return {}

    def _ask(self, question: HumanMessage, answer: AIMessage | Callable[[], AIMessage]) -> None:
        self._answers.queue.append(answer)
        config = {"configurable": {"thread_id": self._thread}}
        self.agent.invoke({"messages": [question]}, config)

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """One agent run: the user's message in, the script's answer out."""
        if self.middleware is None:
            self._start(session_id)
        self._ask(
            HumanMessage(user.text, additional_kwargs=_time_kwargs(user)),
            AIMessage(assistant.text, additional_kwargs=_time_kwargs(assistant)),
        )

    def switch_session(self, previous: str, new: str) -> None:
        """`end_session(next_session_id=new)`, and a new conversation thread."""
        assert self.middleware is not None
        self.middleware.end_session(next_session_id=new)
        self._thread = new

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """The system message of the model call answering `question` (said at `now`)."""
        self._ask(HumanMessage(question, additional_kwargs=_at(now)), AIMessage(_NO_ANSWER))
        system = [m for m in self.model.seen[-1] if isinstance(m, SystemMessage)]
        return Evidence(system[0].text if system else "", BUDGET_TOKENS)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """An agent run whose model cites `cites(shown)`; the middleware sends the answer."""
        assert not numbers, "the middleware takes the model's answer only"

        def reply() -> AIMessage:  # the model answers from what the middleware showed it
            assert self.middleware is not None
            last = self.middleware.last_retrieval
            return AIMessage(answer_citing(cites(0 if last is None else len(last.hits))))

        self._ask(HumanMessage(question), reply)
        assert self.middleware is not None
        return answered(self.middleware.last_retrieval)


class ChatMemoryDriver(_InProcess):
    """`ReflectiveChatMemory` as a classic chain calls it: load, then save, per exchange.

    A message's own time goes in the chain's inputs and outputs (`timestamp`). With
    `return_messages=True` the memories are one system message (the evidence).
    """

    name = "LangChain classic memory"
    takes_numbers = False

    def __init__(self, memory: ReflectiveMemory) -> None:
        super().__init__(memory)
        self.chat: ReflectiveChatMemory | None = None

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """`load_memory_variables` for the input, `save_context` with the answer."""
        if self.chat is None:
            self.chat = ReflectiveChatMemory(
                memory=self.memory,
                user_id=USER_ID,
                session_id=session_id,
                budget_tokens=BUDGET_TOKENS,
                return_messages=True,
            )
        asked = {"input": user.text, **_time_kwargs(user)}
        self.chat.load_memory_variables(asked)
        self.chat.save_context(asked, {"output": assistant.text, **_time_kwargs(assistant)})

    def switch_session(self, previous: str, new: str) -> None:
        """`end_session(next_session_id=new)`."""
        assert self.chat is not None
        self.chat.end_session(next_session_id=new)

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """The system message `load_memory_variables` gives for `question` (said at `now`)."""
        assert self.chat is not None
        history = self.chat.load_memory_variables({"input": question, **_at(now)})["history"]
        system = [m for m in history if isinstance(m, SystemMessage)]
        return Evidence(system[0].text if system else "", BUDGET_TOKENS)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """`load_memory_variables`, then `save_context` with the answer (the memory sends it)."""
        assert not numbers and self.chat is not None, "the chain memory takes the answer only"
        asked = {"input": question}
        self.chat.load_memory_variables(asked)
        shown = answered(self.chat.last_retrieval)
        self.chat.save_context(asked, {"output": answer_citing(cites(shown.shown))})
        return shown


class HistoryDriver(_InProcess):
    """`ReflectiveChatMessageHistory` behind `RunnableWithMessageHistory`, a history per session.

    The chain answers with the script's answer; the history stores both messages. When the
    conversation moves on, the previous session's history is ended (`end_session()`). The
    history takes no question, so it has no evidence.
    """

    name = "LangChain chat history"

    def __init__(self, memory: ReflectiveMemory) -> None:
        super().__init__(memory)
        self.histories = ReflectiveChatMessageHistory.factory(memory=memory, user_id=USER_ID)
        self._answer: AIMessage | None = None
        with warnings.catch_warnings():  # deprecated in favour of LangGraph, still documented
            warnings.simplefilter("ignore", LangChainDeprecationWarning)
            self.chain = RunnableWithMessageHistory(
                RunnableLambda(self._respond), get_session_history=self.histories
            )

    def _respond(self, messages: list[BaseMessage]) -> AIMessage:
        assert self._answer is not None
        return self._answer

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """One chain run in the session's history."""
        self._answer = AIMessage(assistant.text, additional_kwargs=_time_kwargs(assistant))
        question = HumanMessage(user.text, additional_kwargs=_time_kwargs(user))
        self.chain.invoke([question], {"configurable": {"session_id": session_id}})

    def switch_session(self, previous: str, new: str) -> None:
        """End the previous session's history."""
        self.histories(previous).end_session()

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """A chat history retrieves nothing for a question."""
        raise NotImplementedError("a chat message history takes no question")


class StoreDriver(MiddlewareDriver):
    """The README's LangGraph agent: `create_agent(..., middleware=[...], store=ReflectiveStore)`.

    The store holds what the agent's tools put there (items, not turns); the conversation is
    recorded by the middleware. A new session is a new agent whose middleware names the next
    session id, with no explicit end: the core ends the previous session when the new one
    begins (`sessions.end_on_new_session`).
    """

    name = "LangGraph store"

    def _agent_extras(self) -> dict[str, Any]:
        """The README's store beside the middleware."""
        return {"store": ReflectiveStore(memory=self.memory)}

    def switch_session(self, previous: str, new: str) -> None:
        """A new agent for the next session (the middleware is told only its id)."""
        self._start(new)


# -- LlamaIndex ------------------------------------------------------------------------------------
def readme_memory(memory: ReflectiveMemory, session_id: str, **block: Any) -> Memory:
    """The README's `Memory`: a `ReflectiveDBChatStore`, a `ReflectiveMemoryBlock`, 4000 tokens."""
    return Memory.from_defaults(
        session_id=session_id,
        chat_store=ReflectiveDBChatStore(memory=memory, user_id=USER_ID),
        memory_blocks=[ReflectiveMemoryBlock(memory=memory, user_id=USER_ID, priority=1, **block)],
        token_limit=README_TOKEN_LIMIT,
    )


_BLOCK = re.compile(r"<reflective_memory>\s*(.*?)\s*</reflective_memory>", re.S)


class LlamaIndexDriver(_InProcess):
    """LlamaIndex `Memory` as in the README, one `Memory` per session, `put` or `aput`.

    A message's own time goes in `additional_kwargs["timestamp"]`. The evidence is asked as
    `SimpleChatEngine.chat` does (put the question, then `get()`): the block's part of the
    system message.
    """

    takes_numbers = False

    def __init__(self, memory: ReflectiveMemory, *, use_async: bool) -> None:
        super().__init__(memory)
        self.name = "LlamaIndex Memory (aput)" if use_async else "LlamaIndex Memory (put)"
        self._loop = _LoopThread() if use_async else None
        self.chat: Memory | None = None

    def _put(self, message: ChatMessage) -> None:
        assert self.chat is not None
        if self._loop is None:
            self.chat.put(message)
        else:
            self._loop.run(self.chat.aput(message))

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """Put both messages."""
        if self.chat is None:
            self.switch_session("", session_id)
        for m in (user, assistant):
            self._put(ChatMessage(role=m.role, content=m.text, additional_kwargs=_time_kwargs(m)))

    def switch_session(self, previous: str, new: str) -> None:
        """A new `Memory` for the new session id (the README makes one per session)."""
        self.chat = readme_memory(self.memory, new, budget_tokens=BUDGET_TOKENS)

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """The memory block in the system message `get()` gives after the question is put.

        A `now` is the question's own time (`additional_kwargs["timestamp"]`).
        """
        assert self.chat is not None
        self._put(ChatMessage(role="user", content=question, additional_kwargs=_at(now)))
        if self._loop is None:
            messages = self.chat.get()
        else:
            messages = self._loop.run(self.chat.aget())
        system = next((m for m in messages if m.role == "system"), None)
        found = None if system is None else _BLOCK.search(str(system.content))
        return Evidence("" if found is None else found.group(1), BUDGET_TOKENS)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """Ask as `evidence` does, then the memory block's `feedback(answer)`."""
        assert not numbers and self.chat is not None, "the memory block takes the answer only"
        self.evidence(question)
        block = self.chat.memory_blocks[0]
        assert isinstance(block, ReflectiveMemoryBlock)
        shown = answered(block.last_retrieval)
        block.feedback(answer_citing(cites(shown.shown)))
        return shown

    def close(self) -> None:
        """Stop the loop and close the memory."""
        if self._loop is not None:
            self._loop.close()
        super().close()


# -- rerankers over another retriever's results ----------------------------------------------------
class CompressorDriver(CoreDriver):
    """The core API for the conversation; questions through LangChain's `CitationReranker`.

    The documents of "another retriever" are the user's stored turns; the compressor keeps the
    best `top_n` of them and `feedback(query, documents, answer)` sends the answer back.
    Asking adds nothing to the memory, so its scores (`relevance_score`) tell the rankings
    apart.
    """

    name = "LangChain compressor"
    takes_numbers = False

    def __init__(self, memory: ReflectiveMemory) -> None:
        super().__init__(memory)
        self.compressor = CitationReranker(memory=memory, user_id=USER_ID, top_n=5)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """`compress_documents`, then `feedback` with an answer citing `[i]`."""
        assert not numbers, "the compressor takes an answer's text only"
        docs = [Document(t.text, id=t.turn_id) for t in self.memory.turns(self.user_id)]
        shown = self.compressor.compress_documents(docs, question)
        self.compressor.feedback(question, shown, answer_citing(cites(len(shown))))
        scores = tuple(float(d.metadata["relevance_score"]) for d in shown)
        return Answered(len(shown), scores, None)


class PostprocessorDriver(CoreDriver):
    """The core API for the conversation; questions through `ReflectiveNodePostprocessor`.

    The nodes of "another retriever" are the user's stored turns; the answer cites its sources
    as LlamaIndex's citation prompts number them (`Source 1`, ...), and `feedback(response)`
    (or `cited=`) sends it back.
    """

    name = "LlamaIndex postprocessor"
    takes_numbers = True

    def __init__(self, memory: ReflectiveMemory) -> None:
        super().__init__(memory)
        self.postprocessor = ReflectiveNodePostprocessor(
            memory=memory, user_id=USER_ID, top_n=5, candidate_k=1000
        )

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """`postprocess_nodes`, then `feedback` on a `Response` citing `Source i`."""
        pp = self.postprocessor
        turns = self.memory.turns(self.user_id)
        nodes = [NodeWithScore(node=TextNode(text=t.text, id_=t.turn_id)) for t in turns]
        shown = pp.postprocess_nodes(nodes, query_str=question)
        sources = [p + pp.citation_base for p in cites(len(shown))]
        said = " ".join(f"Source {s} says so." for s in sources) or "[NO_CITE]"
        record = pp.rankings[-1].ranked.record
        pp.feedback(Response(response=said, source_nodes=shown), cited=sources if numbers else None)
        return Answered(len(shown), tuple(float(n.score or 0.0) for n in shown), record)


# -- MCP -------------------------------------------------------------------------------------------
class _McpSession:
    """One MCP client session held open in a loop thread; `call` makes a tool call."""

    def __init__(self, open_streams: Callable[[], Any]) -> None:
        self._loop = _LoopThread()
        self._calls: asyncio.Queue[Any] | None = None
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._task = asyncio.run_coroutine_threadsafe(
            self._hold(open_streams, ready), self._loop.loop
        )
        ready.result(timeout=120)

    async def _hold(
        self, open_streams: Callable[[], Any], ready: concurrent.futures.Future[None]
    ) -> None:
        self._calls = asyncio.Queue()
        try:
            async with open_streams() as streams, ClientSession(*streams[:2]) as session:
                await session.initialize()
                ready.set_result(None)
                while (call := await self._calls.get()) is not None:
                    name, args, done = call
                    try:
                        done.set_result(await session.call_tool(name, args))
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        done.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def call(self, name: str, args: dict[str, Any]) -> CallToolResult:
        done: concurrent.futures.Future[CallToolResult] = concurrent.futures.Future()
        assert self._calls is not None
        self._loop.loop.call_soon_threadsafe(self._calls.put_nowait, (name, args, done))
        return done.result(timeout=600)

    def close(self) -> None:
        assert self._calls is not None
        self._loop.loop.call_soon_threadsafe(self._calls.put_nowait, None)
        with contextlib.suppress(Exception):
            self._task.result(timeout=60)
        self._loop.close()


@asynccontextmanager
async def _http_streams(url: str, token: str) -> AsyncIterator[tuple[Any, Any]]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            yield read, write


def _wait_for_port(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.1)


class McpDriver:
    """The MCP server (`reflective-memory mcp`) through the official SDK client, one session.

    Over stdio the client starts the server; over HTTP the server runs on a free loopback port
    with a token for the user. Each exchange is one `remember` call (with the messages' own
    times); moving on ends the previous session with the `end_session` tool, as the server's
    instructions ask; the evidence is the text of a `recall` with the budget. An answer is a
    `recall` and a `feedback` call naming its `retrieval_id`; the turn ranker is read from the
    store (`reflective-memory weights`), so give `settings` that save every episode.

    Args:
        directory: The store directory of the server.
        transport: `stdio` or `http`.
        cli: The arguments after `python` that run the CLI (`HASHING_CLI` or `MINILM_CLI`).
        settings: The server's `MemoryConfig` groups (`HASHING_CLI` only; None: defaults).
    """

    carries_message_time = True
    takes_numbers = True
    _TOKEN = "surface-contract-token-0123456789"

    def __init__(
        self,
        directory: Path,
        transport: str,
        cli: list[str],
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.name = f"MCP server ({transport})"
        self.directory = directory
        self._server: subprocess.Popen[bytes] | None = None
        self._view: StoreView | None = None
        env = {} if settings is None else {CONFIG_ENV: json.dumps(settings)}
        store = ["--db", str(directory / "db")]
        if transport == "stdio":
            params = StdioServerParameters(
                command=sys.executable, args=[*cli, "mcp", *store, "--user", USER_ID], env=env
            )
            self.session = _McpSession(lambda: stdio_client(params))
            return
        port = _free_port()
        argv = [sys.executable, *cli, "mcp", *store, "--transport", "http", "--port", str(port)]
        log = directory / "server.log"
        with log.open("w") as out:
            self._server = subprocess.Popen(
                [*argv, "--token", f"{USER_ID}={self._TOKEN}"],
                stdout=out,
                stderr=out,
                env={**os.environ, **env},
            )
        _wait_for_port(self._server, port, log)
        url = f"http://127.0.0.1:{port}/mcp"
        self.session = _McpSession(lambda: _http_streams(url, self._TOKEN))

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """`remember` the exchange."""
        turns = [_stamped(user), _stamped(assistant)]
        _ok(self.session.call("remember", {"session_id": session_id, "turns": turns}))

    def switch_session(self, previous: str, new: str) -> None:
        """`end_session` of the previous session."""
        _ok(self.session.call("end_session", {"session_id": previous}))

    def finish(self) -> None:
        """Every exchange is stored as it is said."""

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """What `recall` shows the model (its `now` argument for `now`)."""
        args: dict[str, Any] = {"query": question, "budget_tokens": BUDGET_TOKENS}
        if now is not None:
            args["now"] = now.isoformat()
        found = self.session.call("recall", args)
        _ok(found)
        return Evidence(_text(found), BUDGET_TOKENS)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """`recall`, then `feedback` with its `retrieval_id` and the answer (or `cited`).

        Raises:
            InvalidInputError: `feedback` answered with `isError` (its message).
        """
        found = _ok(
            self.session.call("recall", {"query": question, "budget_tokens": BUDGET_TOKENS})
        )
        passages = found["passages"]
        positions = list(cites(len(passages)))
        said = {"cited": positions} if numbers else {"answer": answer_citing(positions)}
        result = self.session.call("feedback", {"retrieval_id": found["retrieval_id"], **said})
        if result.isError:
            raise InvalidInputError(_text(result))
        return Answered(len(passages), tuple(p["score"] for p in passages), None)

    def ranker(self, user_id: str) -> Mapping[str, Any]:
        """The user's turn ranker as the server stored it (`reflective-memory weights`)."""
        db = str(self.directory / "db")
        return json.loads(_cli("weights", "--db", db, "--user", user_id, "--json"))

    def core(self) -> CoreView:
        """The server's store, read from its file."""
        if self._view is None:
            self._view = StoreView(self.directory / "db")
        return self._view

    def close(self) -> None:
        """End the client session and the server."""
        self.session.close()
        if self._view is not None:
            self._view.close()
        if self._server is not None:
            self._server.terminate()
            self._server.wait(timeout=30)


# -- CLI -------------------------------------------------------------------------------------------
def _cli(*argv: str, hashing: bool = False) -> str:
    """What `reflective-memory ARGV...` prints, run in this process (with `hashing`: with the
    hashing embedder as the default)."""
    out = io.StringIO()
    patch = (
        mock.patch("reflective_memory.engine.default_embedder", lambda: HashingEmbedder(256))
        if hashing
        else contextlib.nullcontext()
    )
    with patch, contextlib.redirect_stdout(out):
        code = cli_main(list(argv))
    assert code == 0, f"reflective-memory {' '.join(argv)} exited with {code}"
    return out.getvalue()


class CliDriver:
    """`reflective-memory ingest` of the conversation as a `reflective-memory/v1` file.

    The conversation is written to a file (each message with its own time where it has one)
    and ingested once it is over; `search` gives the evidence (it takes `--k`, no budget).

    Args:
        directory: Where the file and the store go.
        hashing: Ingest with the hashing embedder (else MiniLM, as installed).
    """

    name = "CLI ingest"
    carries_message_time = True

    def __init__(self, directory: Path, *, hashing: bool) -> None:
        self.directory = directory
        self.db = directory / "db"
        self.hashing = hashing
        self.sessions: dict[str, list[dict[str, Any]]] = {}
        self._view: StoreView | None = None

    def _cli(self, *argv: str) -> str:
        return _cli(*argv, hashing=self.hashing)

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """Write the exchange into the session of the file."""
        self.sessions.setdefault(session_id, []).extend([_stamped(user), _stamped(assistant)])

    def switch_session(self, previous: str, new: str) -> None:
        """Sessions are the file's: nothing to do."""

    def finish(self) -> None:
        """Write the file and ingest it."""
        data = {
            "format": "reflective-memory/v1",
            "sessions": [{"session_id": s, "turns": t} for s, t in self.sessions.items()],
        }
        path = self.directory / "conversation.json"
        path.write_text(json.dumps(data), "utf-8")
        self._cli("ingest", str(path), "--user", USER_ID, "--db", str(self.db), "--quiet")

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """What `reflective-memory search` prints for the question (`--now` for `now`)."""
        when = [] if now is None else ["--now", now.isoformat()]
        return Evidence(
            self._cli("search", question, "--user", USER_ID, "--db", str(self.db), *when), None
        )

    def core(self) -> CoreView:
        """The ingested store, read from its file."""
        if self._view is None:
            self._view = StoreView(self.db)
        return self._view

    def close(self) -> None:
        """Close the store view."""
        if self._view is not None:
            self._view.close()
