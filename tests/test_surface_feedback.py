"""Every surface that takes feedback passes the feedback contract: it teaches the turn ranker.

`SurfaceFeedbackContract` (`reflective_memory.testing.surfaces`) runs against each surface that
takes feedback (drivers in `tests/surface_drivers.py`, hashing embedder): the core API's
`feedback`, the LangChain middleware and classic chain memory (which send the agent's answer
themselves), the LlamaIndex memory block's `feedback`, the LangChain compressor and the
LlamaIndex postprocessor over another retriever's documents, and the MCP server's `feedback`
tool over stdio and HTTP (through the SDK client, the server in a subprocess). After the
scripted conversation an answer citing a passage is one episode of the user's turn ranker, the
next question through the surface is ranked with what it taught, another user's ranker stays
as it was, and answers citing nothing, everything or no shown passage teach nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("langchain_classic")
pytest.importorskip("llama_index.core")

from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory  # noqa: E402
from reflective_memory.testing.surfaces import (  # noqa: E402
    CoreDriver,
    FeedbackDriver,
    SurfaceFeedbackContract,
    run_surface,
    teach_other_user,
)
from surface_drivers import (  # noqa: E402
    HASHING_CLI,
    ChatMemoryDriver,
    CompressorDriver,
    LlamaIndexDriver,
    McpDriver,
    MiddlewareDriver,
    PostprocessorDriver,
)

#: The memory's settings on every surface: each episode saved at once (the MCP server's store is
#: read while it runs), a step large enough to see.
SETTINGS: dict[str, Any] = {"rerank": {"save_every": 1, "turn_learning_rate": 0.2}}

#: A feedback driver over a fresh store directory.
Make = Callable[[Path], FeedbackDriver]


def _memory(path: Path | None = None) -> ReflectiveMemory:
    """A memory in which the other user has learned from one answer already."""
    memory = ReflectiveMemory(path, embedder=HashingEmbedder(256), config=MemoryConfig(**SETTINGS))
    teach_other_user(memory)
    return memory


def _in_process(make: Callable[[ReflectiveMemory], FeedbackDriver]) -> Make:
    return lambda tmp: make(_memory())


def _mcp(transport: str) -> Make:
    def make(tmp: Path) -> FeedbackDriver:
        _memory(tmp / "db").close()  # the server opens the store the other user is in
        return McpDriver(tmp, transport, HASHING_CLI, settings=SETTINGS)

    return make


SURFACES: dict[str, Make] = {
    "core": _in_process(CoreDriver),
    "langchain-middleware": _in_process(MiddlewareDriver),
    "langchain-classic-memory": _in_process(ChatMemoryDriver),
    "llamaindex-block": _in_process(lambda m: LlamaIndexDriver(m, use_async=False)),
    "langchain-compressor": _in_process(CompressorDriver),
    "llamaindex-postprocessor": _in_process(PostprocessorDriver),
    "mcp-stdio": _mcp("stdio"),
    "mcp-http": _mcp("http"),
}


class TestSurfaceFeedback(SurfaceFeedbackContract):
    @pytest.fixture(scope="class", params=list(SURFACES))
    def feedback_driver(
        self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[FeedbackDriver]:
        driver = SURFACES[request.param](tmp_path_factory.mktemp(request.param))
        try:
            run_surface(driver)
            yield driver
        finally:
            driver.close()


def test_the_contract_modules_examples_run() -> None:
    import doctest

    import reflective_memory.testing.surfaces

    assert doctest.testmod(reflective_memory.testing.surfaces).failed == 0
