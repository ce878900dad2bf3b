import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.core.storage.chat_store.base_db import MessageStatus
from reflective_memory import InvalidInputError, ReflectiveMemory

from llamaindex_reflective import ReflectiveChatStore, ReflectiveDBChatStore


def U(t):
    return ChatMessage(role="user", content=t)


def A(t):
    return ChatMessage(role="assistant", content=t)


def texts(msgs):
    return [(str(m.role.value), m.content) for m in msgs]


def test_seven_methods(mem):
    store = ReflectiveChatStore(memory=mem, user_id="ana")
    assert store.get_messages("s1") == [] and store.get_keys() == []
    assert store.delete_messages("s1") is None and store.delete_last_message("s1") is None
    store.add_message("s1", U("hi"))
    store.add_message("s1", A("hello"))
    store.add_message("s1", U("my dog is Pixel"))
    assert texts(store.get_messages("s1")) == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "my dog is Pixel"),
    ]
    assert store.get_keys() == ["s1"]
    assert store.delete_message("s1", 1).content == "hello"
    assert store.delete_message("s1", 9) is None
    assert store.delete_last_message("s1").content == "my dog is Pixel"
    assert texts(store.get_messages("s1")) == [("user", "hi")]
    # deleted messages are gone from the core too
    assert [t.text for t in mem.turns("ana", "s1")] == ["hi"]
    store.set_messages("s1", [U("hi"), A("hey there")])
    assert texts(store.get_messages("s1")) == [("user", "hi"), ("assistant", "hey there")]
    assert [t.turn_id for t in mem.turns("ana", "s1")][0] == "s1:0"  # unchanged prefix kept
    gone = store.delete_messages("s1")
    assert texts(gone) == [("user", "hi"), ("assistant", "hey there")]
    assert store.get_messages("s1") == []
    # clearing ended the session: what was said is long-term memory now
    assert mem.open_sessions("ana") == []
    assert "hey there" in mem.retrieve("ana", "hey there").hits[0].memory.text
    store.add_message("s1", U("a new start"))
    assert texts(store.get_messages("s1")) == [("user", "a new start")]


def test_users_are_isolated_and_durable(tmp_path):
    mem = ReflectiveMemory(
        tmp_path / "m", embedder=__import__("reflective_memory").HashingEmbedder(64)
    )
    a = ReflectiveChatStore(memory=mem, user_id="ana")
    b = ReflectiveChatStore(memory=mem, user_id="bob")
    a.add_message("chat", U("ana secret"))
    b.add_message("chat", U("bob secret"))
    assert texts(a.get_messages("chat")) == [("user", "ana secret")]
    assert texts(b.get_messages("chat")) == [("user", "bob secret")]
    mem.close()
    mem2 = ReflectiveMemory(
        tmp_path / "m", embedder=__import__("reflective_memory").HashingEmbedder(64)
    )
    again = ReflectiveChatStore(memory=mem2, user_id="ana")
    assert texts(again.get_messages("chat")) == [("user", "ana secret")]
    assert again.forget("chat") == 1 and again.get_keys() == [] and again.forget("chat") == 0
    mem2.close()


def test_rich_messages_round_trip(mem):
    store = ReflectiveChatStore(memory=mem, user_id="ana")
    call = ChatMessage(
        role="assistant",
        content=None,
        additional_kwargs={"tool_calls": [{"id": "c1", "function": {"name": "weather"}}]},
    )
    tool = ChatMessage(role="tool", content="sunny", additional_kwargs={"tool_call_id": "c1"})
    image = ChatMessage(
        role="user", blocks=[TextBlock(text="look"), ImageBlock(url="http://x/img.png")]
    )
    for m in (call, tool, image):
        store.add_message("s", m)
    back = store.get_messages("s")
    assert [m.model_dump() for m in back] == [m.model_dump() for m in (call, tool, image)]
    assert mem.turns("ana", "s")[0].text.startswith("[tool call]")
    store.delete_message("s", 0)
    assert list(mem.store.turn_extra("ana", "s")) == ["s:1", "s:2"]
    with pytest.raises(InvalidInputError):
        store.add_message("s", "not a message")


