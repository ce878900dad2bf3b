"""A process killed with SIGKILL while ingesting loses no acknowledged turn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

WRITER = textwrap.dedent(
    """
    import sys
    from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
    path, ack = sys.argv[1], sys.argv[2]
    mem = ReflectiveMemory(path, embedder=HashingEmbedder(64),
                           config=MemoryConfig(granularities=("turn",), max_session_turns=7))
    with open(ack, "a", buffering=1) as out:
        for i in range(100000):
            t = mem.add_turn("u", f"s{i // 10}", "user", f"fact number {i} about zebras")
            out.write(t.turn_id + "\\n")
    """
)


def test_sigkill_during_ingest_loses_no_acknowledged_turn(tmp_path: Path) -> None:
    db = tmp_path / "db"
    ack = tmp_path / "ack.txt"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(ack)], env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        if ack.exists() and len(ack.read_text().splitlines()) >= 60:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acknowledged = [line for line in ack.read_text().splitlines() if line]
    assert len(acknowledged) >= 60
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(db, embedder=HashingEmbedder(64), config=cfg) as mem:
        stored = {t.turn_id for t in mem.turns("u")}
        assert set(acknowledged) <= stored
        for session in mem.open_sessions("u"):
            mem.end_session("u", session)
        r = mem.retrieve("u", "fact number 3 about zebras", k=3)
        assert len(r) == 3
        assert mem.stats("u")["memories"] == len(stored)
