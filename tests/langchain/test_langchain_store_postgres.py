"""LangGraph `ReflectiveStore` unchanged on a PostgreSQL-backed ReflectiveMemory.

The store tests of `test_langchain_store` run again here with the core on PostgreSQL + pgvector
(a fresh schema per test); plus durability across reopen and two processes sharing items.
"""

from __future__ import annotations

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from test_langchain_store import (  # noqa: F401 - collected again with the fixtures below
    test_async_api,
    test_batch_reads_see_the_store_before_its_writes_like_langgraph,
    test_create_agent_tools_use_the_store,
    test_fixed_user_and_user_position,
    test_items_are_memories_of_their_user_only,
    test_overwrite_keeps_created_at_and_index_fields,
    test_query_search_uses_core_retrieval_within_prefix_and_filter,
    test_same_answers_as_langgraph_in_memory_store,
    test_validation_and_ttl,
)

from langchain_reflective import ReflectiveStore


def _core(dsn: str, schema: str) -> ReflectiveMemory:
    from reflective_memory.storage.postgres import PostgresStore

    return ReflectiveMemory(
        store=PostgresStore(dsn, schema=schema, pool_max=4),
        embedder=HashingEmbedder(),
        config=MemoryConfig(units={"granularities": ("turn",)}),
    )


@pytest.fixture
def core(pg_dsn) -> ReflectiveMemory:
    with _core(pg_dsn, pg_schema()) as m:
        yield m


@pytest.fixture
def store(core) -> ReflectiveStore:
    return ReflectiveStore(memory=core)


def test_durable_and_shared_between_processes(pg_dsn) -> None:
    schema = pg_schema()
    with _core(pg_dsn, schema) as one, _core(pg_dsn, schema) as two:
        ReflectiveStore(memory=one).put(("ana", "prefs"), "tea", {"likes": "genmaicha"})
        other = ReflectiveStore(memory=two)
        assert other.get(("ana", "prefs"), "tea").value == {"likes": "genmaicha"}
        assert other.search(("ana",), query="genmaicha")[0].key == "tea"
        other.put(("ana", "prefs"), "tea", {"likes": "sencha"})
        assert ReflectiveStore(memory=one).search(("ana",), query="sencha")[0].value == {
            "likes": "sencha"
        }
    with _core(pg_dsn, schema) as again:
        assert ReflectiveStore(memory=again).get(("ana", "prefs"), "tea").value == {
            "likes": "sencha"
        }
        assert ReflectiveStore(memory=again).search(("bob",), query="sencha") == []
