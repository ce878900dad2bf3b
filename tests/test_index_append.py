"""A user's index after a write reuses the previous version's work only where it is still true.

Every check compares what the carried index retrieves with a build from scratch.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

CONFIG = MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})
QUERIES = ["where does my sister live", "what did Ana say about the dog", "painting lakes"]
WORDS = "ana: bo: my sister lives in berlin the dog painting lakes moved ok thanks rain".split()


def _hits(mem: ReflectiveMemory, user: str, **kw: object) -> list[tuple[str, str, float]]:
    return [
        (h.memory.id, h.memory.text, round(h.score, 5))
        for q in QUERIES
        for h in mem.retrieve(user, q, **kw).hits  # type: ignore[arg-type]
    ]


def _fresh(mem: ReflectiveMemory, user: str, **kw: object) -> list[tuple[str, str, float]]:
    mem.indexes.invalidate(user)
    return _hits(mem, user, **kw)


def _chat(mem: ReflectiveMemory, n: int, session: str = "s0") -> None:
    lines = itertools.cycle(
        [
            ("user", "Ana: my sister lives in Berlin now"),
            ("assistant", "Bo: the dog was painting the lakes, ok"),
            ("user", "Ana: thanks, it rained all week"),
        ]
    )
    for _, (role, text) in zip(range(n), lines, strict=False):
        mem.add_turn("u", session, role, text)


@pytest.fixture(params=["sqlite", "postgres"])
def mem(request: pytest.FixtureRequest, tmp_path: Path):
    """A memory on disk, or on the real PostgreSQL server (a fresh schema)."""
    if request.param == "sqlite":
        with ReflectiveMemory(tmp_path / "m", embedder=HashingEmbedder(64), config=CONFIG) as m:
            yield m
        return
    from pg_cluster import pg_schema
    from reflective_memory.storage.postgres import PostgresStore

    store = PostgresStore(request.getfixturevalue("pg_dsn"), schema=pg_schema(), pool_max=4)
    with ReflectiveMemory(store=store, embedder=HashingEmbedder(64), config=CONFIG) as m:
        yield m


def test_a_new_turn_extends_the_index_and_retrieves_as_a_fresh_build(mem) -> None:
    _chat(mem, 30)
    mem.end_session("u", "s0")
    _chat(mem, 4, "s1")
    mem.retrieve("u", "warm up", mode="hybrid")  # BM25 built: the next version extends it
    mem.add_turn("u", "s1", "user", "Ana: my sister moved to Hamburg with the dog")
    got = _hits(mem, "u")
    index = mem.indexes.get("u")
    assert index.carried is not None and index.carried.appended_from == len(index.ids) - 1
    assert got == _fresh(mem, "u")
    assert mem.indexes.get("u").carried is None  # a build from scratch carries nothing


def test_bm25_built_versions_ago_is_extended_by_every_key_it_lacks(mem) -> None:
    """Versions that search densely build no BM25; the next hybrid search extends the last one."""
    _chat(mem, 12)
    mem.retrieve("u", "warm up", mode="hybrid")  # BM25 of this version
    mem.add_turn("u", "s1", "user", "Ana: the zeppelin flew over the harbour")
    mem.retrieve("u", "warm up", mode="dense")  # a version that builds no BM25
    mem.add_turn("u", "s1", "user", "Ana: the lighthouse keeper waved")
    got = [h.memory.id for h in mem.retrieve("u", "zeppelin harbour", k=3, mode="lexical").hits]
    index = mem.indexes.get("u")
    assert index.carried is not None and index.lexical.size == len(index.ids)
    fresh = _fresh(mem, "u", mode="hybrid")
    mem.indexes.invalidate("u")
    assert got == [
        h.memory.id for h in mem.retrieve("u", "zeppelin harbour", k=3, mode="lexical").hits
    ]
    assert fresh == _hits(mem, "u", mode="hybrid")


def test_a_rewritten_key_is_not_carried(mem) -> None:
    _chat(mem, 6)
    mem.retrieve("u", "warm up")
    index = mem.indexes.get("u")
    target = index.ids[0]
    mem.store.set_keys("u", [target], ["zeppelin over the harbour"])
    mem.add_turn("u", "s0", "user", "Ana: one more line")
    index = mem.indexes.get("u")
    assert index.carried is None
    assert index.keys[index.ids.index(target)] == "zeppelin over the harbour"
    assert mem.retrieve("u", "zeppelin harbour", k=1).hits[0].memory.id == target


def test_a_deleted_turn_is_not_carried(mem) -> None:
    _chat(mem, 9)
    mem.retrieve("u", "warm up")
    gone = mem.turns("u", "s0")[4]
    mem.delete_turns("u", "s0", [gone.turn_id])
    mem.add_turn("u", "s0", "user", "Ana: after the deletion")
    assert mem.indexes.get("u").carried is None
    got = _hits(mem, "u", budget_tokens=300)
    assert all(gone.turn_id not in text for _, text, _ in got)
    assert got == _fresh(mem, "u", budget_tokens=300)


class CarriedIndexMachine(RuleBasedStateMachine):
    """Random writes between retrievals; every check equals a build from scratch."""

    @initialize()
    def start(self) -> None:
        self.dir = Path(__import__("tempfile").mkdtemp())
        self.mem = ReflectiveMemory(self.dir, embedder=HashingEmbedder(32), config=CONFIG)
        self.carried = 0

    def teardown(self) -> None:
        self.mem.close()

    @rule(
        session=st.sampled_from(["s1", "s2", "s3"]),
        role=st.sampled_from(["user", "assistant"]),
        words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
    )
    def add(self, session: str, role: str, words: list[str]) -> None:
        self.mem.add_turn("u", session, role, " ".join(words))

    @rule(session=st.sampled_from(["s1", "s2", "s3"]))
    def end(self, session: str) -> None:
        if session in self.mem.open_sessions("u"):
            self.mem.end_session("u", session)

    @rule(session=st.sampled_from(["s1", "s2", "s3"]), pick=st.integers(0, 50))
    def delete_turn(self, session: str, pick: int) -> None:
        turns = self.mem.turns("u", session)
        if turns:
            self.mem.delete_turns("u", session, [turns[pick % len(turns)].turn_id])

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
    def note(self, words: list[str]) -> None:
        self.mem.put_memory("u", " ".join(words))

    @rule(budget=st.sampled_from([None, 120, 400]), mode=st.sampled_from(["dense", "hybrid"]))
    def retrieve(self, budget: int | None, mode: str) -> None:
        if self.mem.users():  # a dense search builds no BM25 for its version
            self.mem.retrieve("u", "my sister", budget_tokens=budget, mode=mode)
            self.carried += self.mem.indexes.get("u").carried is not None

    @rule(budget=st.sampled_from([None, 300]))
    def check(self, budget: int | None) -> None:
        if not self.mem.users():
            return
        got = _hits(self.mem, "u", budget_tokens=budget)
        assert got == _fresh(self.mem, "u", budget_tokens=budget)


TestCarriedIndex = CarriedIndexMachine.TestCase
TestCarriedIndex.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_reused_row_mark_is_not_mistaken_for_an_append(mem) -> None:
    """SQLite gives a deleted highest row's rowid to the next row: that is no append."""
    _chat(mem, 6)
    newest = mem.put_memory("u", "zeppelin over the harbour")
    mem.retrieve("u", "warm up")
    mem.store.delete_memories("u", [newest.id])  # behind the engine: its cache stays
    mem.put_memory("u", "lighthouse keeper notes")
    mem.put_memory("u", "the ferry leaves at noon")
    got = _hits(mem, "u")
    assert mem.indexes.get("u").carried is None
    assert all(mid != newest.id for mid, _, _ in got)
    assert got == _fresh(mem, "u")


def test_readers_and_a_writer_in_threads_share_versions_safely(tmp_path: Path) -> None:
    """Readers of an older version keep filling its caches while newer versions copy them."""
    import threading

    config = CONFIG.replace(passages={"budget_unit": "words"})
    with ReflectiveMemory(tmp_path / "m", embedder=HashingEmbedder(64), config=config) as mem:
        _chat(mem, 40)
        mem.end_session("u", "s0")
        errors: list[BaseException] = []
        stop = threading.Event()

        def read() -> None:
            try:
                while not stop.is_set():
                    for q in QUERIES:
                        assert mem.retrieve("u", q, budget_tokens=200).hits
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        for i in range(25):
            mem.add_turn(
                "u", f"live{i % 3}", "user", f"Ana: note {i} about the lakes and my sister"
            )
        stop.set()
        for t in readers:
            t.join()
        assert not errors, errors[0]
        assert _hits(mem, "u", budget_tokens=200) == _fresh(mem, "u", budget_tokens=200)
