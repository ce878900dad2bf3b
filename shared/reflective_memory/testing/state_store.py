"""`StateStoreContract`: the tests every `StateStore` implementation must pass.

Subclass it in a pytest test class and provide a `state_store` fixture that yields an empty
state store::

    from reflective_memory.testing import StateStoreContract

    class TestMyStateStore(StateStoreContract):
        @pytest.fixture
        def state_store(self):
            yield MyStateStore()

`FileStateStore` (on disk and in memory) and PostgreSQL's `DatabaseStateStore` run these tests.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.state import StateStore

__all__ = ["StateStoreContract"]


def _put(data: bytes | bytearray | None) -> Any:
    return lambda _version, _old: data


class StateStoreContract:
    """The state store contract as tests; subclasses provide a `state_store` fixture."""

    def test_implements_the_protocol(self, state_store: Any) -> None:
        """The object is a `StateStore`."""
        assert isinstance(state_store, StateStore)

    def test_nothing_stored(self, state_store: Any) -> None:
        """An unknown state reads as absent, version 0; deleting it deletes nothing."""
        assert state_store.get("u", "w") is None and state_store.version("u", "w") == 0
        assert state_store.names("u") == []
        assert state_store.delete("u", "w") is False and state_store.delete_owner("u") == 0

    def test_update_creates_then_bumps_the_version(self, state_store: Any) -> None:
        """`fn` sees the current state; each write returns and stores a higher version."""
        seen = []

        def first(version: int, data: bytes | None) -> bytes:
            seen.append((version, data))
            return b"one"

        v1, data = state_store.update("u", "w", first)
        assert seen == [(0, None)] and data == b"one" and v1 > 0
        assert state_store.get("u", "w") == (v1, b"one") and state_store.version("u", "w") == v1

        def second(version: int, data: bytes | None) -> bytes:
            seen.append((version, data))
            return (data or b"") + b"+two"

        v2, data = state_store.update("u", "w", second)
        assert seen[1] == (v1, b"one") and data == b"one+two" and v2 > v1
        assert state_store.get("u", "w") == (v2, b"one+two")

    def test_update_returning_none_deletes(self, state_store: Any) -> None:
        """An update that returns None deletes the state (or creates none)."""
        assert state_store.update("u", "w", _put(None)) == (0, None)
        assert state_store.get("u", "w") is None
        state_store.update("u", "w", _put(b"x"))
        assert state_store.update("u", "w", _put(None)) == (0, None)
        assert state_store.get("u", "w") is None and state_store.names("u") == []

    def test_a_failing_update_writes_nothing(self, state_store: Any) -> None:
        """When `fn` raises, the stored state and its version stay as they were."""
        v, _ = state_store.update("u", "w", _put(b"kept"))

        def boom(version: int, data: bytes | None) -> bytes:
            raise RuntimeError("no")

        with pytest.raises(RuntimeError):
            state_store.update("u", "w", boom)
        with pytest.raises(InvalidInputError):
            state_store.update("u", "w", lambda _v, _d: "not bytes")
        assert state_store.get("u", "w") == (v, b"kept")

    def test_bytes_round_trip_exactly(self, state_store: Any) -> None:
        """Any bytes come back unchanged: empty, binary, newlines, a megabyte."""
        for i, data in enumerate([b"", b"\x00\n\xff\r\n", bytes(range(256)) * 4096]):
            v, _ = state_store.update("u", f"w{i}", _put(data))
            assert state_store.get("u", f"w{i}") == (v, data)
        assert state_store.update("u", "view", _put(bytearray(b"ab")))[1] == b"ab"

    def test_versions_never_repeat_after_a_delete(self, state_store: Any) -> None:
        """A state deleted and written again gets a version it never had."""
        seen = [state_store.update("u", "w", _put(b"a"))[0]]
        seen.append(state_store.update("u", "w", _put(b"b"))[0])
        assert state_store.delete("u", "w") is True
        seen.append(state_store.update("u", "w", _put(b"c"))[0])
        assert state_store.delete_owner("u") == 1
        seen.append(state_store.update("u", "w", _put(b"d"))[0])
        state_store.update("u", "w", _put(None))
        seen.append(state_store.update("u", "w", _put(b"e"))[0])
        assert seen == sorted(seen) and len(set(seen)) == len(seen)

    def test_owners_and_names_are_separate(self, state_store: Any) -> None:
        """States of different owners or names never mix; `delete_owner` erases one owner."""
        keys = [("u", "a"), ("u", "b"), ("u2", "a"), ("u/b", "a"), ("u", "b/a")]
        for i, (owner, name) in enumerate(keys):
            state_store.update(owner, name, _put(str(i).encode()))
        for i, (owner, name) in enumerate(keys):
            assert state_store.get(owner, name)[1] == str(i).encode()
        assert state_store.names("u") == ["a", "b", "b/a"]
        assert state_store.delete_owner("u") == 3
        assert state_store.names("u") == [] and state_store.get("u", "a") is None
        assert state_store.get("u2", "a")[1] == b"2" and state_store.get("u/b", "a")[1] == b"3"

    def test_any_string_is_a_safe_key(self, state_store: Any) -> None:
        """Ids that look like paths or hold any text are just keys."""
        owners = ["..", "../../etc", "/abs", "a\\b", "ünï cødé 🐝", "x" * 600, " "]
        for owner in owners:
            state_store.update(owner, "../name", _put(owner.encode()))
        for owner in owners:
            assert state_store.get(owner, "../name")[1] == owner.encode()
            assert state_store.names(owner) == ["../name"]
            assert state_store.delete_owner(owner) == 1

    def test_bad_keys_are_refused(self, state_store: Any) -> None:
        """Owners and names are non-empty str without NUL characters."""
        for owner, name in [("", "w"), ("u", ""), ("u\x00", "w"), ("u", "w\x00"), (3, "w")]:
            with pytest.raises(InvalidInputError):
                state_store.update(owner, name, _put(b"x"))
            with pytest.raises(InvalidInputError):
                state_store.get(owner, name)

    def test_concurrent_updates_lose_nothing(self, state_store: Any) -> None:
        """Read-modify-writes from several threads apply one after the other."""

        def add_one(version: int, data: bytes | None) -> bytes:
            return str(int(data or b"0") + 1).encode()

        def work() -> None:
            for _ in range(25):
                state_store.update("u", "counter", add_one)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert state_store.get("u", "counter")[1] == b"100"
