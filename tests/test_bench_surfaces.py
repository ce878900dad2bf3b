"""`bench li-memory`: LlamaIndex Memory over our chat store and block stores each message once."""

from __future__ import annotations

import pytest
from reflective_memory import HashingEmbedder

pytest.importorskip("llama_index.core")

from reflective_bench.surfaces import time_llamaindex_memory  # noqa: E402


def test_memory_flushing_to_our_block_stores_each_message_once() -> None:
    # 120 messages at a 1,000-token limit: Memory flushes to the block many times
    r = time_llamaindex_memory(HashingEmbedder(128), messages=120, token_limit=1000)
    assert r["core_turns"] == 120
    assert r["put_ms"]["p50"] > 0 and r["ratio_p50"] > 0
