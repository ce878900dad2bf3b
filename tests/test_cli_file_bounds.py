"""Issue 50 (4, 5, 7, 10, 11 and near misses): the CLI's file commands check before they write.

Through the real command line (`reflective_memory.cli.main`, and subprocesses where memory is
measured or a process is killed): `ingest` of a chat log with a NUL, `ingest` of a `.jsonl.gz`
that inflates to one huge line, `import` of checksummed exports with a cut vector or a repeated
turn id, `import` killed half-way, and `export -o` beside an unrelated `.part` file.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from portable_data import fill, open_memory, snapshot
from reflective_memory.cli import main
from reflective_memory.portable import endpoint, export_memory
from reflective_memory.portable.endpoints import STORE_FILE
from reflective_memory.portable.format import COUNTED, Digest, header_record
from reflective_memory.portable.importer import STAGING_PREFIX

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": f"{REPO / 'shared'}:{REPO}", "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export file of a filled store (two users, vectors of a 64-dim hashing embedder)."""
    base = tmp_path_factory.mktemp("bounds")
    with open_memory(base / "src") as mem:
        fill(mem)
        export_memory(mem, base / "export.jsonl")
    return base / "export.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_sealed(lines: list[dict[str, Any]], path: Path) -> None:
    """Write export lines with every user's count and checksum recomputed (a sealed edit)."""
    digest = Digest()
    with path.open("w") as out:
        for line in lines:
            kind = line.get("kind")
            if kind == "user":
                digest = Digest()
            elif kind == "user_end":
                line = {
                    **line,
                    "counts": {k: digest.counts.get(k, 0) for k in COUNTED},
                    "checksum": digest.hexdigest(),
                }
            elif kind in COUNTED and "format" not in line:
                digest.add(line)
            out.write(json.dumps(line) + "\n")


def _no_store(db: Path) -> bool:
    return not (db / STORE_FILE).exists()


