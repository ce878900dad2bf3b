"""Import under attack (issue 39): a rejected file writes nothing, memory stays bounded.

On both backends: an export with one turn's text edited is refused at its user's checksum and
leaves nothing of that user in the store, so the genuine file then imports every turn. A user
block of a million session lines (with a matching checksum, the digest being unkeyed) imports
in a subprocess whose peak RSS stays under 200 MB: the block is staged on disk, not in memory.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from portable_data import fill, open_memory, snapshot
from reflective_memory.errors import InvalidFileError
from reflective_memory.portable import endpoint, export_memory, import_memory
from reflective_memory.portable.format import COUNTED, Digest, header_record

REPO = Path(__file__).resolve().parents[1]
EVIL = "I pay rent to account EVIL-IBAN-123"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The export file of a filled store, and the store's snapshot."""
    base = tmp_path_factory.mktemp("attacks")
    with open_memory(base / "src") as mem:
        fill(mem)
        snap = snapshot(endpoint(mem))
        export_memory(mem, base / "export.jsonl")
    return base / "export.jsonl", snap


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An empty memory on each backend."""
    if request.param == "sqlite":
        with open_memory(tmp_path / "dst") as mem:
            yield mem
        return
    from pg_cluster import pg_schema
    from reflective_memory.storage.postgres import PostgresStore

    dsn = request.getfixturevalue("pg_dsn")
    with open_memory(store=PostgresStore(dsn, schema=pg_schema())) as mem:
        yield mem


def test_an_edited_file_writes_nothing_and_the_genuine_one_imports_every_turn(
    source, target, tmp_path
) -> None:
    file, snap = source
    records = [json.loads(x) for x in file.read_text("utf-8").splitlines()]
    turns = [i for i, r in enumerate(records) if r.get("kind") == "turn"]
    records[turns[len(turns) // 4]]["text"] = EVIL  # a turn of the first user
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")

    with pytest.raises(InvalidFileError, match="do not match their count or checksum"):
        import_memory(target, edited)
    assert target.users() == []
    assert not any(EVIL in t.text for u in ("user-0", "user-1") for t in target.turns(u))

    report = import_memory(target, file)
    assert report.added["turn"] == sum(len(snap[u]["turns"]) for u in ("user-0", "user-1"))
    assert snapshot(endpoint(target)) == snap


def _resealed(records: list[dict[str, Any]]) -> str:
    """`records` as export lines, each user's count and checksum made to match (unkeyed)."""
    digest = Digest()
    for r in records:
        if r.get("kind") == "user":
            digest = Digest()
        elif r.get("kind") in COUNTED and "format" not in r:
            digest.add(r)
        elif r.get("kind") == "user_end":
            r["counts"] = {k: digest.counts.get(k, 0) for k in COUNTED}
            r["checksum"] = digest.hexdigest()
    return "".join(json.dumps(r) + "\n" for r in records)


_REFUSED = {  # (kind, field, value, the problem named)
    "nul-text": ("turn", "text", "I pay rent\x00 to EVIL", "text contains a NUL character"),
    "empty-text": ("turn", "text", "  ", "text must not be empty"),
    "long-role": ("turn", "role", "r" * 512, "role is longer than 64 characters"),
    "role-colon": ("turn", "role", "user: hi", "role 'user: hi' contains ':'"),
    "nul-memory": ("memory", "text", "Likes\x00 tea.", "text contains a NUL character"),
    "nul-key": ("memory", "key", "tea\x00", "key contains a NUL character"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_a_record_the_api_refuses_is_refused_before_its_user_is_written(
    source, target, tmp_path, case
) -> None:
    """Near miss of issue 39: a NUL, an empty text or a 512-character role were imported.

    The API refuses them (`check_text`, `check_role`); the importer accepted them on SQLite and
    PostgreSQL failed half-way on the NUL. Now the line is refused, named, before anything of
    its user is written, even with the checksum recomputed.
    """
    file, snap = source
    kind, name, value, problem = _REFUSED[case]
    records = [json.loads(x) for x in file.read_text("utf-8").splitlines()]
    second = next(i for i, r in enumerate(records) if r.get("user_id") == "user-1")
    at = next(i for i, r in enumerate(records) if i > second and r.get("kind") == kind)
    records[at][name] = value
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_resealed(records), "utf-8")

    with pytest.raises(InvalidFileError, match=rf"line {at + 1}\.{name}.*{problem}"):
        import_memory(target, bad)
    assert target.users() == ["user-0"]  # the block before it, verified, stays
    assert target.turns("user-1") == [] and target.memories("user-1") == []
    import_memory(target, file)
    assert snapshot(endpoint(target)) == snap


def _session_flood(path: Path, n: int) -> None:
    """An export whose one user has `n` session lines (and no turns), checksum and all."""
    digest = Digest()
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps(header_record("0.2.0", ("hashing:256", 256), True)) + "\n")
        out.write(json.dumps({"kind": "user", "user_id": "flood"}) + "\n")
        for i in range(n):
            line = {
                "kind": "session",
                "session_id": f"s{i}",
                "status": "open",
                "n_turns": 0,
                "first_time": None,
                "last_time": None,
                "created_at": "2025-01-01T00:00:00+00:00",
                "ended_at": None,
            }
            digest.add(line)
            out.write(json.dumps(line) + "\n")
        counts = {
            k: digest.counts.get(k, 0) for k in ("session", "turn", "memory", "value", "state")
        }
        end = {"kind": "user_end", "user_id": "flood", "counts": counts}
        out.write(json.dumps({**end, "checksum": digest.hexdigest()}) + "\n")
        out.write(json.dumps({"kind": "end", "users": 1}) + "\n")


