"""Every surface runs the surface contract (`reflective_memory.testing.surfaces`).

One scripted conversation goes through the core API, the LangChain middleware (`create_agent`),
the classic chain memory, the chat message history, the LangGraph store, LlamaIndex `Memory`
(`put` and `aput`), the MCP server (stdio and HTTP, through the SDK client) and CLI `ingest`
(drivers in `tests/surface_drivers.py`). `TestSurfaceTurns` compares what each stored with what
the core API stored (hashing embedder); `TestSurfaceEvidence` checks what each shows the model
(MiniLM, integration) on the conversation with its long session cut to 20 filler exchanges (long
enough for memories to compete for the budget, too short for LlamaIndex to flush).
`TestSurfaceTimes` drives a log dated with naive times, the answers without a time, through every
surface and asks "two weeks ago" at a given `now` (hashing embedder).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("langchain_classic")
pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.storage.chat_store.base_db import MessageStatus  # noqa: E402
from reflective_memory import HashingEmbedder, ReflectiveMemory  # noqa: E402
from reflective_memory.embed import Embedder, default_embedder  # noqa: E402
from reflective_memory.testing.surfaces import (  # noqa: E402
    CONVERSATION,
    DATED_CONVERSATION,
    QUESTIONS,
    TIME_QUESTIONS,
    CoreDriver,
    SurfaceContract,
    SurfaceDriver,
    SurfaceEvidenceContract,
    SurfaceRun,
    SurfaceTimeContract,
    run_surface,
)
from surface_drivers import (  # noqa: E402
    HASHING_CLI,
    MINILM_CLI,
    ChatMemoryDriver,
    CliDriver,
    HistoryDriver,
    LlamaIndexDriver,
    McpDriver,
    MiddlewareDriver,
    StoreDriver,
    readme_memory,
)

#: A driver of a surface, made from a fresh store directory and the embedder of the run.
Make = Callable[[Path, Embedder], SurfaceDriver]


def _memory(embedder: Embedder) -> ReflectiveMemory:
    return ReflectiveMemory(embedder=embedder)


def _hashing_or_minilm(embedder: Embedder) -> list[str]:
    return HASHING_CLI if isinstance(embedder, HashingEmbedder) else MINILM_CLI


SURFACES: dict[str, Make] = {
    "core": lambda tmp, e: CoreDriver(_memory(e)),
    "langchain-middleware": lambda tmp, e: MiddlewareDriver(_memory(e)),
    "langchain-classic-memory": lambda tmp, e: ChatMemoryDriver(_memory(e)),
    "langchain-history": lambda tmp, e: HistoryDriver(_memory(e)),
    "langgraph-store": lambda tmp, e: StoreDriver(_memory(e)),
    "llamaindex-put": lambda tmp, e: LlamaIndexDriver(_memory(e), use_async=False),
    "llamaindex-aput": lambda tmp, e: LlamaIndexDriver(_memory(e), use_async=True),
    "mcp-stdio": lambda tmp, e: McpDriver(tmp, "stdio", _hashing_or_minilm(e)),
    "mcp-http": lambda tmp, e: McpDriver(tmp, "http", _hashing_or_minilm(e)),
    "cli-ingest": lambda tmp, e: CliDriver(tmp, hashing=isinstance(e, HashingEmbedder)),
}
#: The surfaces that show the model memories. A chat message history takes no question; the
#: MCP `recall` result does not depend on the transport, so it is read over stdio only.
WITH_EVIDENCE = [name for name in SURFACES if name not in ("langchain-history", "mcp-http")]


def _drive(make: Make, tmp: Path, embedder: Embedder, **kw: object) -> SurfaceRun:
    driver = make(tmp, embedder)
    try:
        return run_surface(driver, **kw)  # type: ignore[arg-type]
    finally:
        driver.close()


@pytest.fixture(scope="module")
def core_run(tmp_path_factory: pytest.TempPathFactory) -> SurfaceRun:
    """The core API's run: the turns every surface must store."""
    return _drive(SURFACES["core"], tmp_path_factory.mktemp("core"), HashingEmbedder(256))


class TestSurfaceTurns(SurfaceContract):
    @pytest.fixture(scope="class", params=list(SURFACES))
    def surface_run(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> SurfaceRun:
        tmp = tmp_path_factory.mktemp(request.param)
        return _drive(SURFACES[request.param], tmp, HashingEmbedder(256))


class TestSurfaceTimes(SurfaceTimeContract):
    @pytest.fixture(scope="class", params=list(SURFACES))
    def time_run(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> SurfaceRun:
        tmp = tmp_path_factory.mktemp(f"time-{request.param}")
        asked = TIME_QUESTIONS if request.param in WITH_EVIDENCE else ()
        return _drive(
            SURFACES[request.param],
            tmp,
            HashingEmbedder(256),
            conversation=DATED_CONVERSATION,
            asked_at=asked,
        )


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    """The default embedder, loaded once for the in-process surfaces."""
    return default_embedder()


@pytest.mark.integration
class TestSurfaceEvidence(SurfaceEvidenceContract):
    @pytest.fixture(scope="class", params=WITH_EVIDENCE)
    def evidence_run(
        self,
        request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory,
        minilm: Embedder,
    ) -> SurfaceRun:
        tmp = tmp_path_factory.mktemp(request.param)
        conversation = CONVERSATION.shortened(filler=20)
        return _drive(
            SURFACES[request.param], tmp, minilm, conversation=conversation, questions=QUESTIONS
        )


def test_the_conversation_tells_its_messages_apart() -> None:
    """No message's text is found inside another's, so the evidence checks find each one."""
    texts = [m.text for _, m in CONVERSATION.messages()]
    assert len(set(texts)) == len(texts)
    for a in texts:
        assert [b for b in texts if a in b] == [a], a
    long = max(CONVERSATION.sessions, key=lambda s: len(s.exchanges))
    assert len(long.exchanges) == 60
    assert any(m.timestamp for _, m in CONVERSATION.messages())


def test_llamaindex_memory_stores_one_turn_per_message() -> None:
    """120 messages put through the README's `Memory` leave exactly 120 turns in the core."""
    long = max(CONVERSATION.sessions, key=lambda s: len(s.exchanges))
    with ReflectiveMemory(embedder=HashingEmbedder(256)) as memory:
        chat = readme_memory(memory, long.session_id)
        for ex in long.exchanges:
            for m in (ex.user, ex.assistant):
                chat.put(ChatMessage(role=m.role, content=m.text))
        stored = len(memory.turns(CONVERSATION.user_id))
        assert stored == 120, f"120 messages put, {stored} turns in the core"
        assert chat.get_all(MessageStatus.ARCHIVED), "the Memory never flushed to its blocks"
        shown = len(chat.get_all())
        assert shown == 120, f"120 messages put, Memory.get_all() returns {shown}"
