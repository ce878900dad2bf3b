"""Every surface that takes feedback teaches the same ranker: the memory's turn ranker.

The scripted conversation of the surface contract goes through each surface (drivers in
`tests/surface_drivers.py`, hashing embedder); then a question is asked through it and an
answer citing the first passage is sent back the surface's own way: the core API's
`feedback`, the LangChain middleware and classic chain memory (which send the agent's answer
themselves), the LlamaIndex memory block's `feedback`, and the LangChain compressor and
LlamaIndex postprocessor over another retriever's documents. Each must give the user's turn
ranker one more episode and change the weights the next `retrieve` ranks with.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("langchain_classic")
pytest.importorskip("llama_index.core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from llama_index.core.base.response.schema import Response  # noqa: E402
from llama_index.core.schema import NodeWithScore, TextNode  # noqa: E402
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory  # noqa: E402
from reflective_memory.memory_block import shown_memories  # noqa: E402
from reflective_memory.testing.surfaces import (  # noqa: E402
    BUDGET_TOKENS,
    USER_ID,
    WHERE_DO_I_LIVE,
    CoreDriver,
    run_surface,
)
from surface_drivers import ChatMemoryDriver, LlamaIndexDriver, MiddlewareDriver  # noqa: E402

from langchain_reflective import CitationReranker  # noqa: E402
from llamaindex_reflective import ReflectiveNodePostprocessor  # noqa: E402

ANSWER = "You live there now [0]."
DOCS = ["I moved to Bergen in March.", "The weather is rainy.", "My old flat was in Oslo."]


def _memory() -> ReflectiveMemory:
    cfg = MemoryConfig(rerank={"save_every": 1, "turn_learning_rate": 0.2})
    return ReflectiveMemory(embedder=HashingEmbedder(256), config=cfg)


def _core(driver: CoreDriver) -> None:
    shown, _ = shown_memories(
        driver.memory, USER_ID, WHERE_DO_I_LIVE, k=None, budget_tokens=BUDGET_TOKENS,
        instruction=None, exclude_turns=(), now=None,
    )  # fmt: skip
    assert driver.memory.feedback(shown, ANSWER).learned


def _middleware(driver: MiddlewareDriver) -> None:
    driver._ask(HumanMessage(WHERE_DO_I_LIVE), AIMessage(ANSWER))  # the middleware sends it


def _classic(driver: ChatMemoryDriver) -> None:
    assert driver.chat is not None
    asked = {"input": WHERE_DO_I_LIVE}
    driver.chat.load_memory_variables(asked)
    driver.chat.save_context(asked, {"output": ANSWER})  # the memory sends it


def _llamaindex_block(driver: LlamaIndexDriver) -> None:
    driver.evidence(WHERE_DO_I_LIVE)
    assert driver.chat is not None
    block = driver.chat.memory_blocks[0]
    assert block.feedback(ANSWER).learned


SURFACES: dict[str, tuple[Callable[[ReflectiveMemory], object], Callable[[object], None]]] = {
    "core": (CoreDriver, _core),
    "langchain-middleware": (MiddlewareDriver, _middleware),
    "langchain-classic-memory": (ChatMemoryDriver, _classic),
    "llamaindex-block": (lambda m: LlamaIndexDriver(m, use_async=False), _llamaindex_block),
}


def _ranked(mem: ReflectiveMemory) -> tuple[float, ...]:
    r = mem.retrieve(USER_ID, WHERE_DO_I_LIVE, budget_tokens=BUDGET_TOKENS)
    assert r.rerank is not None
    return r.rerank.prior


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_surfaces_feedback_teaches_the_memorys_turn_ranker(surface: str) -> None:
    mem = _memory()
    make, teach = SURFACES[surface]
    driver = make(mem)
    try:
        run_surface(driver)  # type: ignore[arg-type]
        before = mem.ranker_weights(USER_ID)
        weights = mem.rerank_stage.learning.weights(USER_ID).copy()
        teach(driver)
        after = mem.ranker_weights(USER_ID)
        assert after["user_episodes"] == before["user_episodes"] + 1, surface
        assert after["episodes"] == before["episodes"] + 1
        assert not np.allclose(mem.rerank_stage.learning.weights(USER_ID), weights)
    finally:
        driver.close()  # type: ignore[attr-defined]


def test_texts_from_other_retrievers_teach_the_same_weights_retrieve_ranks_with() -> None:
    mem = _memory()
    with CoreDriver(mem) as driver:
        run_surface(driver)
        before = _ranked(mem)
        comp = CitationReranker(memory=mem, user_id=USER_ID, top_n=3)
        docs = [Document(page_content=t, id=str(i)) for i, t in enumerate(DOCS)]
        shown = comp.compress_documents(docs, WHERE_DO_I_LIVE)
        assert comp.feedback(WHERE_DO_I_LIVE, shown, ANSWER).learned
        pp = ReflectiveNodePostprocessor(memory=mem, user_id=USER_ID, top_n=3)
        nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}")) for i, t in enumerate(DOCS)]
        got = pp.postprocess_nodes(nodes, query_str=WHERE_DO_I_LIVE)
        assert pp.feedback(Response(response="Source 1 says so.", source_nodes=got)).learned
        assert mem.ranker_weights(USER_ID)["user_episodes"] == 2
        assert _ranked(mem) != before  # the turns of the next retrieve are weighed anew
