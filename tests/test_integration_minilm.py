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
    cfg = MemoryConfig(granularities=("turn",))
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
        e.encode(["a batch text"] * 20)
    finally:
        del st.encode
    assert seen == [1, before]
    assert torch.get_num_threads() == before
