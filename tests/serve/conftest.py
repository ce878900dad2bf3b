from __future__ import annotations

from collections.abc import Iterator

import pytest
from reflective_memory import ReflectiveMemory
from serve_helpers import seeded_memory


@pytest.fixture
def smem() -> Iterator[ReflectiveMemory]:
    mem = seeded_memory()
    try:
        yield mem
    finally:
        mem.close()
