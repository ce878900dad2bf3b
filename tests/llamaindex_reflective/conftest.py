"""Fixtures of the LlamaIndex adapter tests."""

import asyncio
from collections.abc import Callable, Iterator

import pytest
from llama_index.core.memory import Memory
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from sqlalchemy.ext.asyncio import create_async_engine


@pytest.fixture
def mem():
    cfg = MemoryConfig(units={"granularities": ("turn",)}, search={"mode": "dense"})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as m:
        yield m


@pytest.fixture
def sql_memory() -> Iterator[Callable[..., Memory]]:
    """`Memory.from_defaults` over LlamaIndex's default SQL chat store, closed after the test.

    Its in-memory aiosqlite connection is made inside whichever event loop first uses it; left
    for the garbage collector, it was closed inside a later test's loop, and its worker thread
    could answer after that loop had ended ("Event loop is closed" in another test's warnings).
    """
    engines = []

    def build(**kw) -> Memory:
        engine = create_async_engine("sqlite+aiosqlite:///:memory:")  # the store's default
        engines.append(engine)
        return Memory.from_defaults(async_engine=engine, **kw)

    yield build
    for engine in engines:
        asyncio.run(engine.dispose())