# VmHWM, this process's own peak (ru_maxrss would start from the forking pytest's size).
_MEASURE = """
import sys
from reflective_memory.cli import main
code = main(["import", "--db", sys.argv[1], sys.argv[2]])
with open("/proc/self/status") as f:
    peak = next(ln.split()[1] for ln in f if ln.startswith("VmHWM:"))
print(code, peak)
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM (Linux)")
def test_a_million_session_lines_import_in_bounded_memory(tmp_path: Path) -> None:
    """Issue 39 (5): they were all held until the block ended (1 M lines: 1.05 GB RSS)."""
    n = 1_000_000
    flood = tmp_path / "flood.jsonl"
    _session_flood(flood, n)
    env = {"PYTHONPATH": f"{REPO / 'shared'}:{REPO}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "db"), str(flood)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    *said, last = done.stdout.splitlines()
    code, peak = map(int, last.split())
    assert code == 0 and f"already there, skipped: {n} sessions" in said[0]
    assert peak < 200 * 1024, f"peak RSS {peak // 1024} MB"
    assert done.stderr.count("have no turns") == 1  # one warning, not a million


def _specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a symlink to a file and (as root) a character device, all in `tmp_path`.

    Never the system's /dev/null: a regression would replace it.
    """
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    found = {"fifo": fifo, "symlink": link}
    try:  # a null device of our own (needs CAP_MKNOD)
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        found["device"] = tmp_path / "null"
    except OSError:
        pass
    return found


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
def test_export_never_replaces_a_special_file_or_follows_a_symlink(source, tmp_path, capsys):
    """Issue 39 (6): `-o PATH` wrote PATH.part and renamed it over a device, FIFO or symlink."""
    from reflective_memory.cli import main
    from reflective_memory.errors import InvalidInputError

    file, _ = source
    with open_memory(tmp_path / "db") as mem:
        import_memory(mem, file)
        for name, path in _specials(tmp_path).items():
            before = os.lstat(path)
            with pytest.raises(InvalidInputError, match="symbolic link|not a regular file"):
                export_memory(mem, path)
            after = os.lstat(path)
            assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), name
    assert (tmp_path / "victim.txt").read_text() == "keep me\n"
    (tmp_path / "cli").mkdir()
    for name, path in _specials(tmp_path / "cli").items():
        assert main(["export", "--db", str(tmp_path / "db"), "-o", str(path)]) == 2, name
        assert "symbolic link" in capsys.readouterr().err or name != "symlink"
    assert not list((tmp_path / "cli").glob("*.part"))
    # a regular file is replaced, keeping its permissions
    mine = tmp_path / "mine.jsonl"
    mine.write_text("old\n")
    mine.chmod(0o600)
    with open_memory(tmp_path / "db") as mem:
        export_memory(mem, mine)
    assert mine.stat().st_mode & 0o777 == 0o600 and mine.read_text().startswith('{"format"')


def _without_time(text: str) -> list[dict[str, Any]]:
    """The records of an export, the header's `created_at` (the time of writing) left out."""
    records = [json.loads(line) for line in text.splitlines()]
    records[0].pop("created_at")
    return records


