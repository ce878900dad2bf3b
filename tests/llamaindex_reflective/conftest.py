import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory


@pytest.fixture
def mem():
    cfg = MemoryConfig(units={"granularities": ("turn",)}, search={"mode": "dense"})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as m:
        yield m
