from __future__ import annotations

import asyncio

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory

from llamaindex_reflective import ReflectiveDBChatStore, ReflectiveMemoryBlock
from llamaindex_reflective.chat_store import speaker_role


def _seed(mem):
    mem.add_turn("ana", "old", "user", "My dog is named Pretzel.")
    mem.add_turn("ana", "old", "user", "I work as a nurse in Lisbon.")
    mem.end_session("ana", "old")


def test_db_chat_store_current_message_is_not_a_memory(mem):
    _seed(mem)
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", top_k=2)
    memory = Memory(
        session_id="now",
        sql_store=ReflectiveDBChatStore(memory=mem, user_id="ana"),
        memory_blocks=[block],
        token_limit=3000,
    )
    question = "What is my dog's name?"

    async def run():
        await memory.aput(ChatMessage(role="user", content=question))
        return await memory.aget()

    asyncio.run(run())
    assert [t.text for t in mem.turns("ana", "now")] == [question]  # stored at once
    texts = [h.memory.text for h in block.last_retrieval.hits]
    assert len(texts) == 2 and all(question not in t for t in texts)  # the slot is not wasted
    assert "Pretzel" in texts[0]
    # feedback numbers what was shown
    assert block.feedback("Pretzel. [0]").retrieval_id == block.last_retrieval.retrieval_id


def test_chat_store_strips_marks_and_stores_names(mem):
    store = ReflectiveDBChatStore(memory=mem, user_id="ana")
    asyncio.run(
        store.add_messages(
            "s",
            [
                ChatMessage(
                    role="user", content="Hi, array[0] [1]?", additional_kwargs={"name": "Ana"}
                ),
                ChatMessage(role="assistant", content="September 6, in Gothenburg. [0]"),
                ChatMessage(
                    role="assistant",
                    content="Sure [NO_CITE]",
                    additional_kwargs={"metadata": {"name": "Coach"}},
                ),
            ],
        )
    )
    assert [(t.role, t.text) for t in mem.turns("ana", "s")] == [
        ("Ana", "Hi, array[0] [1]?"),
        ("assistant", "September 6, in Gothenburg."),
        ("Coach", "Sure"),
    ]
    back = asyncio.run(store.get_messages("s"))
    assert [m.content for m in back][1:] == ["September 6, in Gothenburg.", "Sure"]


def test_memory_block_put_strips_marks_and_uses_names(mem):
    block = ReflectiveMemoryBlock(memory=mem, user_id="ana", session_id="b", build_on_put=False)
    block.put(
        [
            ChatMessage(role="user", content="I like tea.", additional_kwargs={"name": "Ana"}),
            ChatMessage(role="assistant", content="Tea it is. [0, 2]"),
        ]
    )
    assert [(t.role, t.text) for t in mem.turns("ana", "b")] == [
        ("Ana", "I like tea."),
        ("assistant", "Tea it is."),
    ]


def test_invalid_name_falls_back_to_role():
    bad = ChatMessage(role="user", content="x", additional_kwargs={"name": "[Ana]"})
    assert speaker_role(bad) == "user"
    assert speaker_role(ChatMessage(role="assistant", content="x")) == "assistant"


def test_a_chatbot_or_model_reply_is_stored_without_citation_marks() -> None:
    from llamaindex_reflective.chat_store import without_marks

    for role in ("assistant", "chatbot", "model"):
        got = without_marks(ChatMessage(role=role, content="Pretzel. [0]"))
        assert got.content == "Pretzel.", role
    said = ChatMessage(role="user", content="Is it [0]?")
    assert without_marks(said) is said  # the user's words are kept as written
