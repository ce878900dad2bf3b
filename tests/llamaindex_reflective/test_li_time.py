"""Time on the LlamaIndex surfaces (issue 49): `now=` on the memory block (a field, per call
through `Memory.get(now=...)`, and the newest message's own time) and on the postprocessor
(nodes said in the period a query names come first). The surface contract
(`tests/test_surface_contract.py`) drives the block's message times inside `Memory`."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from reflective_memory import InvalidInputError, ReflectiveMemory
from reflective_memory.testing.surfaces import COOKING
from time_cases import ASKED, CURRY, QUESTION, SOUP, first_cooked

from llamaindex_reflective import ReflectiveMemoryBlock, ReflectiveNodePostprocessor


def _ask(when: str | None = None) -> list[ChatMessage]:
    extra = {} if when is None else {"timestamp": when}
    return [ChatMessage(role="user", content=QUESTION, additional_kwargs=extra)]


def test_block_now_field_per_call_and_the_messages_own_time(cooked: ReflectiveMemory) -> None:
    block = ReflectiveMemoryBlock(memory=cooked, user_id="ana", session_id="q", top_k=2)
    assert first_cooked(block.get(_ask())) == SOUP  # the user's newest turn
    assert first_cooked(block.get(_ask(ASKED))) == CURRY  # the message's own time
    assert first_cooked(block.get(_ask(), now=ASKED)) == CURRY  # per call
    fixed = ReflectiveMemoryBlock(memory=cooked, user_id="ana", session_id="q", top_k=2, now=ASKED)
    assert fixed.now == datetime(2025, 4, 20, 12, tzinfo=timezone.utc)
    assert first_cooked(fixed.get(_ask())) == CURRY
    assert first_cooked(fixed.get(_ask("2025-05-04T20:00:00"))) == SOUP  # the message's time wins
    assert first_cooked(fixed.get(_ask("2025-05-04T20:00:00"), now=ASKED)) == CURRY  # per call wins
    with pytest.raises(InvalidInputError, match="no known format"):
        ReflectiveMemoryBlock(memory=cooked, user_id="ana", now="the other day")


def test_memory_get_passes_now_to_the_block(cooked: ReflectiveMemory, sql_memory) -> None:
    block = ReflectiveMemoryBlock(memory=cooked, user_id="ana", top_k=2, priority=0)
    chat = sql_memory(session_id="q", memory_blocks=[block])
    chat.put(ChatMessage(role="user", content=QUESTION))
    system = asyncio.run(chat.aget(now=ASKED))[0]
    assert first_cooked(str(system.content)) == CURRY


def _nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata={"timestamp": w.isoformat()}))
        for i, (w, t, _) in enumerate(COOKING)
    ] + [
        NodeWithScore(node=TextNode(text="I cooked noodles.", id_="x", metadata={"timestamp": "?"}))
    ]


def test_postprocessor_puts_nodes_said_in_the_asked_period_first(cooked: ReflectiveMemory) -> None:
    pp = ReflectiveNodePostprocessor(memory=cooked, user_id="ana", top_n=5)
    ranked = pp.postprocess_nodes(_nodes(), QueryBundle(QUESTION))
    assert ranked[0].node.get_content() == SOUP  # default: the newest node time (4 May)
    assert {n.node.node_id for n in ranked} == {"n0", "n1", "n2", "n3", "x"}
    at = ReflectiveNodePostprocessor(memory=cooked, user_id="ana", top_n=2, now=ASKED)
    ranked = at.postprocess_nodes(_nodes(), QueryBundle(QUESTION))
    assert ranked[0].node.get_content() == CURRY
    assert at.rankings[-1].ranked.order[0] == 1  # feedback numbers what was shown
    untimed = [
        NodeWithScore(node=TextNode(text=n.node.get_content(), id_=n.node.node_id))
        for n in _nodes()
    ]
    plain = QueryBundle("What did I cook?")  # names no period: the reranker's order
    timed, bare = pp.postprocess_nodes(_nodes(), plain), pp.postprocess_nodes(untimed, plain)
    assert [n.node.node_id for n in timed] == [n.node.node_id for n in bare]
    with pytest.raises(InvalidInputError):
        ReflectiveNodePostprocessor(memory=cooked, user_id="ana", now=[2025])


def test_rerank_texts_times_are_checked(cooked: ReflectiveMemory) -> None:
    texts = [t for _, t, _ in COOKING]
    got = cooked.rerank_texts("ana", QUESTION, texts, times=[w for w, _, _ in COOKING], now=ASKED)
    assert got.order[0] == 1
    with pytest.raises(InvalidInputError, match="one time"):
        cooked.rerank_texts("ana", QUESTION, texts, times=[None])
    with pytest.raises(InvalidInputError, match="no known format"):
        cooked.rerank_texts("ana", QUESTION, texts, times=["soon", None, None, None])
