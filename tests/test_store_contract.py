"""Store contract as a mixin: every `MemoryStore` implementation runs the same tests."""

from __future__ import annotations

import numpy as np
import pytest
from reflective_memory import InvalidInputError, UnknownSessionError
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.storage.sqlite import SQLiteStore


def _turn(user: str, session: str, text: str, **kw):
    return {"user_id": user, "session_id": session, "role": "user", "text": text, **kw}


class StoreContract:
    """Subclasses provide a `store` fixture."""

    def test_turn_positions_and_sessions(self, store) -> None:
        a = store.add_turns([_turn("u", "s", "one"), _turn("u", "s", "two", turn_id="x")])
        assert [t.position for t in a] == [0, 1] and a[1].turn_id == "x"
        info = store.session("u", "s")
        assert info.status == "open" and info.n_turns == 2
        assert [t.text for t in store.turns("u", "s")] == ["one", "two"]
        with pytest.raises(InvalidInputError):
            store.add_turns([_turn("u", "s", "dup", turn_id="x")])
        assert store.session("u", "s").n_turns == 2

    def test_memories_replace_and_versions(self, store) -> None:
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

    def test_upsert_keeps_created_time(self, store) -> None:
        d = MemoryDraft("s", "topic", "text", "key", ("a",), id="topic-1")
        (m,) = store.upsert_memories("u", [d], np.zeros((1, 4)), "f")
        d2 = MemoryDraft("s2", "topic", "text 2", "key 2", ("a", "b"), id="topic-1")
        (m2,) = store.upsert_memories("u", [d2], np.zeros((1, 4)), "f")
        assert m2.created_at == m.created_at and m2.turn_ids == ("a", "b")
        assert len(store.memories("u")) == 1
        assert store.delete_memories("u", ["topic-1"]) == 1

    def test_delete_and_users(self, store) -> None:
        store.add_turns([_turn("a", "s", "x"), _turn("b", "s", "y")])
        assert store.users() == ["a", "b"]
        assert store.delete_session("a", "s") == 1
        assert store.users() == ["b"]
        assert store.delete_user("b") == 1 and store.users() == []

    def test_key_value(self, store) -> None:
        assert store.get_value("k") is None
        store.set_value("k", {"a": [1, 2]})
        assert store.get_value("k") == {"a": [1, 2]}


class TestSQLiteMemory(StoreContract):
    @pytest.fixture
    def store(self):
        s = SQLiteStore(None)
        yield s
        s.close()


class TestSQLiteFile(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = SQLiteStore(tmp_path / "m.sqlite3")
        yield s
        s.close()