# -- ingest ------------------------------------------------------------------------------------
@pytest.mark.parametrize("line", [6, 1])
def test_ingest_refuses_a_nul_naming_the_file_and_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: int
) -> None:
    """Issue 50 (4): a NUL in line 6 stored the 5 turns before it and ended their session, the
    error naming no file or line; a NUL in line 1 still created an empty store."""
    log = tmp_path / "chat.jsonl"
    rows = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} about Pixel"}
        for i in range(10)
    ]
    rows[line - 1]["content"] = "before\u0000after"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "db"
    assert main(["ingest", "--db", str(db), "--user", "ana", str(log), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{log}: line {line}.content: contains a NUL character" in err, err
    assert _no_store(db)


# The peak resident set of this process (VmHWM), printed after the CLI ran.
_PEAK = """
import sys
from reflective_memory.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(ln.split()[1] for ln in f if ln.startswith("VmHWM:"))
print(code, peak)
"""


def _peak_cli(*argv: str) -> tuple[int, int, str]:
    """Run the CLI in a fresh process: (exit code, peak RSS in KiB, stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, timeout=600, env=ENV
    )
    code, peak = map(int, done.stdout.split()[-2:])
    return code, peak, done.stderr


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM (Linux)")
def test_ingest_of_a_gz_with_one_huge_line_reads_only_the_limit(tmp_path: Path) -> None:
    """Issue 50 (5): a `.jsonl.gz` holding one 600 MB line (582 KB compressed) was read whole
    before its size was checked: 1.23 GB RSS under `--max-file-mb 1`. 300 MB here."""
    big = tmp_path / "huge.jsonl.gz"
    chunk = b"a" * 2**20
    with gzip.open(big, "wb", compresslevel=9) as out:
        out.write(b'{"role": "user", "content": "')
        for _ in range(300):
            out.write(chunk)
        out.write(b'"}\n')
    assert big.stat().st_size < 2**20  # within the limit on disk
    db = tmp_path / "db"
    code, peak, err = _peak_cli(
        "ingest", "--db", str(db), "--user", "ana", str(big), "--max-file-mb", "1"
    )
    assert code == 2 and f"{big}: line 1: the file holds more than 1,048,576 characters" in err
    assert peak < 250 * 1024, f"peak RSS {peak // 1024} MB"
    assert _no_store(db)


# -- import ------------------------------------------------------------------------------------
def test_import_refuses_a_vector_of_the_wrong_size_naming_the_line(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 (7): a checksummed export whose memory vector was cut to 3 floats imported with
    exit 0, and every later retrieve and end_session of its user raised `could not broadcast`."""
    lines = _lines(exported)
    n = next(i for i, r in enumerate(lines) if r.get("kind") == "memory" and r.get("vector"))
    import base64

    lines[n]["vector"] = base64.b64encode(b"\0\0\x80?" * 3).decode()  # three 1.0 floats
    cut = tmp_path / "cut.jsonl"
    _write_sealed(lines, cut)
    db = tmp_path / "db"
    assert main(["import", "--db", str(db), str(cut)]) == 2
    err = capsys.readouterr().err
    dim = lines[0]["embedder"]["dim"]
    assert f"line {n + 1}.vector: holds 3 floats, but the header's embedder" in err, err
    assert f"makes {dim}" in err
    user = next(r["user_id"] for r in reversed(lines[:n]) if r.get("kind") == "user")
    with open_memory(db) as mem:
        assert user not in mem.users()  # nothing of that user's block was written
    # and a store a former version damaged so still reads: the cut vector is made again
    with open_memory(tmp_path / "damaged") as mem:
        mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        (unit,) = mem.memories("ana")
        mem.store.set_embeddings("ana", [unit.id], [[1.0, 1.0, 1.0]], mem.embedder.name)
        assert mem.retrieve("ana", "dog", k=3).hits
        assert mem.end_session("ana", "s1")


def test_import_refuses_a_turn_id_given_twice(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 near miss: two turn lines with one id and different texts imported the first
    and reported the second "already there, skipped"."""
    lines = _lines(exported)
    n = next(i for i, r in enumerate(lines) if r.get("kind") == "turn")
    twin = {**lines[n], "text": "I pay rent to account EVIL-IBAN-123", "position": 99}
    lines.insert(n + 1, twin)
    edited = tmp_path / "twice.jsonl"
    _write_sealed(lines, edited)
    db = tmp_path / "db"
    assert main(["import", "--db", str(db), str(edited)]) == 2
    err = capsys.readouterr().err
    turn, session = lines[n]["turn_id"], lines[n]["session_id"]
    assert f"line {n + 2}: this turn line repeats turn {turn!r} of session {session!r}" in err
    assert f"of line {n + 1}" in err


def test_a_refused_import_creates_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Issue 50 near miss: a gzip bomb refused by `--max-file-mb` still created an empty store;
    so did a file that is no export."""
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb") as out:
        out.write(json.dumps(header_record("0", None, False)).encode() + b"\n")
        for _ in range(3):
            out.write(b" " * 2**20)
    db = tmp_path / "db"
    assert main(["import", "--db", str(db), str(bomb), "--max-file-mb", "1"]) == 2
    assert "more than the maximum" in capsys.readouterr().err
    assert not db.exists()
    other = tmp_path / "other.jsonl"
    other.write_text('{"role": "user", "content": "hi"}\n')
    assert main(["import", "--db", str(db), str(other)]) == 2
    assert "is not a reflective-memory-export header" in capsys.readouterr().err
    assert not db.exists()


def _flood(path: Path, turns: int) -> None:
    """A sealed export of one user with `turns` turns in one session (no memories)."""
    lines: list[dict[str, Any]] = [
        header_record("0", None, True),
        {"kind": "user", "user_id": "flo"},
    ]
    lines.append(
        {
            "kind": "session",
            "session_id": "s",
            "status": "open",
            "n_turns": turns,
            "first_time": None,
            "last_time": None,
            "created_at": "2025-01-01T00:00:00+00:00",
            "ended_at": None,
        }
    )
    for i in range(turns):
        text = f"secret diary entry {i}: I told nobody about the lake house"
        lines.append(
            {
                "kind": "turn",
                "session_id": "s",
                "turn_id": f"t{i}",
                "position": i,
                "role": "user",
                "text": text,
                "timestamp": None,
            }
        )
    lines += [{"kind": "user_end", "user_id": "flo"}, {"kind": "end", "users": 1}]
    _write_sealed(lines, path)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_a_killed_import_leaves_no_text_in_the_system_temp_folder(tmp_path: Path) -> None:
    """Issue 50 (10): 11 of 12 SIGKILLs during `import` left a `reflective-import-*.sqlite3` of
    the file's text in the system temp folder, which `delete_user` never reaches. The staging
    file now lives in the store's own folder and the next import removes it."""
    flood = tmp_path / "flood.jsonl"
    _flood(flood, 60_000)
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    db = tmp_path / "db"
    env = {**ENV, "TMPDIR": str(systmp)}
    cli = [sys.executable, "-m", "reflective_memory.cli", "import", "--db", str(db), str(flood)]
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    staged: list[Path] = []
    while not staged:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no staging file appeared"
        staged = [p for p in db.glob(STAGING_PREFIX + "*") if p.stat().st_size > 100_000]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert list(systmp.iterdir()) == []  # nothing in the system's temporary folder
    assert oct(staged[0].stat().st_mode & 0o777) == oct(0o600)
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "removed 1 staging files of imports that stopped half-way" in done.stderr
    assert list(db.glob(STAGING_PREFIX + "*")) == [] and list(systmp.iterdir()) == []
    with open_memory(db) as mem:
        assert len(mem.turns("flo")) == 60_000


def test_a_cleared_staging_block_leaves_no_text_in_free_pages(tmp_path: Path) -> None:
    """Issue 50 (10): a staging file with 0 rows still held 106 turn records in free pages."""
    from reflective_memory.portable.importer import _Stage

    stage = _Stage(tmp_path)
    for i in range(500):
        record = {"kind": "turn", "session_id": "s", "turn_id": f"t{i}", "text": f"LAKEHOUSE-{i}"}
        stage.add("turn", "s", i + 2, record)
    stage.db.commit()
    stage.clear()
    stage.db.commit()
    assert b"LAKEHOUSE" not in Path(stage.path).read_bytes()
    stage.close()
    assert list(tmp_path.iterdir()) == []


# -- export ------------------------------------------------------------------------------------
def test_export_leaves_an_unrelated_part_file_and_writes_mode_0600(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 (11): `export -o X` deleted an unrelated `X.part`, and the export (every user's
    memory) was created 0644."""
    db = tmp_path / "db"
    assert main(["import", "--db", str(db), str(exported)]) == 0
    for name in ("out.jsonl", "out.jsonl.gz"):
        target = tmp_path / name
        other = tmp_path / (name + ".part")
        other.write_text("someone else's file\n")
        old = os.umask(0o022)
        try:
            assert main(["export", "--db", str(db), "-o", str(target)]) == 0
        finally:
            os.umask(old)
        assert other.read_text() == "someone else's file\n"
        assert oct(target.stat().st_mode & 0o777) == oct(0o600)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with open_memory(tmp_path / "again") as mem:
        from reflective_memory.portable import import_memory

        import_memory(mem, tmp_path / "out.jsonl.gz")
        with open_memory(tmp_path / "src-check") as src:
            import_memory(src, exported)
            assert snapshot(endpoint(mem)) == snapshot(endpoint(src))
    capsys.readouterr()
