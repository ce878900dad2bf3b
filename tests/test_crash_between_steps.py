"""A process killed between committing a turn and indexing it (issue 29), on both backends.

A child process adds turns; its writer's indexing step is replaced by one that SIGKILLs the
process when it is handed the turn with a unique word, so that turn is committed and never
indexed. Afterwards the turn must be searchable by that word, on the next open of the store or
on the next write of that user by a process that was already running, and re-sending it with
the same turn id and content must be accepted: the stored turn comes back, nothing is added.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, InvalidInputError, ReflectiveMemory

REPO = Path(__file__).resolve().parents[1]
SECRET = "My locker code is zanzibar."

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from reflective_memory import HashingEmbedder, ReflectiveMemory
    from reflective_memory.sessions.writer import SessionWriter

    where, schema, user = sys.argv[1], sys.argv[2], sys.argv[3]
    index_turns = SessionWriter._index_turns

    def crash_before_indexing(self, stored, *rest):
        if any("zanzibar" in t.text for t in stored):
            os.kill(os.getpid(), signal.SIGKILL)  # the turn is committed, not yet indexed
        return index_turns(self, stored, *rest)

    SessionWriter._index_turns = crash_before_indexing
    if where.startswith("postgresql://"):
        from reflective_memory.storage.postgres import PostgresStore

        mem = ReflectiveMemory(
            store=PostgresStore(where, schema=schema, pool_max=2), embedder=HashingEmbedder(64)
        )
    else:
        mem = ReflectiveMemory(where, embedder=HashingEmbedder(64))
    for i in range(5):
        mem.add_turn(user, "s1", "user", f"Ordinary turn number {i}.", turn_id=f"m-{i}")
    mem.add_turn(user, "s1", "user", "My locker code is zanzibar.", turn_id="m-5")
    print("not killed", flush=True)
    """
)


def _open(where: str, schema: str) -> ReflectiveMemory:
    if where.startswith("postgresql://"):
        from reflective_memory.storage.postgres import PostgresStore

        store = PostgresStore(where, schema=schema, pool_max=2)
        return ReflectiveMemory(store=store, embedder=HashingEmbedder(64))
    return ReflectiveMemory(where, embedder=HashingEmbedder(64))


def _crash(where: str, schema: str, user: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}{REPO}"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, where, schema, user],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "not killed" not in proc.stdout


def _turn_units(mem: ReflectiveMemory, user: str) -> int:
    return mem.stats(user)["memories_by_granularity"].get("turn", 0)


def _found(mem: ReflectiveMemory, user: str) -> bool:
    return any("zanzibar" in h.memory.text for h in mem.retrieve(user, "zanzibar", k=3).hits)


def _retry_is_accepted(mem: ReflectiveMemory, user: str) -> None:
    [stored] = [t for t in mem.turns(user, "s1") if t.turn_id == "m-5"]
    n_memories = mem.stats(user)["memories"]
    again = mem.add_turn(user, "s1", "user", SECRET, turn_id="m-5")
    assert again == stored  # the stored turn, same position and seq
    assert [t.turn_id for t in mem.turns(user, "s1")] == [f"m-{i}" for i in range(6)]
    assert mem.stats(user)["memories"] == n_memories == 6  # nothing added
    with pytest.raises(InvalidInputError, match="already exists"):
        mem.add_turn(user, "s1", "user", "My locker code is elsewhere.", turn_id="m-5")


def _next_open(where: str, schema: str) -> None:
    _crash(where, schema, "ana")
    with _open(where, schema) as mem:  # reopening indexes the lost turn
        assert len(mem.turns("ana")) == 6 and _turn_units(mem, "ana") == 6
        assert _found(mem, "ana")
        _retry_is_accepted(mem, "ana")


def _next_write(where: str, schema: str) -> None:
    with _open(where, schema) as mem:  # running before the other process dies
        _crash(where, schema, "bea")
        assert len(mem.turns("bea")) == 6 and _turn_units(mem, "bea") == 5
        assert not _found(mem, "bea")  # reads repair nothing
        mem.add_turn("bea", "s2", "user", "Another day, another session.")
        assert _turn_units(mem, "bea") == 7 and _found(mem, "bea")
        mem.add_turn("bea", "s2", "user", "And one more.")  # checked once per process and user
        assert _turn_units(mem, "bea") == 8
    with _open(where, schema) as mem:
        assert [t.turn_id for t in mem.turns("bea", "s1")] == [f"m-{i}" for i in range(6)]
        n_memories = mem.stats("bea")["memories"]
        again = mem.add_turn("bea", "s1", "user", SECRET, turn_id="m-5")
        assert again.turn_id == "m-5" and mem.stats("bea")["memories"] == n_memories
        assert len(mem.turns("bea")) == 8 and _turn_units(mem, "bea") == 8
        assert mem.open_sessions("bea") == ["s2"]  # s1 ended when s2 began; a resend reopens none


def test_sqlite_lost_turn_is_indexed_on_the_next_open(tmp_path) -> None:
    _next_open(str(tmp_path / "m"), "")


def test_sqlite_lost_turn_is_indexed_on_the_users_next_write(tmp_path) -> None:
    _next_write(str(tmp_path / "m"), "")


def test_postgres_lost_turn_is_indexed_on_the_next_open(pg_dsn) -> None:
    _next_open(pg_dsn, pg_schema())


def test_postgres_lost_turn_is_indexed_on_the_users_next_write(pg_dsn) -> None:
    _next_write(pg_dsn, pg_schema())
