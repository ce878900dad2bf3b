"""The CLI fails fast and honestly, creates nothing for read-only commands, and starts light."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, ReflectiveMemory, __version__, cli
from reflective_memory.cli import NO_BENCH, main
from reflective_memory.io import load_conversations
from reflective_memory.minilm import NumpyMiniLM

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch",
    "faiss",
    "transformers",
    "sentence_transformers",
    "reflective_memory.engine",
    "reflective_bench",
)
SHARED = ROOT / "shared"
#: What loads the embedding model the heavy way; `search` and `stats` need none of it.
MODEL = ("torch", "transformers", "sentence_transformers")


@pytest.fixture
def hashing(monkeypatch):
    import reflective_memory.engine as engine_mod

    monkeypatch.setattr(engine_mod, "default_embedder", lambda: HashingEmbedder(128))


@pytest.fixture
def store(tmp_path, hashing):
    db = tmp_path / "db"
    with ReflectiveMemory(db, embedder=HashingEmbedder(128)) as mem:
        mem.add_turn("ana", "s1", "user", "I moved to Berlin with my dog Pixel.")
        mem.add_turn("ana", "s1", "assistant", "Welcome to Berlin!")
        mem.end_session("ana", "s1")
    return db


def _import_probe(code: str) -> dict:
    """Run `code` on this checkout (the benchmarks importable) and parse its last line."""
    path = os.pathsep.join(filter(None, [str(SHARED), os.environ.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_and_version_import_nothing_heavy_and_are_fast() -> None:
    code = (
        "import contextlib, io, json, sys, time\n"
        "t = time.perf_counter()\n"
        "from reflective_memory.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = [main(['--help']), main(['--version']), main(['search', '--help']),\n"
        "          main(['ingest', '--help'])]\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy, 's': time.perf_counter() - t}))\n"
    )
    res = _import_probe(code)
    assert res["rc"] == [0, 0, 0, 0]
    assert res["heavy"] == []
    assert res["s"] < 1.5  # import + four parses; ~0.1 s on an idle machine


def test_only_bench_imports_the_benchmarks() -> None:
    code = (
        "import contextlib, io, json, sys\n"
        "from reflective_memory.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = [main(['segment', '--help']), main(['demo', '--help'])]\n"
        "    before = 'reflective_bench' in sys.modules\n"
        "    rc.append(main(['bench', '--help']))\n"
        "after = 'reflective_bench' in sys.modules\n"
        "print(json.dumps({'rc': rc, 'before': before, 'after': after}))\n"
    )
    assert _import_probe(code) == {"rc": [0, 0, 0], "before": False, "after": True}


@pytest.fixture
def no_benchmarks_on_path(monkeypatch):
    """`reflective_bench` neither imported nor on `sys.path` (as with an editable install)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != SHARED])
    monkeypatch.delitem(sys.modules, "reflective_bench", raising=False)


def test_bench_finds_the_benchmarks_beside_the_library(no_benchmarks_on_path) -> None:
    assert str(SHARED) not in sys.path
    assert cli._find_benchmarks()
    assert sys.path[-1] == str(SHARED)


