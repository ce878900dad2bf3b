"""The LlamaIndex chat stores unchanged on a PostgreSQL-backed ReflectiveMemory.

The chat store tests of `test_li_chat_store` run again here with the core on PostgreSQL +
pgvector (a fresh schema per test); plus isolation and durability across reopen.
"""

from __future__ import annotations

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from test_li_chat_store import (  # noqa: F401 - collected again with the fixture below
    U,
    test_async_twins,
    test_chat_memory_buffer_and_chat_engine,
    test_db_store_methods,
    test_db_store_with_memory_fifo,
    test_rich_messages_round_trip,
    test_seven_methods,
    test_timestamp_kwarg_becomes_turn_time,
    texts,
)

from llamaindex_reflective import ReflectiveChatStore


def _mem(dsn: str, schema: str) -> ReflectiveMemory:
    from reflective_memory.storage.postgres import PostgresStore

    cfg = MemoryConfig(units={"granularities": ("turn",)}, search={"mode": "dense"})
    return ReflectiveMemory(
        store=PostgresStore(dsn, schema=schema, pool_max=4),
        embedder=HashingEmbedder(128),
        config=cfg,
    )


@pytest.fixture
def mem(pg_dsn):
    with _mem(pg_dsn, pg_schema()) as m:
        yield m


def test_users_are_isolated_and_durable_on_postgres(pg_dsn):
    schema = pg_schema()
    with _mem(pg_dsn, schema) as mem:
        a = ReflectiveChatStore(memory=mem, user_id="ana")
        b = ReflectiveChatStore(memory=mem, user_id="bob")
        a.add_message("chat", U("ana secret"))
        b.add_message("chat", U("bob secret"))
        assert texts(a.get_messages("chat")) == [("user", "ana secret")]
        assert texts(b.get_messages("chat")) == [("user", "bob secret")]
    with _mem(pg_dsn, schema) as mem2:
        again = ReflectiveChatStore(memory=mem2, user_id="ana")
        assert texts(again.get_messages("chat")) == [("user", "ana secret")]
        assert again.forget("chat") == 1 and again.get_keys() == [] and again.forget("chat") == 0
        bob = ReflectiveChatStore(memory=mem2, user_id="bob")
        assert texts(bob.get_messages("chat")) == [("user", "bob secret")]