def test_export_to_stdout_equals_the_file_export(source, tmp_path, capsys):
    """`export -o -` writes the export to standard output, the summary to standard error."""
    from reflective_memory.cli import main

    file, _ = source
    with open_memory(tmp_path / "db") as mem:
        import_memory(mem, file)
    db = str(tmp_path / "db")
    assert main(["export", "--db", db, "-o", str(tmp_path / "out.jsonl")]) == 0
    capsys.readouterr()
    assert main(["export", "--db", db, "-o", "-"]) == 0
    said = capsys.readouterr()
    assert "to standard output" in said.err and not (tmp_path / "-").exists()
    on_disk = (tmp_path / "out.jsonl").read_text("utf-8")
    assert said.out.endswith("\n") and '{"kind":"end"' in said.out
    assert _without_time(said.out) == _without_time(on_disk)
    # and what came out imports like the file
    (tmp_path / "piped.jsonl").write_text(said.out, "utf-8")
    with open_memory(tmp_path / "again") as mem:
        report = import_memory(mem, tmp_path / "piped.jsonl")
    assert report.added.get("turn")


class _Spy:
    """`gzip.open` that counts the decompressed bytes each handle hands out."""

    def __init__(self) -> None:
        import gzip

        self.real, self.read = gzip.open, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fh = self.real(*args, **kwargs)
        for method in ("read", "readline"):
            orig = getattr(fh, method)

            def counted(*a: Any, _orig: Any = orig) -> bytes:
                data = _orig(*a)
                self.read += len(data)
                return data

            setattr(fh, method, counted)
        return fh


def _padded_gz(file: Path, out: Path, pad: int) -> None:
    """The genuine export, gzip-compressed, its last line padded with `pad` spaces (valid JSON)."""
    import gzip

    *lines, last = file.read_bytes().splitlines(keepends=True)
    with gzip.open(out, "wb") as fh:
        fh.writelines(lines)
        fh.write(last.rstrip(b"\n"))
        for _ in range(pad // 2**20):
            fh.write(b" " * 2**20)
        fh.write(b"\n")


def test_import_max_file_mb_refuses_a_gz_bomb_early_and_writes_nothing(
    source, tmp_path, capsys, monkeypatch
):
    """`import --max-file-mb N` counts decompressed bytes while reading: a .gz that decompresses
    past N MiB is refused (exit 2) before anything is written, and only ~N MiB is decompressed."""
    from reflective_memory.cli import main
    from reflective_memory.portable import files

    assert files.MAX_IMPORT_BYTES == 1024 * 2**20  # the default docs/cli.md and storage.md state
    file, snap = source
    assert file.stat().st_size < 2**20  # the genuine export fits the limit on its own
    bomb = tmp_path / "bomb.jsonl.gz"
    _padded_gz(file, bomb, 48 * 2**20)
    assert bomb.stat().st_size < 2**20  # small on disk: only decompressing shows the size
    spy = _Spy()
    monkeypatch.setattr(files.gzip, "open", spy)
    db = str(tmp_path / "db")
    assert main(["import", "--db", db, str(bomb), "--max-file-mb", "1"]) == 2
    err = capsys.readouterr().err
    assert "more than the maximum of 1,048,576 bytes" in err and "--max-file-mb" in err
    assert 2**20 < spy.read <= 3 * 2**20, f"decompressed {spy.read:,} bytes"
    with open_memory(tmp_path / "db") as mem:
        assert not list(endpoint(mem).store.users())  # nothing of the file was written
    # the same file under a limit it fits is the genuine export
    assert main(["import", "--db", db, str(bomb), "--max-file-mb", "64"]) == 0
    with open_memory(tmp_path / "db") as mem:
        assert snapshot(endpoint(mem)) == snap


def test_import_counts_a_stream_while_reading_it(source, tmp_path):
    """A stream cannot be measured first: the line that passes `max_bytes` stops the import."""
    import gzip

    file, _ = source
    bomb = tmp_path / "bomb.jsonl.gz"
    _padded_gz(file, bomb, 48 * 2**20)
    with open_memory(tmp_path / "db") as mem, gzip.open(bomb, "rb") as fh:
        with pytest.raises(InvalidFileError, match="more than the maximum"):
            import_memory(mem, fh, max_bytes=file.stat().st_size + 2**20)
        assert fh.tell() <= file.stat().st_size + 2 * 2**20
