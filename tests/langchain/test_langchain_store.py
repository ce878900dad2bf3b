from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.config import get_store
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from lc_helpers import new_memory, recording_model
from reflective_memory import ConfigError, HashingEmbedder, InvalidInputError, ReflectiveMemory

from langchain_reflective import (
    ReflectiveMemoryMiddleware,
    ReflectiveRetriever,
    ReflectiveStore,
    StoreNamespaceError,
)


@pytest.fixture
def core() -> ReflectiveMemory:
    with new_memory() as m:
        yield m


@pytest.fixture
def store(core) -> ReflectiveStore:
    return ReflectiveStore(memory=core)


class ReferenceStore(InMemoryStore):
    """LangGraph's `InMemoryStore`, listing only namespaces that still hold items.

    `InMemoryStore` keeps a namespace listed after its last item is deleted (or once a get
    touched it); `ReflectiveStore`, like LangGraph's database stores, lists the namespaces of
    existing items.
    """

    def _handle_list_namespaces(self, op):
        for ns in [ns for ns, items in self._data.items() if not items]:
            del self._data[ns]
        return super()._handle_list_namespaces(op)


def _norm(result):
    """Results of both stores in a comparable form (timestamps and scores left out)."""
    if result is None:
        return None
    if isinstance(result, list):
        if result and isinstance(result[0], tuple):
            return result
        return sorted((tuple(i.namespace), i.key, repr(i.value)) for i in result)
    return (tuple(result.namespace), result.key, repr(result.value))


FOOD = [
    (("ana", "prefs"), "food", {"likes": "spicy ramen and dumplings", "stars": 5}),
    (("ana", "prefs"), "drink", {"likes": "green tea, especially genmaicha", "stars": 4}),
    (("ana", "trips"), "2024", {"city": "Kyoto", "stars": 5, "who": {"with": "Lea"}}),
    (("ana", "trips", "planned"), "2025", {"city": "Lisbon", "stars": 3, "tags": ["sea"]}),
    (("bob", "prefs"), "food", {"likes": "spicy tacos", "stars": 2}),
]


def _fill(s) -> None:
    for ns, key, value in FOOD:
        s.put(ns, key, value)


def test_same_answers_as_langgraph_in_memory_store(store):
    ref = ReferenceStore()
    _fill(ref)
    _fill(store)
    ops = [
        GetOp(("ana", "prefs"), "food"),
        GetOp(("ana", "prefs"), "nope"),
        GetOp(("bob", "prefs"), "drink"),
        SearchOp(("ana",), limit=100),
        SearchOp(("ana", "prefs"), limit=100),
        SearchOp(("ana",), filter={"stars": 5}, limit=100),
        SearchOp(("ana",), filter={"stars": {"$gte": 4, "$ne": 5}}, limit=100),
        SearchOp(("ana",), filter={"who": {"with": "Lea"}}, limit=100),
        SearchOp(("ana",), filter={"tags": ["sea"]}, limit=100),
        SearchOp(("ana",), filter={"stars": {"$lt": 4}}, limit=100),
        SearchOp(("ana", "trips"), limit=100),
        SearchOp(("ana", "trip"), limit=100),
        SearchOp(("carol",), limit=100),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("ana",)),)),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("ana",)),), max_depth=2),
        ListNamespacesOp(
            match_conditions=(
                MatchCondition("prefix", ("ana",)),
                MatchCondition("suffix", ("planned",)),
            )
        ),
        ListNamespacesOp(
            match_conditions=(MatchCondition("prefix", ("ana", "*")),), limit=1, offset=1
        ),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("bob",)),)),
    ]
    assert [_norm(r) for r in store.batch(ops)] == [_norm(r) for r in ref.batch(ops)]
    # Pages have the same sizes (the order of unranked listings differs by design).
    assert len(store.search(("ana",), limit=2, offset=3)) == len(
        ref.search(("ana",), limit=2, offset=3)
    )

    for s in (store, ref):
        s.put(("ana", "prefs"), "food", {"likes": "pho", "stars": 1})
        s.delete(("ana", "trips"), "2024")
        s.delete(("ana", "trips"), "never-existed")
    assert [_norm(r) for r in store.batch(ops)] == [_norm(r) for r in ref.batch(ops)]