def test_bench_without_the_benchmarks_exits_2_with_one_line(
    no_benchmarks_on_path, monkeypatch, tmp_path, capsys
) -> None:
    (tmp_path / "reflective_memory").mkdir()  # an installed library: nothing beside it
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "reflective_memory" / "cli.py"))
    assert main(["bench", "retrieval", "--help"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"error: {NO_BENCH}\n"
    assert NO_BENCH.startswith("benchmarks run from a source checkout of reflective-memory; ")
    assert str(tmp_path) not in sys.path


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"reflective-memory {__version__}"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["demo", "--k", "-1"], "--k: must be a positive integer"),
        (["demo", "--questions", "-1"], "--questions: must be a positive integer"),
        (["demo", "--questions", "0"], "--questions: must be a positive integer"),
        (["search", "q", "--user", "", "--db", "X"], "--user: must not be empty"),
        (["ingest", "MISSING.json", "--user", "u", "--db", "X"], "no such file"),
        (["search", "q", "--user", "u", "--db", "X"], "does not exist"),
        (["search", "   ", "--user", "u", "--db", "X"], "query: must not be empty"),
        (["stats", "--db", "X"], "does not exist"),
        (["redenoise", "--user", "u", "--db", "X"], "does not exist"),
        (["redenoise", "--rate", "2", "--user", "u", "--db", "X"], "--rate: must be a number"),
        (["search", "q", "--k", "0", "--user", "u", "--db", "X"], "--k: must be a positive"),
    ],
)
def test_bad_arguments_fail_at_once_and_create_nothing(
    argv, message, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 2.0  # no ingest, no model load
    err = capsys.readouterr().err
    assert message in err
    assert list(tmp_path.iterdir()) == []  # no store directory, nothing


def test_demo_with_a_bad_user_db_path_fails_before_work(tmp_path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["demo", "--db", str(f)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_read_only_commands_never_create_a_store(tmp_path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (
        ["search", "q", "--user", "u", "--db", str(empty)],
        ["stats", "--db", str(empty)],
        ["redenoise", "--user", "u", "--db", str(empty)],
        ["export", "--db", str(empty), "-o", str(tmp_path / "out.jsonl")],
        ["migrate", "--from", str(empty), "--to", "postgresql://nobody@127.0.0.1:1/x"],
    ):
        assert main(argv) == 2
        assert "holds no store" in capsys.readouterr().err
        assert list(empty.iterdir()) == []
    mistyped = tmp_path / "memroy"
    for argv in (
        ["search", "q", "--user", "u", "--db", str(mistyped)],
        ["stats", "--db", str(mistyped)],
        ["export", "--db", str(mistyped), "-o", str(tmp_path / "out.jsonl")],
        ["migrate", "--from", str(mistyped), "--to", "postgresql://nobody@127.0.0.1:1/x"],
    ):
        assert main(argv) == 2
        assert "does not exist" in capsys.readouterr().err
        assert not mistyped.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_search_unknown_user_exits_1_unless_allowed(store, capsys) -> None:
    assert main(["search", "dog", "--user", "bob", "--db", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no user 'bob'" in err and "'ana'" in err
    assert main(["search", "dog", "--user", "bob", "--db", str(store), "--allow-empty"]) == 0
    assert "no memories for user 'bob'" in capsys.readouterr().out
    assert main(["search", "dog", "--user", "ana", "--db", str(store), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and all(0.0 <= h["relevance"] <= 1.0 for h in hits)


def test_stats(store, capsys) -> None:
    assert main(["stats", "--db", str(store)]) == 0
    assert capsys.readouterr().out.startswith("ana: 2 turns, 1 sessions")
    assert main(["stats", "--db", str(store), "--user", "ana", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ana"]["turns"] == 2
    assert main(["stats", "--db", str(store), "--user", "zoe"]) == 1


def test_redenoise_llmlingua_without_a_model_is_an_error(store, capsys) -> None:
    with ReflectiveMemory(store, embedder=HashingEmbedder(128)) as mem:
        before = {m.id: (m.key, m.metadata.get("key_denoiser")) for m in mem.memories("ana")}
    t0 = time.perf_counter()
    code = main(["redenoise", "--user", "ana", "--db", str(store), "--denoiser", "llmlingua"])
    assert code == 2
    assert time.perf_counter() - t0 < 10.0  # no hub retries
    out = capsys.readouterr()
    assert "re-keyed" not in out.out
    assert out.err.startswith("error: ") and out.err.count("\n") == 1
    assert "not on this machine" in out.err and "Traceback" not in out.err
    with ReflectiveMemory(store, embedder=HashingEmbedder(128)) as mem:
        after = {m.id: (m.key, m.metadata.get("key_denoiser")) for m in mem.memories("ana")}
    assert after == before


def test_engine_redenoise_raises_when_the_denoiser_fails(tmp_path) -> None:
    class Broken:
        name = "broken"

        def denoise(self, texts):
            raise RuntimeError("boom")

    with ReflectiveMemory(tmp_path / "db", embedder=HashingEmbedder(64), denoiser="none") as mem:
        mem.add_turn("ana", "s1", "user", "I moved to Berlin with my dog Pixel.")
        mem.end_session("ana", "s1")
        keys = [m.key for m in mem.memories("ana")]
        mem.denoiser = Broken()
        with pytest.raises(Exception, match="denoiser broken failed: RuntimeError: boom"):
            mem.redenoise("ana")
        assert [m.key for m in mem.memories("ana")] == keys


def test_demo_export_writes_the_bundled_conversation(tmp_path, capsys) -> None:
    out = tmp_path / "conv.json"
    assert main(["demo", "--export", str(out)]) == 0
    conv = load_conversations(out)[0]
    assert conv.user_id == "maya" and len(conv.sessions) == 7 and conv.questions
    assert main(["demo", "--export", str(tmp_path / "no-such-dir" / "x.json")]) == 2


def test_demo_header_and_question_count(hashing, capsys) -> None:
    assert main(["demo", "--quiet", "--questions", "2", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "of maya's conversations" in out and "''s" not in out
    assert out.count("Q: ") == 2 and "relevance=" in out
    assert out.strip().splitlines()[-1].endswith("in the top 2 passages packed into 300 tokens.")


def test_search_and_stats_load_no_torch(tmp_path: Path) -> None:
    db = tmp_path / "db"
    with ReflectiveMemory(db, embedder=NumpyMiniLM()) as mem:  # the default model's vectors
        mem.add_turn("ana", "s1", "user", "I moved to Berlin with my dog Pixel.")
        mem.add_turn("ana", "s1", "assistant", "Welcome to Berlin!")
        mem.end_session("ana", "s1")
    code = (
        "import contextlib, io, json, sys\n"
        "from reflective_memory.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = [main(['search', '--db', {str(db)!r}, '--user', 'ana', 'Berlin move']),\n"
        f"          main(['stats', '--db', {str(db)!r}])]\n"
        f"heavy = [m for m in {MODEL!r} if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy, 'out': out.getvalue()}))\n"
    )
    res = _import_probe(code)
    assert res["rc"] == [0, 0]
    assert res["heavy"] == []
    assert "relevance=" in res["out"] and "Berlin" in res["out"]


def test_importing_the_engine_loads_no_torch() -> None:
    code = (
        "import json, sys\n"
        "import reflective_memory.engine\n"
        f"print(json.dumps([m for m in {MODEL!r} if m in sys.modules]))\n"
    )
    assert _import_probe(code) == []


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """`(command path, action)` of every argument of every command (`bench`'s are its own)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "bench":
                    yield from _options(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, action


def test_every_option_has_help_that_says_its_default(capsys) -> None:
    """Issue 49: `search --k` / `demo --k` showed no default, `migrate` / `segment` no help."""
    checked = 0
    for path, action in _options(cli.build_parser(define=["segment"])):
        name = " ".join([*path, *action.option_strings[-1:]]) or action.dest
        assert action.help, f"{name} has no help"
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in action.help, f"{name}: its help does not say its default"
        checked += 1
    assert checked > 60
    for argv, said in (
        (["search", "--help"], "number of hits (default 5)"),
        (["demo", "--help"], "passages shown per question (default 3)"),
        (["migrate", "--help"], "--from DIR"),
        (["segment", "--help"], ".jsonl"),
    ):
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert said in out, (argv, out)


def test_segment_reads_a_jsonl_chat_log(tmp_path, capsys) -> None:
    rows = [
        {"role": "human", "content": f"Question {i} about my garden.", "timestamp": when}
        for i, when in enumerate(["2025-03-01T09:00:00", "2025-03-01T09:05:00"])
    ]
    rows.append({"role": "ai", "content": "Water it early.", "timestamp": "2025-03-03T10:00:00"})
    path = tmp_path / "garden.jsonl"
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    argv = ["segment", str(path), "--embedder", "hashing", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    got = [(s["session_id"], len(s["segments"])) for s in json.loads(capsys.readouterr().out)]
    assert got == [("garden", 1), ("garden-2", 1)]  # two days apart: two sessions
    assert main([*argv, "--session-gap", "none"]) == 0
    assert [s["session_id"] for s in json.loads(capsys.readouterr().out)] == ["garden"]
