from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests import RetrieversIntegrationTests
from lc_helpers import new_memory, populate
from reflective_memory import InvalidInputError

from langchain_reflective import ReflectiveRetriever

_SHARED: dict[str, Any] = {}


def _shared_memory():
    if "mem" not in _SHARED:
        _SHARED["mem"] = populate(new_memory())
    return _SHARED["mem"]


class TestReflectiveRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[ReflectiveRetriever]:
        return ReflectiveRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": _shared_memory(), "user_id": "ana"}

    @property
    def retriever_query_example(self) -> str:
        return "What is the name of my cat?"


def test_documents_carry_memory_metadata(mem):
    docs = ReflectiveRetriever(memory=mem, user_id="ana").invoke("cat named Miso", k=2)
    assert len(docs) == 2
    top = docs[0]
    assert "Miso" in top.page_content
    md = top.metadata
    assert top.id == md["memory_id"]
    stored = {m.id: m for m in mem.memories("ana")}[md["memory_id"]]
    assert md["session_id"] == stored.session_id == "s1"
    assert md["turn_ids"] == list(stored.turn_ids)
    assert md["granularity"] == "turn"
    assert md["retrieval_path"] in ("familiarity", "recollection")
    assert md["rank"] == 0 and docs[1].metadata["rank"] == 1
    assert md["score"] >= docs[1].metadata["score"]
    for key in ("created_at", "updated_at", "start_time", "end_time"):
        datetime.fromisoformat(md[key])  # ISO strings
    assert md["retrieval_id"]


def test_k_per_call_overrides_field_and_budget(mem):
    r = ReflectiveRetriever(memory=mem, user_id="ana", k=2)
    assert len(r.invoke("marathon")) == 2
    assert len(r.invoke("marathon", k=5)) == 5
    small = ReflectiveRetriever(memory=mem, user_id="ana", k=None, budget_tokens=40)
    docs = small.invoke("marathon training")
    assert 1 <= len(docs) < 5


def test_users_are_isolated(mem):
    docs = ReflectiveRetriever(memory=mem, user_id="bob").invoke("cat", k=5)
    assert [d.metadata["user_id"] for d in docs] == ["bob"]
    assert ReflectiveRetriever(memory=mem, user_id="nobody").invoke("cat") == []


def test_mode_option_and_bad_input(mem):
    docs = ReflectiveRetriever(memory=mem, user_id="ana", mode="lexical").invoke("radiator")
    assert docs[0].metadata["retrieval_path"] == "lexical"
    assert "radiator" in docs[0].page_content
    with pytest.raises(InvalidInputError):
        ReflectiveRetriever(memory=mem, user_id="ana").invoke("   ")
    with pytest.raises(InvalidInputError):
        ReflectiveRetriever(memory=mem, user_id="ana").invoke("cat", k=0)


def test_fields_are_described_and_extra_forbidden(mem):
    for name in ("memory", "user_id", "k", "budget_tokens", "mode"):
        assert ReflectiveRetriever.model_fields[name].description, name
    with pytest.raises(ValueError):
        ReflectiveRetriever(memory=mem, user_id="ana", top_k=3)


async def test_async_twin_matches_sync(mem):
    r = ReflectiveRetriever(memory=mem, user_id="ana")
    sync = r.invoke("half marathon", k=3)
    docs = await r.ainvoke("half marathon", k=3)
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [d.id for d in sync]
