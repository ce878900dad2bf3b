"""Issue 50 (8): LlamaIndex `Memory` + our chat store + our block stores each message once.

`archived_run` dropped system messages but compared them against a tail that held them, so a
system message made the block store the flushed messages again (41 messages -> 45 turns; a
system note every few exchanges: 80 -> 191), and concurrent `aput` calls on one `Memory`
multiplied them (40-60 messages -> 476-1,271 turns) while 29-46 callers got
`SessionChangedError` although their messages were stored. Real `Memory`, real flushes.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402
from reflective_memory.errors import StoreCorruptedError  # noqa: E402

from llamaindex_reflective import ReflectiveDBChatStore, ReflectiveMemoryBlock  # noqa: E402


def _memory(mem, **kw) -> Memory:
    return Memory.from_defaults(
        session_id="conv",
        chat_store=ReflectiveDBChatStore(memory=mem, user_id="ana"),
        memory_blocks=[ReflectiveMemoryBlock(memory=mem, user_id="ana", **kw)],
        token_limit=120,
        token_flush_size=30,
        chat_history_token_ratio=0.5,
    )


def _said(i: int) -> ChatMessage:
    role = "user" if i % 2 == 0 else "assistant"
    return ChatMessage(role=role, content=f"message {i}: my garden has {i} tomato plants")


def _stored(mem) -> Counter[str]:
    return Counter(t.text for t in mem.turns("ana", "conv"))


def test_a_system_message_and_system_notes_are_stored_once(mem) -> None:
    memory = _memory(mem)
    messages = [ChatMessage(role="system", content="You are a gardening assistant.")]
    for i in range(80):
        messages.append(_said(i))
        if i % 6 == 5:  # a system note every few exchanges
            messages.append(ChatMessage(role="system", content=f"note {i}: be brief"))
    for m in messages:
        memory.put(m)
    stored = _stored(mem)
    assert max(stored.values()) == 1, stored.most_common(3)
    assert sum(stored.values()) == len(messages)  # the system ones too, once


def test_concurrent_aput_on_one_memory_stores_each_message_once(mem) -> None:
    memory = _memory(mem)

    async def run() -> list[object]:
        return await asyncio.gather(
            *(memory.aput(_said(i)) for i in range(50)), return_exceptions=True
        )

    out = asyncio.run(run())
    assert [r for r in out if r is not None] == []  # no caller got an error
    stored = _stored(mem)
    assert sum(stored.values()) == 50 and max(stored.values()) == 1, stored.most_common(3)


def test_a_block_with_another_chat_store_still_stores_what_is_flushed(mem, sql_memory) -> None:
    """The default SQL chat store's messages are not ours: the block stores them (once)."""
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana")
    memory = sql_memory(
        session_id="conv",
        memory_blocks=[block],
        token_limit=120,
        token_flush_size=30,
        chat_history_token_ratio=0.5,
    )
    for i in range(30):
        memory.put(_said(i))
    stored = _stored(mem)
    assert stored and max(stored.values()) == 1


def test_tampered_marks_are_a_typed_error(mem) -> None:
    """Near miss: marks stored as `["x", {}]` made `get_messages` raise a raw `ValueError`."""
    store = ReflectiveDBChatStore(memory=mem, user_id="ana")
    asyncio.run(store.add_message("conv", _said(0)))
    key = "llamaindex_reflective:marks:" + '["ana", "conv"]'
    mem.store.set_value(key, ["x", {}])
    with pytest.raises(StoreCorruptedError, match="marks of session 'conv'"):
        asyncio.run(store.get_messages("conv"))