def test_batch_reads_see_the_store_before_its_writes_like_langgraph(store):
    ref = ReferenceStore()
    ops = [
        PutOp(("ana", "x"), "k", {"v": 1}),
        GetOp(("ana", "x"), "k"),
        PutOp(("ana", "x"), "k", {"v": 2}),
        SearchOp(("ana",)),
    ]
    assert [_norm(r) for r in store.batch(ops)] == [_norm(r) for r in ref.batch(ops)]
    assert store.get(("ana", "x"), "k").value == ref.get(("ana", "x"), "k").value == {"v": 2}


_ns = st.sampled_from([("ana", "a"), ("ana", "a", "deep"), ("ana", "b"), ("bob", "a")])
_key = st.sampled_from(["k1", "k2", "k3"])
_val = st.fixed_dictionaries({"n": st.integers(0, 3), "t": st.sampled_from(["x y", "z"])})
_op = st.one_of(
    st.builds(PutOp, _ns, _key, st.one_of(_val, st.none()), index=st.none(), ttl=st.none()),
    st.builds(GetOp, _ns, _key, refresh_ttl=st.just(True)),
    st.builds(
        SearchOp,
        st.sampled_from([("ana",), ("ana", "a"), ("bob",)]),
        st.one_of(st.none(), st.fixed_dictionaries({"n": st.integers(0, 3)})),
        limit=st.just(100),
        offset=st.just(0),
        query=st.none(),
        refresh_ttl=st.just(True),
    ),
    st.builds(
        ListNamespacesOp,
        st.sampled_from(
            [(MatchCondition("prefix", ("ana",)),), (MatchCondition("prefix", ("bob", "*")),)]
        ),
        st.sampled_from([None, 1, 2]),
        limit=st.just(100),
        offset=st.just(0),
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_op, min_size=1, max_size=4), min_size=1, max_size=6))
def test_random_batches_match_in_memory_store(batches):
    ref = ReferenceStore()
    with ReflectiveMemory(embedder=HashingEmbedder(64)) as core:
        store = ReflectiveStore(memory=core)
        for ops in batches:
            assert [_norm(r) for r in store.batch(ops)] == [_norm(r) for r in ref.batch(ops)]


def test_query_search_uses_core_retrieval_within_prefix_and_filter(store, core):
    _fill(store)
    store.put(("ana", "notes"), "dog", {"text": "Pixel the dog loves the beach"})
    hits = store.search(("ana",), query="which tea does she drink, genmaicha?", limit=2)
    assert hits[0].key == "drink" and hits[0].score is not None
    assert len(hits) == 2 and hits[0].score >= hits[1].score
    assert all(h.namespace[0] == "ana" for h in hits)
    assert {h.key for h in store.search(("ana", "trips"), query="tea genmaicha")} == {
        "2024",
        "2025",
    }
    only5 = store.search(("ana",), query="spicy food", filter={"stars": 5}, limit=10)
    assert {h.key for h in only5} == {"food", "2024"} and only5[0].key == "food"
    assert store.search(("ana",), query="spicy", limit=1, offset=1)[0].key != (
        store.search(("ana",), query="spicy", limit=1)[0].key
    )
    # The query is served by the core: the same memories come out of `retrieve`.
    top = core.retrieve("ana", "genmaicha green tea", k=1).hits[0].memory
    assert top.granularity == "item" and top.id == store.memory_id(("ana", "prefs"), "drink")
    assert "likes: green tea" in top.text and top.metadata["namespace"] == ["ana", "prefs"]


