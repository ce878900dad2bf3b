"""Many processes on one PostgreSQL memory: 4 writers, 2 readers, one writer SIGKILLed midway.

Writers add turns for the same four users (each turn says whose it is) and acknowledge every
`add_turn` that returned; a session ends automatically at its 6th turn. Readers retrieve for
every user and check each hit belongs to that user, and race the writers to end full sessions.
Afterwards: no acknowledged turn is missing, no reader saw another user's memory, and every
ended session was built exactly once (its build counter is 1 and every process that ended it
got the same memories).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

REPO = Path(__file__).resolve().parents[1]
USERS = ["u0", "u1", "u2", "u3"]
RUN_SECONDS = float(os.environ.get("REFLECTIVE_MP_SECONDS", "16"))

COMMON = textwrap.dedent(
    """
    import json, os, sys, time
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
    from reflective_memory.storage.postgres import PostgresStore
    dsn, schema, work, name = sys.argv[1:5]
    USERS = ["u0", "u1", "u2", "u3"]
    mem = ReflectiveMemory(
        store=PostgresStore(dsn, schema=schema, pool_max=4), embedder=HashingEmbedder(64),
        config=MemoryConfig(
            granularities=("turn",), max_session_turns=6, sessions={"end_on_new_session": False}
        ),
    )
    open(os.path.join(work, name + ".ready"), "w").close()
    while not os.path.exists(os.path.join(work, "go")):
        time.sleep(0.02)
    deadline = float(open(os.path.join(work, "go")).read())
    out = open(os.path.join(work, name + ".log"), "a", buffering=1)
    """
)

WRITER = COMMON + textwrap.dedent(
    """
    words = "garden piano violin marathon lisbon dog cat parrot tea chess".split()
    n = 0
    while time.time() < deadline:
        user = USERS[n % 4]
        k, i = divmod(n // 4, 6)
        session = f"{name}-{user}-{k}"
        text = f"owner={user} {words[n % 10]} {words[(n * 7) % 10]} fact {name}-{n}"
        t = mem.add_turn(user, session, "user", text)
        out.write(json.dumps({"user": user, "session": session, "turn": t.turn_id}) + "\\n")
        n += 1
    mem.close()
    """
)

READER = COMMON + textwrap.dedent(
    """
    queries = ["garden piano", "dog cat", "lisbon tea", "chess marathon", "parrot violin"]
    n = 0
    while time.time() < deadline:
        user = USERS[n % 4]
        r = mem.retrieve(user, queries[n % 5], k=20)
        for h in r:
            if h.memory.user_id != user or f"owner={user} " not in h.memory.text:
                out.write(json.dumps({"leak": [user, h.memory.user_id, h.memory.text]}) + "\\n")
        for info in mem.store.sessions(user):
            if info.n_turns >= 6 and n % 3 == 0:
                ids = sorted(m.id for m in mem.end_session(user, info.session_id))
                out.write(json.dumps({"ended": [user, info.session_id, ids]}) + "\\n")
        out.write(json.dumps({"retrieved": len(r)}) + "\\n")
        n += 1
    mem.close()
    """
)


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the killed writer's last line may be cut
            pass
    return out


def test_writers_readers_and_a_killed_writer(tmp_path: Path, pg_dsn) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    schema = pg_schema()
    PostgresStore(pg_dsn, schema=schema).close()  # schema first, so no process races for it
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "reader.py").write_text(READER)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}{REPO}"}
    names = [f"w{i}" for i in range(4)] + ["r0", "r1"]
    procs = {
        n: subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / ("writer.py" if n[0] == "w" else "reader.py")),
                pg_dsn,
                schema,
                str(tmp_path),
                n,
            ],
            env=env,
        )  # fmt: skip
        for n in names
    }
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"{n}.ready").exists() for n in names):
            assert time.time() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs.values()), "a worker died at start"
            time.sleep(0.1)
        end = time.time() + RUN_SECONDS
        (tmp_path / "go.tmp").write_text(repr(end))
        (tmp_path / "go.tmp").rename(tmp_path / "go")
        time.sleep(RUN_SECONDS / 2)
        os.kill(procs["w0"].pid, signal.SIGKILL)
        for n, p in procs.items():
            code = p.wait(timeout=RUN_SECONDS + 120)
            assert code == (-signal.SIGKILL if n == "w0" else 0), f"{n} exited with {code}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()

    acked = [r for n in names if n[0] == "w" for r in _lines(tmp_path / f"{n}.log")]
    reads = [r for n in ("r0", "r1") for r in _lines(tmp_path / f"{n}.log")]
    assert len(acked) > 100, "writers made too little progress to test anything"
    assert sum(1 for r in reads if "retrieved" in r) > 10
    assert any(r.get("retrieved") for r in reads)
    assert [r for r in reads if "leak" in r] == []

    with ReflectiveMemory(
        store=PostgresStore(pg_dsn, schema=schema),
        embedder=HashingEmbedder(64),
        config=MemoryConfig(units={"granularities": ("turn",)}),
    ) as mem:
        store = mem.store
        for user in USERS:
            stored = {(t.session_id, t.turn_id) for t in mem.turns(user)}
            mine = {(r["session"], r["turn"]) for r in acked if r["user"] == user}
            assert mine <= stored, f"acknowledged turns of {user} missing: {mine - stored}"
        ended = 0
        for user in USERS:
            for info in store.sessions(user):
                if info.status != "ended":
                    assert info.n_turns < 6 or info.session_id.startswith("w0-")
                    continue
                ended += 1
                assert store.session_builds(user, info.session_id) == 1, info
                final = sorted(m.id for m in store.session_memories(user, info.session_id))
                assert len(final) == 6
                for r in reads:
                    if "ended" in r and r["ended"][:2] == [user, info.session_id]:
                        assert r["ended"][2] == final
        assert ended >= 8
        assert sum(1 for r in reads if "ended" in r) > 0
