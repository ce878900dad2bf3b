"""A damaged `memory.sqlite3` surfaces as the library's typed errors, never a raw driver error."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, ReflectiveMemory, ReflectiveMemoryError


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("corrupt") / "m"
    with ReflectiveMemory(base, embedder=HashingEmbedder()) as mem:
        for i in range(60):
            mem.add_turn(
                "ana", f"s{i % 5}", "user", f"turn {i} about the lighthouse and {i * 7}",
                timestamp=f"2025-01-{i % 28 + 1:02d}",
            )  # fmt: skip
        for i in range(5):
            mem.end_session("ana", f"s{i}")
    return base


@pytest.mark.parametrize("seed", range(16))
def test_byte_flips_in_the_database_are_typed_errors_or_harmless(stored, tmp_path, seed):
    copy = tmp_path / "m"
    shutil.copytree(stored, copy)
    db = copy / "memory.sqlite3"
    data = bytearray(db.read_bytes())
    rng = random.Random(seed)
    for _ in range(30):
        data[rng.randrange(100, len(data))] ^= 0xFF
    db.write_bytes(bytes(data))
    try:
        with ReflectiveMemory(copy, embedder=HashingEmbedder()) as mem:
            mem.retrieve("ana", "lighthouse", k=3)
            mem.turns("ana", "s1")
            mem.stats("ana")
    except ReflectiveMemoryError:
        pass  # typed: StoreCorruptedError or StoreError, with the driver's error as the cause
