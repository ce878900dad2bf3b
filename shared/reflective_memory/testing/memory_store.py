"""`MemoryStoreContract`: the tests every `MemoryStore` implementation must pass.

Subclass it in a pytest test class and provide a `store` fixture that yields an empty store
(and closes it afterwards)::

    from reflective_memory.testing import MemoryStoreContract

    class TestMyStore(MemoryStoreContract):
        @pytest.fixture
        def store(self):
            s = MyStore()
            yield s
            s.close()

SQLite (in memory and on disk) and PostgreSQL run these same tests.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest

from reflective_memory.errors import (
    InvalidInputError,
    SessionChangedError,
    StoreClosedError,
    UnknownSessionError,
)
from reflective_memory.storage.base import (
    MemoryDraft,
    MemoryStore,
    RestoresTimes,
    TurnUnitAudit,
    session_fence,
)

__all__ = ["MemoryStoreContract"]


def _turn(user: str, session: str, text: str, **kw: Any) -> dict[str, Any]:
    return {"user_id": user, "session_id": session, "role": "user", "text": text, **kw}


def _one(session: str, text: str, turn_ids: tuple[str, ...], **kw: Any) -> MemoryDraft:
    return MemoryDraft(session, "turn", text, text, turn_ids, **kw)


class MemoryStoreContract:
    """The store contract as tests; subclasses provide a `store` fixture giving an empty store."""

    def test_implements_the_protocol(self, store: Any) -> None:
        """The store is a `MemoryStore` (every member of the protocol is there)."""
        assert isinstance(store, MemoryStore)
        assert store.closed is False

    def test_turn_positions_and_sessions(self, store: Any) -> None:
        """Turns get positions in order; a duplicate turn id is refused."""
        a = store.add_turns([_turn("u", "s", "one"), _turn("u", "s", "two", turn_id="x")])
        assert [t.position for t in a] == [0, 1] and a[1].turn_id == "x"
        assert a[0].turn_id == "s:0" and a[0].seq < a[1].seq
        info = store.session("u", "s")
        assert info.status == "open" and info.n_turns == 2
        assert [t.text for t in store.turns("u", "s")] == ["one", "two"]
        with pytest.raises(InvalidInputError):
            store.add_turns([_turn("u", "s", "dup", turn_id="x")])
        assert store.session("u", "s").n_turns == 2

    def test_duplicate_turn_rolls_back_the_batch(self, store: Any) -> None:
        """A batch of turns is committed whole or not at all."""
        store.add_turns([_turn("u", "s", "one", turn_id="t1")])
        with pytest.raises(InvalidInputError):
            store.add_turns([_turn("u", "s", "two"), _turn("u", "s", "three", turn_id="t1")])
        assert [t.text for t in store.turns("u")] == ["one"]
        assert store.session("u", "s").n_turns == 1

    def test_sessions_and_counts(self, store: Any) -> None:
        """Sessions filter by status; `count` adds up turns, sessions and memories."""
        store.add_turns([_turn("u", "s1", "a"), _turn("u", "s2", "b"), _turn("u", "s2", "c")])
        d = _one("s1", "a", ("s1:0",))
        store.replace_session_memories("u", "s1", ["turn"], [d], np.ones((1, 4)), "f")
        assert [s.session_id for s in store.sessions("u", status="open")] == ["s2"]
        assert {s.session_id for s in store.sessions("u")} == {"s1", "s2"}
        c = store.count("u")
        assert c["turns"] == 3 and c["sessions"] == 2 and c["open_sessions"] == 1
        assert c["memories"] == 1 and c["memories_by_granularity"] == {"turn": 1}
        assert store.session("u", "nope") is None and store.turns("nobody") == []
        assert store.count("nobody")["turns"] == 0

    def test_memories_replace_and_versions(self, store: Any) -> None:
        """Replacing a session's memories ends it, bumps the version and drops the old ones."""
        store.add_turns([_turn("u", "s", "hello")])
        v0 = store.version("u")
        d = MemoryDraft("s", "turn", "user: hello", "hello", ("s:0",))
        (m,) = store.replace_session_memories("u", "s", ["turn"], [d], np.ones((1, 4)), "fake")
        assert store.version("u") > v0
        assert store.session("u", "s").status == "ended"
        (m2,) = store.replace_session_memories("u", "s", ["turn"], [d], np.ones((1, 4)), "fake")
        assert [x.id for x in store.memories("u")] == [m2.id] and m2.id != m.id
        ids, keys, blobs, models = store.embeddings("u")
        assert keys == ["hello"] and models == ["fake"]
        assert np.frombuffer(blobs[0], np.float32).tolist() == [1, 1, 1, 1]
        assert store.memories("u", ["nope", m2.id]) == [store.memories("u")[0]]
        with pytest.raises(UnknownSessionError):
            store.replace_session_memories("u", "zz", ["turn"], [], np.zeros((0, 4)), "f")

    def test_sessions_missing_turn_units(self, store: Any) -> None:
        """`TurnUnitAudit` (optional): open sessions with more turns than `turn` units."""
        if not isinstance(store, TurnUnitAudit):
            pytest.skip("the store does not offer TurnUnitAudit")
        store.add_turns([_turn("u", "s1", "a", turn_id="a"), _turn("u", "s1", "b", turn_id="b")])
        store.add_turns([_turn("u", "s2", "c", turn_id="c"), _turn("v", "s1", "d", turn_id="d")])
        vec = np.ones((1, 4))
        store.upsert_memories(
            "u", [_one("s1", "a", ("a",)), _one("s1", "b", ("b",))], np.ones((2, 4)), "f"
        )
        store.upsert_memories("u", [MemoryDraft("s2", "segment", "c", "c", ("c",))], vec, "f")
        assert store.sessions_missing_turn_units() == [("u", "s2"), ("v", "s1")]
        assert store.sessions_missing_turn_units("u") == [("u", "s2")]
        store.replace_session_memories("u", "s2", ["turn"], [], np.zeros((0, 4)), "f")  # ended
        assert store.sessions_missing_turn_units("u") == []
        store.upsert_memories("v", [_one("s1", "d", ("d",))], vec, "f")
        assert store.sessions_missing_turn_units() == []

    def test_one_embedding_per_memory(self, store: Any) -> None:
        """Drafts and embeddings must pair up; nothing is written otherwise."""
        d = MemoryDraft("s", "topic", "text", "key", ("a",), id="topic-1")
        with pytest.raises(InvalidInputError):
            store.upsert_memories("u", [d], np.zeros((2, 4)), "f")
        assert store.memories("u") == []

    def test_upsert_keeps_created_time(self, store: Any) -> None:
        """Upserting by id replaces the memory but keeps when it was created."""
        d = MemoryDraft("s", "topic", "text", "key", ("a",), id="topic-1")
        (m,) = store.upsert_memories("u", [d], np.zeros((1, 4)), "f")
        d2 = MemoryDraft("s2", "topic", "text 2", "key 2", ("a", "b"), id="topic-1")
        (m2,) = store.upsert_memories("u", [d2], np.zeros((1, 4)), "f")
        assert m2.created_at == m.created_at and m2.turn_ids == ("a", "b")
        assert len(store.memories("u")) == 1
        v = store.version("u")
        assert store.delete_memories("u", ["topic-1"]) == 1
        assert store.memories("u") == [] and store.version("u") > v
        assert store.delete_memories("u", []) == 0

    def test_memory_metadata_and_times_round_trip(self, store: Any) -> None:
        """Metadata and the source times come back as they were stored."""
        from datetime import datetime, timezone

        start = datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc)
        end = datetime(2025, 3, 1, 10, 0, tzinfo=timezone.utc)
        meta = {"rmm": {"sessions": ["s"]}, "n": 2}
        d = MemoryDraft("s", "topic", "t", "k", ("a",), start, end, meta, id="topic-1")
        store.upsert_memories("u", [d], np.zeros((1, 4)), "f")
        (m,) = store.memories("u")
        assert (m.start_time, m.end_time, m.metadata) == (start, end, meta)

    def test_update_metadata_is_a_metadata_only_write(self, store: Any) -> None:
        """`update_metadata` merges top-level fields; nothing else of the memory changes."""
        meta = {"rmm": {"sessions": ["s"]}, "n": 2}
        d = MemoryDraft("s", "item", "text", "key", (), metadata=meta, id="i1")
        (m,) = store.upsert_memories("u", [d], np.ones((1, 3)), "m1")
        store.upsert_memories(
            "v", [MemoryDraft("s", "item", "t", "k", (), id="j1")], np.ones((1, 3)), "m1"
        )
        v = store.version("u")
        assert store.update_metadata("u", {"i1": {"n": 3, "x": [1]}, "nope": {"n": 0}}) == 1
        assert store.update_metadata("u", {"j1": {"n": 9}}) == 0  # another user's memory
        assert store.update_metadata("u", {}) == 0
        (m2,) = store.memories("u")
        assert m2.metadata == {"rmm": {"sessions": ["s"]}, "n": 3, "x": [1]}
        assert (m2.text, m2.key, m2.updated_at, m2.created_at) == (
            m.text,
            m.key,
            m.updated_at,
            m.created_at,
        )
        assert store.version("u") == v
        assert store.vectors("u", ["i1"], "m1")["i1"].tolist() == [1.0, 1.0, 1.0]
        assert store.memories("v")[0].metadata == {}

    def test_delete_expired_goes_by_the_metadata_expiry(self, store: Any) -> None:
        """Memories whose numeric `expires_at` is at or before `now` go; no others."""
        stamps = {"past": 99.5, "now": 100, "later": 100.25, "text": "50", "none": None}
        drafts = [
            MemoryDraft("s", "item", k, k, (), metadata={"expires_at": v}, id=k)
            for k, v in stamps.items()
        ]
        drafts.append(MemoryDraft("s", "item", "plain", "plain", (), id="plain"))
        store.upsert_memories("u", drafts, np.ones((len(drafts), 3)), "m")
        other = MemoryDraft("s", "item", "t", "k", (), metadata={"expires_at": 1}, id="v-past")
        store.upsert_memories("v", [other], np.ones((1, 3)), "m")
        v = store.version("u")
        assert store.delete_expired("u", 50.0) == 0 and store.version("u") == v
        assert store.delete_expired("u", 100.0) == 2
        assert store.version("u") > v
        assert sorted(m.id for m in store.memories("u")) == ["later", "none", "plain", "text"]
        assert [m.id for m in store.memories("v")] == ["v-past"]  # another user's stays

    def test_embeddings_and_vectors(self, store: Any) -> None:
        """Recomputed embeddings are stored by model; `vectors` returns only that model's."""
        d = MemoryDraft("s", "item", "text", "key", (), id="i1")
        store.upsert_memories("u", [d], np.zeros((1, 3)), "m1")
        v = store.version("u")
        store.set_embeddings("u", ["i1"], np.array([[1.0, 2.0, 3.0]]), "m2")
        assert store.version("u") == v  # derived data: the memories did not change
        ids, keys, blobs, models = store.embeddings("u")
        assert ids == ["i1"] and keys == ["key"] and models == ["m2"]
        assert np.frombuffer(blobs[0], np.float32).tolist() == [1, 2, 3]
        got = store.vectors("u", ["i1", "nope"], "m2")
        assert list(got) == ["i1"] and got["i1"].tolist() == [1, 2, 3]
        assert store.vectors("u", ["i1"], "m1") == {}
        assert store.vectors("other", ["i1"], "m2") == {}

    def test_fence_rejects_a_changed_session_and_writes_nothing(self, store: Any) -> None:
        """A build fenced on turns that changed meanwhile writes nothing."""
        store.add_turns([_turn("u", "s", "one", turn_id="a"), _turn("u", "s", "two")])
        fence = session_fence(store.turns("u", "s"))
        unit = MemoryDraft("s", "turn", "user: one", "one", ("a",))
        topic = MemoryDraft("s", "topic", "t", "t", ("a",), id="topic-1",
                            metadata={"rmm": {"sessions": ["s"]}})  # fmt: skip
        store.add_turns([_turn("u", "s", "three")])  # the session grew during the build
        v = store.version("u")
        with pytest.raises(SessionChangedError):
            store.replace_session_memories(
                "u", "s", ["turn"], [unit, topic], np.ones((2, 4)), "f", fence=fence
            )
        assert store.memories("u") == [] and store.version("u") == v
        assert store.session("u", "s").status == "open"
        store.delete_turns("u", "s", ["a"])  # same count as the fence, but not the same turns
        with pytest.raises(SessionChangedError):
            store.replace_session_memories(
                "u", "s", ["turn"], [unit], np.ones((1, 4)), "f", fence=fence
            )
        fence = session_fence(store.turns("u", "s"))
        out = store.replace_session_memories(
            "u", "s", ["turn"], [unit, topic], np.ones((2, 4)), "f", fence=fence
        )
        assert sorted(m.granularity for m in out) == ["topic", "turn"]
        assert store.session("u", "s").status == "ended"
        assert {m.id for m in store.memories("u")} == {m.id for m in out}

    def test_version_never_repeats_after_delete_user(self, store: Any) -> None:
        """A user id deleted and used again never sees a version it had before."""
        seen = []
        for _ in range(3):
            store.add_turns([_turn("u", "s", "hi")])
            d = _one("s", "hi", ("s:0",))
            store.replace_session_memories("u", "s", ["turn"], [d], np.ones((1, 4)), "f")
            seen.append(store.version("u"))
            store.delete_user("u")
            assert store.version("u") == 0
        assert len(set(seen)) == 3 and all(v > 0 for v in seen)

    def test_users_never_read_each_other(self, store: Any) -> None:
        """No read or delete of one user reaches another user's rows."""
        store.add_turns([_turn("a", "s", "alpha secret"), _turn("b", "s", "beta")])
        da = MemoryDraft("s", "turn", "alpha secret", "alpha secret", ("s:0",), id="m-a")
        (ma,) = store.replace_session_memories("a", "s", ["turn"], [da], np.ones((1, 4)), "f")
        assert store.memories("b", [ma.id]) == []
        assert store.memories("b") == [] and store.embeddings("b")[0] == []
        assert store.delete_memories("b", [ma.id]) == 0
        assert [m.id for m in store.memories("a")] == ["m-a"]
        assert [t.text for t in store.turns("b")] == ["beta"]
        store.delete_user("a")
        assert store.memories("a") == [] and store.turns("a") == []
        assert [t.text for t in store.turns("b")] == ["beta"]

    def test_memory_ids_are_per_user(self, store: Any) -> None:
        """One memory id may name a memory of each of two users; neither reaches the other.

        A write under another user's id neither fails (which would tell that the id exists)
        nor touches that user's memory: an id is the user's own, as `user_id` leads every key.
        """
        da = MemoryDraft("s", "item", "alpha note", "alpha key", (), metadata={"n": 1}, id="m1")
        db = MemoryDraft("s", "item", "beta note", "beta key", (), id="m1")
        (ma,) = store.upsert_memories("a", [da], np.ones((1, 3)), "f")
        (mb,) = store.upsert_memories("b", [db], np.full((1, 3), 2.0), "f")
        assert (ma.id, mb.id) == ("m1", "m1")
        assert [(m.user_id, m.text) for m in store.memories("a", ["m1"])] == [("a", "alpha note")]
        assert [(m.user_id, m.text) for m in store.memories("b", ["m1"])] == [("b", "beta note")]
        assert store.update_metadata("b", {"m1": {"n": 2}}) == 1
        store.set_embeddings("b", ["m1"], np.full((1, 3), 3.0), "g")
        assert store.memories("a")[0].metadata == {"n": 1}
        assert store.vectors("a", ["m1"], "f")["m1"].tolist() == [1.0, 1.0, 1.0]
        assert store.embeddings("a")[:2] == (["m1"], ["alpha key"])
        assert store.delete_memories("b", ["m1"]) == 1
        assert [m.text for m in store.memories("a")] == ["alpha note"]
        assert store.memories("b") == []

    def test_delete_and_users(self, store: Any) -> None:
        """`users` lists who has something stored; deletes return the turns they removed."""
        store.add_turns([_turn("a", "s", "x"), _turn("b", "s", "y")])
        assert store.users() == ["a", "b"]
        assert store.delete_session("a", "s") == 1
        assert store.users() == ["b"]
        assert store.delete_user("b") == 1 and store.users() == []
        with pytest.raises(UnknownSessionError):
            store.delete_session("b", "s")

    def test_delete_turns_reopens_and_keeps_positions(self, store: Any) -> None:
        """Deleting some turns keeps the others' positions, their extras, and reopens."""
        store.add_turns([_turn("u", "s", t) for t in ("a", "b", "c")])
        d = _one("s", "a", ("s:0",))
        store.replace_session_memories("u", "s", ["turn"], [d], np.ones((1, 4)), "f")
        store.set_turn_extra("u", "s", {"s:1": {"x": 1}, "s:2": {"y": [2]}})
        gone = store.delete_turns("u", "s", ["s:1", "unknown"])
        assert [t.turn_id for t in gone] == ["s:1"]
        left = store.turns("u", "s")
        assert [(t.turn_id, t.position) for t in left] == [("s:0", 0), ("s:2", 2)]
        info = store.session("u", "s")
        assert info.status == "open" and info.n_turns == 2
        assert store.turn_extra("u", "s") == {"s:2": {"y": [2]}}
        assert len(store.memories("u")) == 1  # memories stay until the session is rebuilt
        (new,) = store.add_turns([_turn("u", "s", "d")])
        assert new.position == 3  # after the largest stored position: no position is shared
        with pytest.raises(UnknownSessionError):
            store.delete_turns("u", "zz")

    def test_delete_turns_drops_memories_holding_them(self, store: Any) -> None:
        """Memories citing a deleted turn (units and topics) go with it."""
        store.add_turns([_turn("u", "s", "one", turn_id="a"), _turn("u", "s", "two", turn_id="b")])
        drafts = [
            _one("s", "one", ("a",)),
            _one("s", "two", ("b",)),
            MemoryDraft(
                "s",
                "topic",
                "both",
                "both",
                ("a", "b"),
                id="topic-1",
                metadata={"rmm": {"sessions": ["s"]}},
            ),  # fmt: skip
        ]
        store.replace_session_memories("u", "s", ["turn"], drafts, np.ones((3, 4)), "f")
        v = store.version("u")
        assert [t.turn_id for t in store.delete_turns("u", "s", ["a"])] == ["a"]
        assert [m.text for m in store.memories("u")] == ["two"]
        assert store.version("u") > v and store.session("u", "s").status == "open"

    def test_delete_session_and_user_remove_derived_rows(self, store: Any) -> None:
        """Topics merging a session, its turn extras and per-user values go with it."""
        store.add_turns([_turn("u", "s1", "one"), _turn("u", "s2", "two")])
        topic = MemoryDraft("s2", "topic", "merged", "merged", ("s1:0", "s2:0"), id="topic-1",
                            metadata={"rmm": {"sessions": ["s2", "s1"]}})  # fmt: skip
        other = MemoryDraft("s2", "topic", "only s2", "only", ("s2:0",), id="topic-2",
                            metadata={"rmm": {"sessions": ["s2"]}})  # fmt: skip
        store.upsert_memories("u", [topic, other], np.ones((2, 4)), "f")
        store.set_turn_extra("u", "s1", {"s1:0": {"x": 1}})
        store.set_turn_extra("u", "s2", {"s2:0": {"x": 2}})
        store.set_value("rmm/u/s1", {"x": 1})
        store.set_value("rmm/u/s2", {"x": 2})
        store.set_value("rmm/u2/s1", {"x": 3})
        store.set_value("global", {"x": 4})
        assert store.delete_session("u", "s1") == 1
        assert [m.id for m in store.memories("u")] == ["topic-2"]
        assert store.turn_extra("u", "s1") == {} and store.turn_extra("u", "s2") != {}
        assert store.get_value("rmm/u/s1") is None and store.get_value("rmm/u/s2") == {"x": 2}
        store.delete_user("u")
        assert store.memories("u") == [] and store.turns("u") == []
        assert store.sessions("u") == [] and store.turn_extra("u", "s2") == {}
        assert store.get_value("rmm/u/s2") is None and store.version("u") == 0
        assert store.get_value("rmm/u2/s1") == {"x": 3} and store.get_value("global") == {"x": 4}
        assert "u" not in store.users()

    def test_turn_extra(self, store: Any) -> None:
        """Extra data attached to turns reads back by turn id; later writes replace it."""
        store.add_turns([_turn("u", "s", "a"), _turn("u", "s", "b")])
        assert store.turn_extra("u", "s") == {}
        store.set_turn_extra("u", "s", {})
        store.set_turn_extra("u", "s", {"s:0": {"kind": "ai", "n": [1, 2]}})
        store.set_turn_extra("u", "s", {"s:0": {"kind": "human"}, "s:1": {}})
        assert store.turn_extra("u", "s") == {"s:0": {"kind": "human"}, "s:1": {}}

    def test_key_value(self, store: Any) -> None:
        """JSON values read back as written; a second write replaces the first."""
        assert store.get_value("k") is None
        store.set_value("k", {"a": [1, 2]})
        assert store.get_value("k") == {"a": [1, 2]}
        store.set_value("k", [None, "x"])
        assert store.get_value("k") == [None, "x"]

    def test_times_come_back_timezone_aware(self, store: Any) -> None:
        """Every time a store gives back is aware: a naive one given is read as UTC."""
        naive = datetime(2025, 3, 1, 9, 30)
        east = timezone(timedelta(hours=2))
        (a, b) = store.add_turns(
            [
                _turn("u", "s", "naive", timestamp=naive),
                _turn("u", "s", "east", timestamp=datetime(2025, 3, 1, 11, 31, tzinfo=east)),
            ]
        )
        utc = naive.replace(tzinfo=timezone.utc)
        assert a.timestamp == utc and a.timestamp.tzinfo is not None
        got = [t.timestamp for t in store.turns("u")]
        assert got == [utc, utc + timedelta(minutes=1)] and all(t.tzinfo for t in got)
        info = store.session("u", "s")
        assert info.first_time == utc and info.last_time.tzinfo and info.created_at.tzinfo
        draft = _one("s", "naive", ("s:0",), start_time=naive, end_time=naive)
        (made,) = store.upsert_memories("u", [draft], np.ones((1, 4)), "f")
        (kept,) = store.memories("u")
        for m in (made, kept):
            assert m.start_time == m.end_time == utc and m.start_time.tzinfo is not None
            assert m.created_at.tzinfo is not None and m.updated_at.tzinfo is not None

    def test_restore_times(self, store: Any) -> None:
        """A `RestoresTimes` store sets the times an import brings; others' ids are ignored."""
        if not isinstance(store, RestoresTimes):
            pytest.skip("the store does not restore times (an optional capability)")
        store.add_turns([_turn("u", "s", "a"), _turn("u2", "s", "b")])
        store.upsert_memories("u", [_one("s", "a", ("s:0",), id="m1")], np.ones((1, 4)), "f")
        then = datetime(2020, 5, 1, 12, 30, 0, 123456, tzinfo=timezone.utc)
        before = store.version("u")
        store.restore_times("u", {"s": (then, then)}, {"m1": (then, then)})
        store.restore_times("u2", {"s": (then, None)}, {"m1": (then, then)})  # not u2's memory
        (got,) = store.memories("u", ["m1"])
        assert (got.created_at, got.updated_at) == (then, then) and store.version("u") > before
        info = store.session("u", "s")
        assert (info.created_at, info.ended_at) == (then, then)
        assert store.session("u2", "s").ended_at is None

    def test_close_is_idempotent_and_final(self, store: Any) -> None:
        """After `close`, `closed` is True and calls raise `StoreClosedError`."""
        store.add_turns([_turn("u", "s", "a")])
        store.close()
        store.close()
        assert store.closed is True
        with pytest.raises(StoreClosedError):
            store.turns("u")
