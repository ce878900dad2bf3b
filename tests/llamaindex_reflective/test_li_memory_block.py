import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory.memory_blocks import StaticMemoryBlock
from llama_index.core.storage.chat_store.base_db import MessageStatus
from reflective_memory import (
    FeedbackResult,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
)
from reflective_memory.llm import count_tokens

from llamaindex_reflective import ReflectiveMemoryBlock
from llamaindex_reflective.memory_block import CITATION_INSTRUCTION, format_hits


def U(t):
    return ChatMessage(role="user", content=t)


def A(t):
    return ChatMessage(role="assistant", content=t)


def _seed(mem):
    mem.add_turn("ana", "old", "user", "My dog Pixel loves the beach.")
    mem.add_turn("ana", "old", "user", "I work as a nurse in Lisbon.")
    mem.add_turn("ana", "old", "user", "My favourite food is ramen.")
    mem.end_session("ana", "old")
    mem.add_turn("bob", "old", "user", "My dog Rex hates the beach.")
    mem.end_session("bob", "old")


def test_get_formats_for_citation_and_isolates_users(mem):
    _seed(mem)
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=2)
    text = asyncio.run(block.aget([A("hi"), U("where does my dog like to go?")]))
    assert text.startswith(CITATION_INSTRUCTION)
    assert "[0] " in text and "Pixel" in text.split("[1]")[0]
    assert "Rex" not in text
    assert block.last_retrieval.user_id == "ana" and len(block.last_retrieval.hits) == 2
    assert asyncio.run(block.aget([])) == "" and block.last_retrieval is None
    assert asyncio.run(block.aget([ChatMessage(role="system", content="be nice")])) == ""


def test_budget_tokens_respected(mem):
    _seed(mem)
    # the budget holds the whole block: the instruction, the numbering and the memories
    room = count_tokens(CITATION_INSTRUCTION) + 40
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=None, budget_tokens=room)
    text = asyncio.run(block.aget([U("dog beach nurse ramen")]))
    assert 1 <= len(block.last_retrieval.hits) < 3
    assert count_tokens(text) <= room
    assert text == format_hits(block.last_retrieval.hits)  # the hits kept are the ones shown
    tiny = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=None, budget_tokens=12)
    assert asyncio.run(tiny.aget([U("dog beach nurse ramen")])) == ""  # not even the instruction
    default = ReflectiveMemoryBlock(memory=mem, user_id="ana")  # the core's default budget
    asyncio.run(default.aget([U("dog beach nurse ramen")]))
    got = default.last_retrieval
    assert got.diagnostics["budget_tokens"] == mem.config.search.default_budget_tokens == 500
    assert all(h.memory.granularity == "passage" for h in got.hits)
    with pytest.raises(InvalidInputError):
        ReflectiveMemoryBlock(memory=mem, user_id="")


def test_put_ingests_and_builds(mem):
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", session_id="s9")
    asyncio.run(block.aput([ChatMessage(role="system", content="sys"), U("I play the cello.")]))
    assert [t.text for t in mem.turns("ana", "s9")] == ["I play the cello."]
    assert "cello" in asyncio.run(block.aget([U("what instrument do I play")]))
    no_session = ReflectiveMemoryBlock(memory=mem, user_id="ana")
    with pytest.raises(InvalidInputError):
        asyncio.run(no_session.aput([U("x")]))
    # Memory passes its session id with flushed messages
    asyncio.run(no_session.aput([U("from memory")], session_id="conv-7"))
    assert [t.text for t in mem.turns("ana", "conv-7")] == ["from memory"]


def test_truncation_drops_lowest_ranked(mem):
    _seed(mem)
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=3)
    text = asyncio.run(block.aget([U("dog beach nurse ramen")]))
    cut = asyncio.run(block.atruncate(text, 3))
    assert cut.startswith(CITATION_INSTRUCTION) and "[2]" not in cut and "[1]" in cut
    assert asyncio.run(block.atruncate(text, 10_000)) is None
    assert asyncio.run(block.atruncate(text, 0)) == text
    assert format_hits([]) == ""


def test_inside_memory_flush_and_recall(mem, sql_memory):
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=3, priority=1)
    memory = sql_memory(  # 40 tokens of chat, 120 for the block (instruction, dates)
        session_id="conv",
        token_limit=160,
        token_flush_size=30,
        chat_history_token_ratio=0.25,
        memory_blocks=[block],
    )
    memory.put(U("My sister Marta lives in Porto and teaches chemistry."))
    memory.put(A("Nice, Porto is lovely."))
    for i in range(6):
        memory.put(U(f"filler message {i} about nothing much at all really"))
    stored = [t.text for t in mem.turns("ana", "conv")]
    assert stored and stored[0].startswith("My sister Marta")
    archived = memory.get_all(status=MessageStatus.ARCHIVED)  # the default SQL chat store's
    assert len(stored) == len(archived) == len(set(stored))  # what was flushed, stored once
    msgs = asyncio.run(memory.aget(input="Where does my sister live?"))
    system = msgs[0]
    assert system.role.value == "system" and "Marta" in system.content and "[0]" in system.content


def test_priority_truncation_in_memory(mem, sql_memory):
    _seed(mem)
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=3, priority=1)
    static = StaticMemoryBlock(name="core", static_content="STATIC INFO", priority=0)
    memory = sql_memory(
        session_id="c", token_limit=60, chat_history_token_ratio=0.3, memory_blocks=[static, block]
    )
    msgs = memory.get(input="dog beach nurse ramen " * 3)
    system = msgs[0].content
    assert "STATIC INFO" in system  # priority 0 is never truncated
    assert "[2]" not in system  # the reflective block was cut


def test_feedback_delegates(mem):
    _seed(mem)
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana")
    nothing = block.feedback("[0]")  # nothing retrieved yet
    assert isinstance(nothing, FeedbackResult) and not nothing.learned and nothing.reason
    asyncio.run(block.aget([U("dog")]))
    calls = []
    object.__setattr__(mem, "feedback", lambda r, a: calls.append((r, a)) or "learned")
    assert block.feedback("Pixel [0]") == "learned"
    assert calls[0][0] is block.last_retrieval and calls[0][1] == "Pixel [0]"


def test_a_reply_echoing_the_blocks_instructions_teaches_nothing():
    """What the block's feedback teaches is the feedback contract's
    (`tests/test_surface_feedback.py`); a model repeating its prompt, full of citation
    markers, teaches nothing."""
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        _seed(mem)
        block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=3)  # three turns
        echoed = block.feedback("System: " + block.get([U("dog")]) + "\nAssistant: ok")
        assert not echoed.learned and "echoes" in echoed.reason
        assert mem.ranker_weights("ana")["user_episodes"] == 0