def test_items_are_memories_of_their_user_only(core, store):
    _fill(store)
    assert store.get(("bob", "prefs"), "drink") is None
    bob = store.search(("bob",), query="green tea genmaicha ramen Kyoto", limit=10)
    assert [h.key for h in bob] == ["food"] and bob[0].value["likes"] == "spicy tacos"
    assert store.list_namespaces(prefix=("bob",)) == [("bob", "prefs")]
    assert {m.user_id for m in core.memories("bob")} == {"bob"}
    docs = ReflectiveRetriever(memory=core, user_id="bob", k=10).invoke("spicy ramen")
    assert [d.metadata["memory_id"] for d in docs] == [store.memory_id(("bob", "prefs"), "food")]
    with pytest.raises(StoreNamespaceError):
        store.search((), query="tea")
    with pytest.raises(StoreNamespaceError):
        store.list_namespaces()
    with pytest.raises(InvalidNamespaceError):  # LangGraph's own error type still catches it
        store.list_namespaces(prefix=("*", "prefs"))

    admin = ReflectiveStore(memory=core, allow_cross_user=True)
    assert {h.namespace[0] for h in admin.search((), limit=100)} == {"ana", "bob"}
    assert len(admin.search((), query="spicy", limit=100)) == len(FOOD)
    assert ("bob", "prefs") in admin.list_namespaces(max_depth=2)


def test_fixed_user_and_user_position(core):
    ana = ReflectiveStore(memory=core, user_id="ana")
    bob = ReflectiveStore(memory=core, user_id="bob")
    ana.put(("memories",), "pet", {"text": "cat called Miso"})
    bob.put(("memories",), "pet", {"text": "cat called Tiger"})
    assert ana.get(("memories",), "pet").value == {"text": "cat called Miso"}
    assert bob.get(("memories",), "pet").value == {"text": "cat called Tiger"}
    assert [h.value["text"] for h in ana.search(("memories",), query="Tiger")] == [
        "cat called Miso"
    ]
    assert ana.list_namespaces() == [("memories",)]
    bob.delete(("memories",), "pet")
    assert ana.get(("memories",), "pet") is not None and bob.get(("memories",), "pet") is None

    by_second = ReflectiveStore(memory=core, user_position=1)
    by_second.put(("profiles", "carol"), "job", {"text": "baker"})
    assert core.memories("carol")[0].metadata["key"] == "job"
    with pytest.raises(StoreNamespaceError):
        by_second.put(("profiles",), "job", {"text": "x"})
    with pytest.raises(StoreNamespaceError):
        by_second.search(("profiles",))
    assert by_second.list_namespaces(prefix=("profiles", "carol")) == [("profiles", "carol")]


def test_overwrite_keeps_created_at_and_index_fields(core):
    store = ReflectiveStore(memory=core, index={"fields": ["text"]})
    store.put(("ana", "n"), "a", {"text": "loves hiking in the Alps", "note": "pizza pizza"})
    store.put(("ana", "n"), "b", {"text": "pizza every friday", "note": "hiking"})
    store.put(("ana", "n"), "c", {"title": "no text field here pizza"})
    store.put(("ana", "n"), "d", {"text": "pizza margherita"}, index=False)
    hits = store.search(("ana",), query="pizza", limit=10)
    assert hits[0].key == "b" and hits[1].key == "a"
    assert [h.score is None for h in hits] == [False, False, True, True]
    assert {h.key for h in hits[2:]} == {"c", "d"}
    assert len(store.search(("ana",), query="pizza", limit=2)) == 2

    first = store.get(("ana", "n"), "a")
    store.put(("ana", "n"), "a", {"text": "now loves sailing"})
    again = store.get(("ana", "n"), "a")
    assert again.value == {"text": "now loves sailing"}
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    assert len([m for m in core.memories("ana") if m.granularity == "item"]) == 4
    assert store.search(("ana", "n"), limit=1)[0].key == "a"  # most recently updated first


