"""Issue 31's behaviours (no timings): batches embed once, sessions end without embedding again,
the NumPy MiniLM gives the model's vectors, and a new turn re-tokenizes one key (the CLI's
imports are checked in `test_cli_first_hour.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.minilm import NumpyMiniLM


class CountingEmbedder(HashingEmbedder):
    """A hashing embedder that records the texts of every `encode` call."""

    def __init__(self) -> None:
        super().__init__(64)
        self.calls: list[list[str]] = []

    def encode(self, texts: str | list[str]) -> np.ndarray:
        self.calls.append([texts] if isinstance(texts, str) else list(texts))
        return super().encode(texts)


def _turns(user: str, session: str, n: int) -> list[dict[str, str]]:
    topics = ["my dog Pixel", "the move to Berlin", "a pottery class", "my sister's wedding"]
    return [
        {
            "user_id": user,
            "session_id": session,
            "role": "user" if i % 2 == 0 else "assistant",
            "text": f"Turn {i} about {topics[(i // 6) % len(topics)]}, said in session {session}.",
        }
        for i in range(n)
    ]


def test_add_turns_embeds_a_batch_in_one_call_and_end_session_embeds_nothing() -> None:
    emb = CountingEmbedder()
    with ReflectiveMemory(None, embedder=emb) as mem:
        mem.add_turns(_turns("ana", "s1", 40))
        assert len(emb.calls) == 1 and len(emb.calls[0]) == 40
        mems = mem.end_session("ana", "s1")
        assert {m.granularity for m in mems} == {"turn", "segment"}
        assert len(emb.calls) == 1  # the segmenter and the segment keys reuse the turn vectors


def test_per_message_add_turn_embeds_one_text_and_end_session_none() -> None:
    emb = CountingEmbedder()
    with ReflectiveMemory(None, embedder=emb) as mem:
        for t in _turns("ana", "s1", 12):
            mem.add_turn(t["user_id"], t["session_id"], t["role"], t["text"])
        assert [len(c) for c in emb.calls] == [1] * 12
        mem.end_session("ana", "s1")
        assert len(emb.calls) == 12


def test_llamaindex_chat_store_batch_embeds_once() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import ChatMessage

    from llamaindex_reflective import ReflectiveChatStore

    emb = CountingEmbedder()
    with ReflectiveMemory(None, embedder=emb) as mem:
        store = ReflectiveChatStore(memory=mem, user_id="ana")
        msgs = [ChatMessage(role="user", content=t["text"]) for t in _turns("ana", "k", 10)]
        store.set_messages("k", msgs)
        assert [len(c) for c in emb.calls] == [10]


def test_numpy_minilm_gives_the_sentence_transformers_vectors() -> None:
    from reflective_memory.embed import SentenceTransformerEmbedder

    texts = ["What does Emi like to cook?", "x", "Ich bin nach Berlin gezogen. " * 60, ""]
    ours = NumpyMiniLM()
    ref = SentenceTransformerEmbedder(cache_size=0).encode(texts)
    got = ours.encode(texts)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.all(np.sum(got * ref, axis=1) > 0.9999)
    assert ours.name == SentenceTransformerEmbedder().name and ours.dim == 384
    assert np.allclose(ours.encode(texts[0]), got[0], atol=1e-6)


def test_after_a_new_turn_bm25_tokenizes_only_the_new_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import reflective_memory.storage.bm25 as bm25_mod

    seen: list[str] = []
    real = bm25_mod.lexical_tokens

    def counting(text: str) -> list[str]:
        seen.append(text)
        return real(text)

    monkeypatch.setattr(bm25_mod, "lexical_tokens", counting)
    with ReflectiveMemory(None, embedder=HashingEmbedder(64)) as mem:
        mem.add_turns(_turns("ana", "s1", 30))
        mem.end_session("ana", "s1")
        mem.retrieve("ana", "pottery class", k=3)
        assert len(seen) >= 30
        seen.clear()
        mem.add_turn("ana", "s2", "user", "I adopted a kitten called Miso yesterday.")
        hits = mem.retrieve("ana", "kitten Miso", k=3).hits
        keys = [t for t in seen if t != "kitten Miso"]  # the query is tokenized too
        assert keys == ["user: I adopted a kitten called Miso yesterday."]
        assert "Miso" in hits[0].memory.text


def test_a_new_turn_is_appended_to_the_trained_index_not_retrained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import reflective_memory.storage.index as index_mod
    from reflective_memory.config import MemoryConfig

    builds: list[int] = []
    real = index_mod.build_dense_index

    def counting(vectors: np.ndarray, ann: object = None) -> object:
        builds.append(len(vectors))
        return real(vectors, ann)  # type: ignore[arg-type]

    monkeypatch.setattr(index_mod, "build_dense_index", counting)
    cfg = MemoryConfig(index={"ann_threshold": 20, "ann_kind": "ivf"})
    with ReflectiveMemory(None, embedder=HashingEmbedder(64), config=cfg) as mem:
        mem.add_turns(_turns("ana", "s1", 60))
        mem.end_session("ana", "s1")
        before = mem.indexes.get("ana")
        assert before.dense.kind == "ivf" and len(builds) == 1
        mem.add_turn("ana", "s2", "user", "I adopted a kitten called Miso yesterday.")
        after = mem.indexes.get("ana")
        assert len(builds) == 1  # appended to a copy of the trained index
        assert after.dense.kind == "ivf" and after.dense.ntotal == before.dense.ntotal + 1
        assert before.dense.ntotal == len(before.ids)  # the previous version is untouched
        assert "Miso" in mem.retrieve("ana", "kitten Miso", k=3).hits[0].memory.text
        mem.delete_session("ana", "s2")
        mem.indexes.get("ana")
        assert len(builds) == 2  # a deletion rebuilds