def test_async_twins(mem):
    store = ReflectiveChatStore(memory=mem, user_id="ana")

    async def run():
        await store.async_add_message("k", U("one"))
        await store.aadd_message("k", A("two"))
        await store.aset_messages("k", [U("one"), A("two"), U("three")])
        got = await store.aget_messages("k")
        last = await store.adelete_last_message("k")
        first = await store.adelete_message("k", 0)
        keys = await store.aget_keys()
        rest = await store.adelete_messages("k")
        return got, last, first, keys, rest

    got, last, first, keys, rest = asyncio.run(run())
    assert [m.content for m in got] == ["one", "two", "three"]
    assert (last.content, first.content, keys, texts(rest)) == (
        "three",
        "one",
        ["k"],
        [("assistant", "two")],
    )


def test_chat_memory_buffer_and_chat_engine(mem):
    store = ReflectiveChatStore(memory=mem, user_id="ana")
    buf = ChatMemoryBuffer.from_defaults(chat_store=store, chat_store_key="conv-1", token_limit=500)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=buf)
    engine.chat("My dog is called Pixel")
    asyncio.run(engine.achat("He loves the beach"))
    roles = [r for r, _ in texts(store.get_messages("conv-1"))]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert [t.role for t in mem.turns("ana", "conv-1")] == roles
    store.end_session("conv-1")
    hit = mem.retrieve("ana", "dog called Pixel").hits[0]
    assert "Pixel" in hit.memory.text
    buf.reset()
    assert buf.get_all() == [] and mem.open_sessions("ana") == []


def test_db_store_with_memory_fifo(mem):
    store = ReflectiveDBChatStore(memory=mem, user_id="ana")
    memory = Memory.from_defaults(
        session_id="conv",
        chat_store=store,
        token_limit=60,
        token_flush_size=20,
        chat_history_token_ratio=0.5,
    )
    for i in range(8):
        memory.put(U(f"user message number {i} about my garden and tomatoes"))
    active = memory.get_all(status=MessageStatus.ACTIVE)
    archived = memory.get_all(status=MessageStatus.ARCHIVED)
    everything = memory.get_all(status=None)
    assert archived and active
    assert [m.content for m in everything] == [m.content for m in archived + active]
    assert len(mem.turns("ana", "conv")) == 8
    memory.reset()
    assert memory.get_all(status=None) == []
    assert mem.open_sessions("ana") == []


def test_db_store_methods(mem):
    store = ReflectiveDBChatStore(memory=mem, user_id="ana")

    async def run():
        await store.add_messages("k", [U("a"), A("b"), U("c"), A("d")])
        assert await store.count_messages("k") == 4
        assert [m.content for m in await store.get_messages("k", limit=2, offset=1)] == ["b", "c"]
        arch = await store.archive_oldest_messages("k", 1)
        assert [m.content for m in arch] == ["a"]
        assert await store.count_messages("k", MessageStatus.ARCHIVED) == 1
        gone = await store.delete_oldest_messages("k", 1)
        assert [m.content for m in gone] == ["b"]
        assert (await store.delete_message("k", 0)).content == "c"
        assert await store.delete_message("k", 5) is None
        await store.add_message("k", U("e"))
        assert [m.content for m in await store.get_messages("k", status=None)] == ["a", "d", "e"]
        await store.set_messages("k", [A("d"), U("f")])
        assert [m.content for m in await store.get_messages("k", status=None)] == ["d", "f"]
        await store.delete_messages("k", MessageStatus.ACTIVE)
        assert await store.count_messages("k", None) == 0
        await store.add_message("j", U("old"), status=MessageStatus.ARCHIVED)
        with pytest.raises(InvalidInputError):
            await store.add_message("j", U("x"), status=MessageStatus.ACTIVE) or (
                await store.add_message("j", U("y"), status=MessageStatus.ARCHIVED)
            )
        await store.delete_messages("j", MessageStatus.ARCHIVED)
        assert [m.content for m in await store.get_messages("j", status=None)] == ["x"]
        return await store.get_keys()

    assert asyncio.run(run()) == ["k", "j"]
    assert ReflectiveDBChatStore.class_name() == "ReflectiveDBChatStore"


def test_timestamp_kwarg_becomes_turn_time(mem):
    store = ReflectiveChatStore(memory=mem, user_id="ana")
    msg = ChatMessage(role="user", content="hi", additional_kwargs={"timestamp": "2025-03-01"})
    store.add_message("s", msg)
    assert mem.turns("ana", "s")[0].timestamp.year == 2025
    assert store.get_messages("s")[0].additional_kwargs == {"timestamp": "2025-03-01"}
    mem.end_session("ana", "s")
    assert mem.memories("ana")[0].text.startswith("[2025-03-01")