def test_validation_and_ttl(store):
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(InvalidInputError):
            store.put(("ana",), "k", {"v": 1}, ttl=bad)
        with pytest.raises(InvalidInputError):
            store.batch([PutOp(("ana",), "k", {"v": 1}, ttl=bad)])
    assert store.get(("ana",), "k") is None
    with pytest.raises(InvalidInputError):
        store.put(("ana",), "k", {"v": object()})
    with pytest.raises(InvalidInputError):
        store.put(("ana",), "k", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespaceError):
        store.put(("ana.x",), "k", {"v": 1})
    with pytest.raises(InvalidInputError):
        store.search(("ana",), filter={"v": {"$regex": "a"}})
    # A bad op anywhere in a batch applies nothing.
    with pytest.raises(InvalidInputError):
        store.batch([PutOp(("ana",), "ok", {"v": 1}), PutOp(("ana",), "bad", {"v": {1, 2}})])
    assert store.get(("ana",), "ok") is None
    with pytest.raises(ConfigError):
        ReflectiveStore(memory=store.memory, index={"dims": 384, "embed": lambda t: t})
    with pytest.raises(ConfigError):
        ReflectiveStore(memory=store.memory, index={"fields": "text"})  # type: ignore[typeddict-item]
    with pytest.raises(InvalidInputError):
        ReflectiveStore(memory="nope")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        ReflectiveStore(memory=store.memory, user_position=-1)
    store.put(("ana",), "empty", {})
    assert store.get(("ana",), "empty").value == {}


def test_durable_across_reopen(tmp_path):
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder()) as core:
        ReflectiveStore(memory=core).put(("ana", "prefs"), "tea", {"likes": "genmaicha"})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder()) as core:
        store = ReflectiveStore(memory=core)
        assert store.get(("ana", "prefs"), "tea").value == {"likes": "genmaicha"}
        assert store.search(("ana",), query="genmaicha")[0].key == "tea"


async def test_async_api(store):
    await store.aput(("ana", "a"), "k", {"text": "async item about sailing"})
    assert (await store.aget(("ana", "a"), "k")).value["text"].startswith("async")
    assert [i.key for i in await store.asearch(("ana",), query="sailing")] == ["k"]
    assert await store.alist_namespaces(prefix=("ana",)) == [("ana", "a")]
    await store.adelete(("ana", "a"), "k")
    assert await store.aget(("ana", "a"), "k") is None


@dataclass
class UserContext:
    user_id: str


def test_create_agent_tools_use_the_store(core):
    store = ReflectiveStore(memory=core)

    def remember(fact: str, runtime: ToolRuntime[UserContext]) -> str:
        """Save a fact about the user."""
        key = f"fact-{len(runtime.store.search((runtime.context.user_id, 'facts'), limit=100))}"
        runtime.store.put((runtime.context.user_id, "facts"), key, {"fact": fact})
        return f"saved {key}"

    def recall(query: str, runtime: ToolRuntime[UserContext]) -> str:
        """Look up saved facts."""
        found = get_store().search((runtime.context.user_id, "facts"), query=query, limit=1)
        return found[0].value["fact"] if found else "nothing"

    def call(name: str, args: dict, i: str) -> AIMessage:
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": i}])

    model = recording_model(
        call("remember", {"fact": "My sister Lea lives in Porto."}, "1"),
        "Saved.",
        call("recall", {"query": "where does Lea live"}, "2"),
        "Lea lives in Porto [0].",
        call("recall", {"query": "where does Lea live"}, "3"),
        "I don't know.",
    )
    mw = ReflectiveMemoryMiddleware(memory=core, user_id="ana", session_id="s")
    agent = create_agent(
        model,
        tools=[remember, recall],
        middleware=[mw],
        store=store,
        context_schema=UserContext,
    )
    agent.invoke({"messages": [("user", "Remember: Lea is in Porto.")]}, context=UserContext("ana"))
    assert store.get(("ana", "facts"), "fact-0").value == {"fact": "My sister Lea lives in Porto."}

    out = agent.invoke({"messages": [("user", "Where does Lea live?")]}, context=UserContext("ana"))
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert tool_msgs[-1].text == "My sister Lea lives in Porto."
    # The middleware's retrieval sees the store item as one of ana's memories too.
    assert any(h.memory.granularity == "item" for h in mw.last_retrieval.hits)

    out = agent.invoke({"messages": [("user", "Where does Lea live?")]}, context=UserContext("bob"))
    assert [m for m in out["messages"] if isinstance(m, ToolMessage)][-1].text == "nothing"
