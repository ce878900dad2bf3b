"""Export / import on the embedded store: round trips, idempotence, malformed files, the CLI."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from portable_data import fill, open_memory, rankings, snapshot
from reflective_memory import HashingEmbedder
from reflective_memory.cli import main
from reflective_memory.errors import InvalidFileError, InvalidInputError, UnknownUserError
from reflective_memory.portable import endpoint, export_memory, import_memory, open_endpoint
from reflective_memory.portable.export import SESSION_VALUE_KEYS, SHARED_OWNERS


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict]:
    """A filled store, its export file, its snapshot and its rankings."""
    base = tmp_path_factory.mktemp("portable")
    with open_memory(base / "src") as mem:
        fill(mem)
        before = rankings(mem, mem.users())
        snap = snapshot(endpoint(mem))
        export_memory(mem, base / "export.jsonl")
    return base / "src", base / "export.jsonl", snap, before


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text("utf-8").splitlines()]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def test_sqlite_to_file_to_sqlite_keeps_everything(source, tmp_path) -> None:
    _, file, snap, before = source
    with open_memory(tmp_path / "dst") as mem:
        report = import_memory(mem, file)
        assert snapshot(endpoint(mem)) == snap
        assert rankings(mem, mem.users()) == before
    kinds = {k: n for k, n in report.added.items() if n}
    assert kinds == {"session": 6, "turn": 24, "memory": 34, "value": 4, "state": 3}
    assert report.vectors == {"reused": 34}  # the same embedder wrote them: nothing re-embedded
    assert report.embedder == "hashing:64"
    # what the snapshot holds is worth comparing: both kinds of sessions, learned state, extras
    user = snap["user-0"]
    assert {s[1] for s in user["sessions"]} == {"open", "ended"}
    assert user["state"] and snap["__shared__"] and user["extras"]["s0"]
    assert {m[2] for m in user["memories"]} == {"turn", "segment", "topic", "note", "item"}


def test_importing_twice_adds_nothing(source, tmp_path) -> None:
    _, file, snap, _ = source
    with open_memory(tmp_path / "dst") as mem:
        first = import_memory(mem, file)
        again = import_memory(mem, file)
        assert snapshot(endpoint(mem)) == snap
    assert sum(again.added.values()) == 0
    assert {k: n for k, n in again.skipped.items() if n} == {
        k: n for k, n in first.added.items() if n
    }


def test_a_cut_file_fails_at_its_end_and_a_rerun_finishes(source, tmp_path) -> None:
    _, file, snap, _ = source
    records = lines(file)
    cut = next(i for i, r in enumerate(records) if r.get("kind") == "user_end") + 20
    part = write(tmp_path / "part.jsonl", records[:cut])
    with open_memory(tmp_path / "dst") as mem:
        with pytest.raises(InvalidFileError, match=f"line {cut}: .*truncated"):
            import_memory(mem, part)
        assert mem.users() == ["user-0"]  # the first user went in whole; nothing of the
        # second, whose block was cut before its user_end line
        assert snapshot(endpoint(mem))["user-0"] == snap["user-0"]
        import_memory(mem, file)
        assert snapshot(endpoint(mem)) == snap


def test_another_embedder_recomputes_the_vectors(source, tmp_path) -> None:
    _, file, snap, _ = source
    with open_memory(tmp_path / "dst") as mem:
        report = import_memory(mem, file, embedder=HashingEmbedder(dim=32))
        got = snapshot(endpoint(mem))
    assert report.vectors == {"recomputed": 34}
    assert {m for m, _ in got["user-0"]["vectors"].values()} == {"hashing:32"}
    assert got["user-0"]["memories"] == snap["user-0"]["memories"]


def test_without_vectors_an_import_needs_an_embedder(source, tmp_path) -> None:
    src, _, snap, _ = source
    ep = open_endpoint(src)
    try:
        export_memory(ep, tmp_path / "bare.jsonl", vectors=False)
    finally:
        ep.store.close()
    assert all(r.get("vector") is None for r in lines(tmp_path / "bare.jsonl"))
    target = open_endpoint(tmp_path / "bare")
    try:
        with pytest.raises(InvalidInputError, match="no embeddings"):
            import_memory(target, tmp_path / "bare.jsonl")
        assert target.store.users() == []
    finally:
        target.store.close()
    with open_memory(tmp_path / "dst") as mem:
        report = import_memory(mem, tmp_path / "bare.jsonl")
        got = snapshot(endpoint(mem))
    assert report.vectors == {"recomputed": 34}
    assert got["user-1"]["memories"] == snap["user-1"]["memories"]
    # made again as the memory's writing makes them (a turn's from what was said, a
    # segment's from its turns): the vectors the source's writing made, not its keys'
    assert got["user-1"]["vectors"] == snap["user-1"]["vectors"]
    assert {m for m, _ in got["user-1"]["vectors"].values()} == {"hashing:64"}


def _turn_line(records: list[dict]) -> int:
    return next(i for i, r in enumerate(records) if r.get("kind") == "turn")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: "{not json", "is not JSON"),
        (lambda r: {**r, "kind": "turns"}, "unknown kind 'turns'"),
        (lambda r: {k: v for k, v in r.items() if k != "text"}, "missing key 'text'"),
        (lambda r: {**r, "timestamp": "yesterday"}, "timestamp: 'yesterday' is not an ISO"),
        (lambda r: {**r, "turn_id": ""}, "turn_id: turn_id must not be empty"),
        (lambda r: {**r, "role": 3}, "role"),
        (lambda r: {**r, "colour": "red"}, "unknown key 'colour'"),
        (lambda r: {**r, "text": "edited"}, "do not match their count or checksum"),
    ],
)
def test_a_malformed_line_is_named_and_its_record_not_written(source, tmp_path, edit, message):
    _, file, _, _ = source
    records = lines(file)
    i = _turn_line(records)
    bad = edit(records[i])
    text = "".join((bad if j == i and isinstance(bad, str) else json.dumps(bad if j == i else r))
                   + "\n" for j, r in enumerate(records))  # fmt: skip
    path = tmp_path / "bad.jsonl"
    path.write_text(text, "utf-8")
    target = open_endpoint(tmp_path / "dst")
    try:
        with pytest.raises(InvalidFileError, match=message) as err:
            import_memory(target, path)
        assert "line" in str(err.value)
        if "checksum" not in message:
            assert f"line {i + 1}" in str(err.value)
            assert target.store.turns("user-0") == []  # nothing of that line (or after) went in
    finally:
        target.store.close()


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([], "is empty"),
        ([{"format": "something-else"}], "line 1: is not a reflective-memory-export header"),
        ([{"format": "reflective-memory-export", "version": 99}], "format version 99"),
        (
            [
                {
                    "format": "reflective-memory-export",
                    "version": 1,
                    "library": "x",
                    "vectors": True,
                    "embedder": None,
                },  # fmt: skip
                {
                    "kind": "turn",
                    "session_id": "s",
                    "turn_id": "t",
                    "position": 0,
                    "role": "user",
                    "text": "hi",
                },  # fmt: skip
            ],
            "line 2: a turn line outside a user's lines",
        ),
    ],
)
def test_files_that_are_not_exports_fail_before_writing(tmp_path, records, message) -> None:
    target = open_endpoint(tmp_path / "dst")
    try:
        with pytest.raises(InvalidFileError, match=message):
            import_memory(target, write(tmp_path / "f.jsonl", records))
        assert target.store.users() == []
    finally:
        target.store.close()


@pytest.mark.parametrize(
    ("kind", "edit", "message"),
    [
        ("value", {"key": "rmm.reflection/user-1/s0"}, "value key .* is not one of user 'user-0'"),
        ("state", {"owner": "user-1"}, "state of owner 'user-1' inside the lines of user"),
    ],
)
def test_a_block_cannot_write_another_users_data(source, tmp_path, kind, edit, message) -> None:
    _, file, _, _ = source
    records = lines(file)
    i = next(i for i, r in enumerate(records) if r.get("kind") == kind)
    records[i] = {**records[i], **edit}
    target = open_endpoint(tmp_path / "dst")
    try:
        with pytest.raises(InvalidFileError, match=f"line {i + 1}: {message}"):
            import_memory(target, write(tmp_path / "f.jsonl", records))
        assert target.store.get_value("rmm.reflection/user-1/s0") is None
        assert target.state.names("user-1") == []
    finally:
        target.store.close()


def test_export_one_user_and_unknown_users(source, tmp_path) -> None:
    src, _, snap, _ = source
    ep = open_endpoint(src)
    try:
        report = export_memory(ep, tmp_path / "one.jsonl", users=["user-1"])
        with pytest.raises(UnknownUserError):
            export_memory(ep, tmp_path / "none.jsonl", users=["nobody"])
    finally:
        ep.store.close()
    assert report.users == ["user-1"] and not (tmp_path / "none.jsonl").exists()
    assert not list(tmp_path.glob("*.part"))


def test_cli_export_import_round_trip(source, tmp_path, capsys) -> None:
    src, _, snap, _ = source
    out = tmp_path / "all.jsonl.gz"
    assert main(["export", "--db", str(src), "-o", str(out)]) == 0
    assert "exported 2 users" in capsys.readouterr().out
    with gzip.open(out, "rt") as fh:
        assert json.loads(fh.readline())["format"] == "reflective-memory-export"
    dst = tmp_path / "dst"
    assert main(["import", "--db", str(dst), str(out)]) == 0
    said = capsys.readouterr().out
    assert "added 6 sessions, 24 turns, 34 memories, 4 values, 3 learned states" in said
    assert "embeddings: 34 reused (the file's were made by" not in said  # a bare store exported
    assert main(["import", "--db", str(dst), str(out)]) == 0
    assert "added nothing; already there, skipped" in capsys.readouterr().out
    ep = open_endpoint(dst)
    try:
        assert snapshot(ep) == snap
    finally:
        ep.store.close()


def test_cli_errors_are_one_line_exit_2(source, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "reflective-memory-export", "version": 1}\n')
    assert main(["import", "--db", str(tmp_path / "d"), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1" in err
    assert main(["export", "--db", str(tmp_path / "nothing"), "-o", str(tmp_path / "x")]) == 2
    assert "no memory.sqlite3" in capsys.readouterr().err


def test_known_keys_match_their_owners() -> None:
    from reflective_memory.rmm.turn_learning import PRIOR_OWNER

    assert SHARED_OWNERS == (PRIOR_OWNER,)
    assert SESSION_VALUE_KEYS[0]("u", "s") == "rmm.reflection/u/s"
    chat_store = pytest.importorskip("llamaindex_reflective.chat_store")
    assert SESSION_VALUE_KEYS[1]("u", "s").startswith(chat_store._MARK_PREFIX)


def test_the_commands_and_the_format_load_no_heavy_library() -> None:
    code = (
        "import sys, reflective_memory.cli, reflective_memory.portable.files\n"
        "heavy = [m for m in ('torch', 'faiss', 'sentence_transformers', 'psycopg') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
