from __future__ import annotations

import inspect

import pytest
from lc_helpers import FeedbackMemory, new_memory, populate
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory


@pytest.fixture
def mem() -> ReflectiveMemory:
    with new_memory() as m:
        yield populate(m)


@pytest.fixture
def fmem() -> FeedbackMemory:
    with FeedbackMemory(
        embedder=HashingEmbedder(), config=MemoryConfig(units={"granularities": ("turn",)})
    ) as m:
        yield populate(m)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    """Run this directory's async tests (ours and langchain_tests') with pytest-asyncio."""
    if name.startswith("test") and inspect.iscoroutinefunction(obj):
        pytest.mark.asyncio(obj)
