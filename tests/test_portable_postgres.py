"""Export / import / migrate on the real PostgreSQL server: lossless moves, a killed migrate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pg_cluster import pg_schema
from portable_data import T0, fill, open_memory, rankings, snapshot
from reflective_memory.cli import main
from reflective_memory.portable import (
    endpoint,
    export_memory,
    import_memory,
    migrate,
    open_endpoint,
)
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.storage.postgres import PostgresStore

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """A filled embedded store, its snapshot and its rankings."""
    path = tmp_path_factory.mktemp("pg_portable") / "src"
    with open_memory(path) as mem:
        fill(mem)
        return path, snapshot(endpoint(mem)), rankings(mem, mem.users())


def test_sqlite_to_postgres_migrate_keeps_everything(source, pg_dsn, capsys) -> None:
    path, snap, before = source
    schema = pg_schema()
    src, dst = open_endpoint(path), open_endpoint(dsn=pg_dsn, schema=schema)
    try:
        report = migrate(src, dst)
        assert report.ok and [u.user_id for u in report.users] == ["user-0", "user-1"]
        assert snapshot(dst) == snap
        again = migrate(src, dst)  # a second run moves nothing and still verifies
        assert again.ok and sum(again.imported.added.values()) == 0
    finally:
        src.store.close()
        dst.store.close()
    with open_memory(store=PostgresStore(pg_dsn, schema=schema)) as mem:
        assert rankings(mem, mem.users()) == before
    # the command line says the same, per user
    assert main(["migrate", "--from", str(path), "--to", pg_dsn, "--schema", schema]) == 0
    out = capsys.readouterr().out
    assert "user-0: turns 12, sessions 3, open sessions 1, memories 17; checksum matches" in out
    assert "verified 2 users" in out


def test_postgres_to_file_to_sqlite_keeps_everything(tmp_path, pg_dsn) -> None:
    schema = pg_schema()
    with open_memory(store=PostgresStore(pg_dsn, schema=schema)) as mem:
        fill(mem)
        snap, before = snapshot(endpoint(mem)), rankings(mem, mem.users())
        export_memory(mem, tmp_path / "pg.jsonl")
    with open_memory(tmp_path / "dst") as mem:
        report = import_memory(mem, tmp_path / "pg.jsonl")
        assert snapshot(endpoint(mem)) == snap
        assert rankings(mem, mem.users()) == before
    assert report.vectors == {"reused": 34}
    # the command line exports the same lines from the server (but for the header's times)
    out = tmp_path / "cli.jsonl"
    assert main(["export", "--dsn", pg_dsn, "--schema", schema, "-o", str(out)]) == 0
    cli, lib = out.read_text().splitlines(), (tmp_path / "pg.jsonl").read_text().splitlines()
    assert cli[1:] == lib[1:] and len(cli) > 70
    # and back onto a fresh PostgreSQL schema through the command line
    other = pg_schema()
    assert main(["import", "--dsn", pg_dsn, "--schema", other, str(tmp_path / "pg.jsonl")]) == 0
    ep = open_endpoint(dsn=pg_dsn, schema=other)
    try:
        assert snapshot(ep) == snap
    finally:
        ep.store.close()


def _bulk_source(path: Path, users: int) -> int:
    """An embedded store of many small users written through the store API; returns turns."""
    ep = open_endpoint(path)
    rng = np.random.default_rng(0)
    turns = 0
    try:
        for u in range(users):
            user = f"bulk-{u:03d}"
            for s in range(3):
                rows = [
                    {
                        "user_id": user,
                        "session_id": f"s{s}",
                        "role": "user" if i % 2 == 0 else "assistant",
                        "text": f"{user} says thing {i} in session {s}",
                        "turn_id": f"s{s}:{i}",
                        "timestamp": T0 + timedelta(days=s, minutes=i),
                    }
                    for i in range(6)
                ]
                ep.store.add_turns(rows)
                turns += len(rows)
                drafts = [
                    MemoryDraft(f"s{s}", "turn", r["text"], r["text"], (r["turn_id"],))
                    for r in rows
                ]
                vecs = rng.standard_normal((len(drafts), 16)).astype(np.float32)
                if s < 2:
                    ep.store.replace_session_memories(user, f"s{s}", ("turn",), drafts, vecs, "x")
    finally:
        ep.store.close()
    return turns


def _count(dsn: str, schema: str, table: str) -> int:
    try:
        with psycopg.connect(dsn) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {schema}.{table}").fetchone()[0])
    except psycopg.errors.UndefinedTable:
        return 0


def test_a_killed_migrate_finishes_on_a_rerun_with_exact_counts(tmp_path, pg_dsn) -> None:
    path, schema = tmp_path / "bulk", pg_schema()
    total = _bulk_source(path, users=80)
    cmd = [sys.executable, "-m", "reflective_memory.cli", "migrate", "--from", str(path)]
    cmd += ["--to", pg_dsn, "--schema", schema]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}{REPO}"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _count(pg_dsn, schema, "turns") < total // 4:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "migrate wrote nothing in 60 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    moved = _count(pg_dsn, schema, "turns")
    assert 0 < moved < total  # killed in the middle
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "verified 80 users: counts and checksums match" in done.stdout
    assert "already there, skipped: " in done.stdout
    assert _count(pg_dsn, schema, "turns") == total
    assert _count(pg_dsn, schema, "memories") == 80 * 2 * 6
    src, dst = open_endpoint(path), open_endpoint(dsn=pg_dsn, schema=schema)
    try:
        assert snapshot(dst) == snapshot(src)
    finally:
        src.store.close()
        dst.store.close()
