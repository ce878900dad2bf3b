"""Shared fixtures: a deterministic fake embedder, in-memory and on-disk memories, dev data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(dim=128)


#: Turn units ranked as units (the engine's unit-level behaviour; passages are tested in
#: tests/test_passages.py).
UNIT_CONFIG = {"granularities": ("turn",), "passages": False}


@pytest.fixture
def mem(embedder: HashingEmbedder) -> Iterator[ReflectiveMemory]:
    with ReflectiveMemory(embedder=embedder, config=MemoryConfig(**UNIT_CONFIG)) as m:
        yield m


@pytest.fixture
def disk_mem(tmp_path: Path, embedder: HashingEmbedder) -> Iterator[ReflectiveMemory]:
    with ReflectiveMemory(
        tmp_path / "store", embedder=embedder, config=MemoryConfig(**UNIT_CONFIG)
    ) as m:
        yield m


@pytest.fixture
def dev_data() -> Path:
    """The team's development data beside the repository (tests skip without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


def add_session(
    mem: ReflectiveMemory, user: str, session: str, texts: list[str], *, end: bool = True
) -> None:
    """Add alternating user/assistant turns and optionally end the session."""
    for i, text in enumerate(texts):
        mem.add_turn(user, session, "user" if i % 2 == 0 else "assistant", text)
    if end:
        mem.end_session(user, session)
