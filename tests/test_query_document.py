"""Queries and documents are embedded apart (issue 41).

`QueryDocEmbedder` gives a question the vector of the words its answer uses only when it is
embedded as a query, so each test below fails when a path embeds the wrong side: the question
then finds the distractor that shares its words.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from fakes import QueryDocEmbedder
from pg_cluster import pg_schema
from reflective_memory import (
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    QueryEmbedder,
    ReflectiveMemory,
    SentenceTransformerEmbedder,
    encode_query,
)
from reflective_memory.embed import CachedEmbedder, aencode_query

CHAT = [
    ("user", "Mia: I adopted a beagle called Pixel last week."),
    ("assistant", "Pixel is a lovely name for a beagle."),
    ("user", "Mia: He already chewed my red sneakers."),
    ("assistant", "Beagles chew when they are bored; try a puzzle toy."),
    ("user", "Mia: I read an article about canine footwear trends."),
    ("assistant", "Fashion for dogs is a big market."),
]
QUESTION = "which canine ate my footwear?"


def _cfg() -> MemoryConfig:
    return MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})


def _fill(mem: ReflectiveMemory) -> None:
    for i, (role, text) in enumerate(CHAT):
        mem.add_turn("mia", "s1", role, text, timestamp=f"2026-03-01T10:0{i}:00")
    mem.end_session("mia", "s1")


def test_writing_embeds_documents_and_retrieval_embeds_the_question_as_a_query() -> None:
    emb = QueryDocEmbedder()
    with ReflectiveMemory(embedder=emb, config=_cfg()) as mem:
        _fill(mem)
        assert emb.calls and set(emb.kinds()) == {"document"}
        emb.calls.clear()
        hits = mem.retrieve("mia", QUESTION, k=1, mode="dense").hits
        assert emb.calls == [("query", QUESTION)]
        assert "sneakers" in hits[0].memory.text  # embedded as a document: the distractor


def test_reranking_texts_and_attribution_embed_the_query_side() -> None:
    emb = QueryDocEmbedder()
    with ReflectiveMemory(embedder=emb, config=_cfg()) as mem:
        texts = ["I read about canine footwear trends.", "Pixel the beagle chewed my sneakers."]
        emb.calls.clear()
        ranked = mem.rerank_texts("mia", QUESTION, texts, keep_order=False)
        assert ("query", QUESTION) in emb.calls
        assert ("document", texts) in emb.calls
        assert "query" not in [k for k, t in emb.calls if t == texts]
        assert ranked is not None


def test_attribution_embeds_answer_sentences_as_queries() -> None:
    from reflective_memory.rmm.citations import attribute

    emb = QueryDocEmbedder()
    vecs = emb.encode(["Pixel the beagle chewed the sneakers.", "Canine footwear is in fashion."])
    emb.calls.clear()
    used, best = attribute("It was the canine.", vecs, emb, threshold=0.0)
    assert emb.kinds() == ["query"]
    assert best[0] > best[1]


def test_an_embedder_without_encode_query_embeds_both_alike() -> None:
    class Plain:
        name = "plain:32"
        dim = 32

        def __init__(self) -> None:
            self.inner = HashingEmbedder(32)
            self.seen: list[object] = []

        def encode(self, texts):
            self.seen.append(texts)
            return self.inner.encode(texts)

    plain = Plain()
    assert not isinstance(plain, QueryEmbedder)
    assert np.allclose(encode_query(plain, "a dog"), plain.inner.encode("a dog"))
    both = asyncio.run(aencode_query(plain, ["a", "b"]))
    assert np.allclose(both, plain.inner.encode(["a", "b"]))
    with ReflectiveMemory(embedder=plain, config=_cfg()) as mem:
        _fill(mem)
        plain.seen.clear()
        assert mem.retrieve("mia", "what did Pixel chew", k=1, mode="dense").hits
        assert plain.seen == ["what did Pixel chew"]


def test_cached_embedder_keeps_the_inner_query_side(tmp_path) -> None:
    emb = QueryDocEmbedder()
    cached = CachedEmbedder(emb, tmp_path / "cache.sqlite")
    assert isinstance(cached, QueryEmbedder)
    assert np.allclose(encode_query(cached, QUESTION), emb.encode_query(QUESTION))
    assert not np.allclose(encode_query(cached, QUESTION), emb.encode(QUESTION))


def test_sentence_transformer_prompts_and_a_name_per_document_side() -> None:
    plain = SentenceTransformerEmbedder()
    assert plain.name == "st:all-MiniLM-L6-v2"  # unchanged: stores written before stay valid
    e5ish = SentenceTransformerEmbedder(query_prompt="query: ", document_prompt="passage: ")
    assert e5ish.name == "st:all-MiniLM-L6-v2|document_prompt='passage: '"
    assert SentenceTransformerEmbedder(query_prompt="query: ").name == plain.name
    with pytest.raises(InvalidInputError, match="query_prompt"):
        SentenceTransformerEmbedder(query_prompt=3)  # type: ignore[arg-type]
    text = "Where does my sister live?"
    assert np.allclose(plain.encode_query(text), plain.encode(text), atol=1e-6)
    assert np.allclose(e5ish.encode_query(text), plain.encode("query: " + text), atol=1e-5)
    assert np.allclose(e5ish.encode([text])[0], plain.encode("passage: " + text), atol=1e-5)
    assert not np.allclose(e5ish.encode_query(text), e5ish.encode(text), atol=1e-3)


def test_a_store_opened_with_another_model_says_it_re_embeds(tmp_path, caplog) -> None:
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(64), config=_cfg()) as mem:
        _fill(mem)
    caplog.set_level(logging.WARNING, logger="reflective_memory")
    with ReflectiveMemory(tmp_path, embedder=QueryDocEmbedder(64), config=_cfg()) as mem:
        hits = mem.retrieve("mia", QUESTION, k=1, mode="dense").hits
        assert "sneakers" in hits[0].memory.text
    (said,) = [r.getMessage() for r in caplog.records if "another embedding model" in r.message]
    assert "'hashing:64'" in said and "'querydoc:64'" in said and "re-embedding" in said


def test_a_postgres_store_opened_with_another_model_says_it_re_embeds(pg_dsn, caplog) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    schema = pg_schema()
    with ReflectiveMemory(
        store=PostgresStore(pg_dsn, schema=schema), embedder=HashingEmbedder(64), config=_cfg()
    ) as mem:
        _fill(mem)
    caplog.set_level(logging.WARNING, logger="reflective_memory")
    with ReflectiveMemory(
        store=PostgresStore(pg_dsn, schema=schema), embedder=QueryDocEmbedder(64), config=_cfg()
    ) as mem:
        hits = mem.retrieve("mia", QUESTION, k=1, mode="dense").hits
        assert "sneakers" in hits[0].memory.text
    (said,) = [r.getMessage() for r in caplog.records if "another embedding model" in r.message]
    assert "'hashing:64'" in said and "'querydoc:64'" in said
