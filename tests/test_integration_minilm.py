"""A few end-to-end checks with the real offline MiniLM embedder."""

from __future__ import annotations

import numpy as np
import pytest
from reflective_memory import (
    MemoryConfig,
    ReflectiveMemory,
    SentenceTransformerEmbedder,
    default_embedder,
)

pytestmark = pytest.mark.integration


def test_default_embedder_is_offline_minilm() -> None:
    e = default_embedder()
    v = e.encode(["I live in Berlin.", "My home is in Berlin.", "I love pancakes."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    assert e.encode("single").shape == (384,)
    assert e.warm_up() is SentenceTransformerEmbedder().warm_up()  # loaded once per process


def test_semantic_retrieval_without_shared_words() -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(config=cfg) as mem:
        for i, text in enumerate(
            [
                "I adopted a beagle puppy from the shelter last weekend.",
                "The quarterly report is due on Friday.",
                "We are repainting the kitchen in a pale green.",
            ]
        ):
            mem.add_turn("u", "s", "user", text, turn_id=f"t{i}")
        mem.end_session("u", "s")
        r = mem.retrieve("u", "What kind of pet do I have?", k=1, mode="dense")
        assert r.hits[0].memory.turn_ids == ("t0",)


def test_small_inputs_use_query_threads_and_restore_the_setting() -> None:
    import torch

    e = SentenceTransformerEmbedder(query_threads=1)
    before = torch.get_num_threads()
    seen: list[int] = []
    st = e.warm_up()
    original = st.encode

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    st.encode = spy
    try:
        e.encode("one query")
        e.encode([f"batch text {i}" for i in range(20)])  # distinct: duplicates are embedded once
    finally:
        del st.encode
    assert seen == [1, before]
    assert torch.get_num_threads() == before


def _demo(mem: ReflectiveMemory) -> ReflectiveMemory:
    """`mem` with the bundled demo conversation (user `maya`) ingested, sessions ended."""
    import json
    from pathlib import Path

    import reflective_memory

    demo = Path(reflective_memory.__file__).parent / "data" / "demo_conversation.json"
    for s in json.loads(demo.read_text())["sessions"]:
        mem.add_turns([{**t, "user_id": "maya", "session_id": s["session_id"]} for t in s["turns"]])
        mem.end_session("maya", s["session_id"])
    return mem


def test_demo_where_do_i_live_now_ranks_berlin_above_lisbon() -> None:
    """Time-aware ranking on the bundled demo: the newest home wins a present-tense question."""
    with _demo(ReflectiveMemory()) as mem:
        r = mem.retrieve("maya", "Where do I live now?", budget_tokens=600)
        assert r.diagnostics["passages"]["present_tense"] is True
        sessions = [h.memory.session_id for h in r.hits]
        evidence = {"s3-t3", "s4-t1", "s5-t7", "s6-t13"}
        first_berlin = next(i for i, h in enumerate(r.hits) if evidence & set(h.memory.turn_ids))
        assert "2025-01-12-lisbon" not in sessions[: first_berlin + 1]
        assert r.hits[0].memory.session_id != "2025-01-12-lisbon"
        # a question about the past is not pushed to the newest sessions
        past = mem.retrieve("maya", "Where was I living in January?", budget_tokens=600)
        assert past.diagnostics["passages"]["present_tense"] is False


def test_demo_when_is_my_sisters_wedding_puts_the_dated_turn_first() -> None:
    """The turn that gives the (moved) date answers "when", at k=5 and within 300 tokens."""
    with _demo(ReflectiveMemory()) as mem:
        top = mem.retrieve("maya", "When is my sister's wedding?", k=5)
        assert "September 6" in top.hits[0].memory.text
        block = mem.retrieve("maya", "When is my sister's wedding?", budget_tokens=300)
        assert "September 6" in block.hits[0].memory.text
        assert block.diagnostics["passages"]["tokens_used"] <= 300
        move = mem.retrieve("maya", "Where do I live now?", k=5)
        assert "Berlin" in move.hits[0].memory.text and "moved" in move.hits[0].memory.text
