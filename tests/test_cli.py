from __future__ import annotations

import json

import pytest
from reflective_memory.cli import build_parser, main


def test_every_command_has_help(capsys) -> None:
    for argv in (
        ["--help"],
        ["demo", "--help"],
        ["ingest", "--help"],
        ["search", "--help"],
        ["bench", "--help"],
        ["bench", "retrieval", "--help"],
    ):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 0
        assert "usage: reflective-memory" in capsys.readouterr().out


def test_errors_are_reported_not_raised(tmp_path, capsys) -> None:
    rc = main(["ingest", str(tmp_path / "missing.json"), "--user", "u", "--db", str(tmp_path)])
    assert rc == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.integration
def test_ingest_then_search_json(tmp_path, capsys) -> None:
    data = {
        "format": "reflective-memory/v1",
        "sessions": [
            {
                "session_id": "s1",
                "date": "2024-02-01T10:00:00",
                "turns": [
                    {"role": "user", "text": "I adopted a grey cat called Miso.", "turn_id": "a"},
                    {"role": "assistant", "text": "Miso is a lovely name!", "turn_id": "b"},
                ],
            },
            {
                "session_id": "s2",
                "date": "2024-01-03T10:00:00",  # the older: see issue 40 on present tense
                "turns": [{"role": "user", "text": "My brother lives in Toronto.", "turn_id": "c"}],
            },
        ],
    }
    f = tmp_path / "conv.json"
    f.write_text(json.dumps(data))
    db = str(tmp_path / "db")
    assert main(["ingest", str(f), "--user", "kim", "--db", db, "--quiet"]) == 0
    assert "kim: 3 turns" in capsys.readouterr().out
    assert main(["search", "what is my cat called?", "--user", "kim", "--db", db, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hits"][0]["turn_ids"][0] == "a"
    assert out["hits"][0]["session_id"] == "s1"


@pytest.mark.integration
def test_demo_runs_offline_and_finds_evidence(capsys) -> None:
    assert main(["demo", "--quiet", "--questions", "6"]) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 6
    assert "session=" in out and "turns=" in out and " ms]" in out
    found = int(out.strip().splitlines()[-1].split("/")[0])
    assert found >= 4


def test_ingesting_a_file_twice_adds_nothing_and_says_so(tmp_path, capsys) -> None:
    turns = [
        {"role": "user", "text": "I adopted a grey cat called Miso.", "timestamp": "2024-02-01"},
        {"role": "assistant", "text": "Lovely!", "timestamp": "2024-02-01T10:01:00"},
        {"role": "user", "text": "Ok.", "timestamp": None},
        {"role": "user", "text": "Ok.", "timestamp": None},
    ]
    data = {"format": "reflective-memory/v1", "sessions": [{"session_id": "s1", "turns": turns}]}
    f = tmp_path / "conv.json"
    f.write_text(json.dumps(data))
    db = str(tmp_path / "db")
    assert main(["ingest", str(f), "--user", "kim", "--db", db, "--quiet"]) == 0
    first = capsys.readouterr().out
    assert "kim: 4 turns ->" in first and "skipped" not in first
    assert main(["ingest", str(f), "--user", "kim", "--db", db, "--quiet"]) == 0
    assert "kim: 0 turns (4 already stored, skipped)" in capsys.readouterr().out

    turns.append({"role": "user", "text": "Ok.", "timestamp": None})  # said a third time: new
    f.write_text(json.dumps(data))
    assert main(["ingest", str(f), "--user", "kim", "--db", db, "--quiet"]) == 0
    assert "kim: 1 turns (4 already stored, skipped)" in capsys.readouterr().out

    from reflective_memory import ReflectiveMemory

    with ReflectiveMemory(path=db) as mem:
        assert [t.text for t in mem.turns("kim", "s1")].count("Ok.") == 3
        assert len(mem.turns("kim", "s1")) == 5


def test_search_now_resolves_relative_times(tmp_path, capsys) -> None:
    """`search --now` is when the question is asked ("two weeks ago"); a bad one is refused."""
    from unittest import mock

    from reflective_memory import HashingEmbedder
    from reflective_memory.testing.surfaces import COOKING

    data = {
        "format": "reflective-memory/v1",
        "sessions": [
            {"session_id": f"s{i}", "turns": [{"role": "user", "text": t, "timestamp": str(when)}]}
            for i, (when, t, _) in enumerate(COOKING)
        ],
    }
    f = tmp_path / "conv.json"
    f.write_text(json.dumps(data))
    db = str(tmp_path / "db")
    with mock.patch("reflective_memory.engine.default_embedder", lambda: HashingEmbedder(256)):
        assert main(["ingest", str(f), "--user", "kim", "--db", db, "--quiet"]) == 0
    capsys.readouterr()
    ask = ["search", "What did I cook two weeks ago?", "--user", "kim", "--db", db, "--json"]
    assert main(ask) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["session_id"] == "s2"  # 4 May - 2 weeks
    assert main([*ask, "--now", "2025-04-20T12:00:00"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hits"][0]["session_id"] == "s1"  # 20 April - 2 weeks: the curry
    assert out["diagnostics"]["time_frame"]["start"].startswith("2025-04-03")
    assert main([*ask, "--now", "the other day"]) == 2
    assert "argument --now: timestamp 'the other day' is in no known format" in (
        capsys.readouterr().err
    )


def test_weights_shows_each_gate_in_standard_errors(tmp_path, capsys) -> None:
    """`weights` says whether what citations taught ranks, and how far it is from the gate."""
    from unittest import mock

    from reflective_memory import HashingEmbedder, ReflectiveMemory
    from reflective_memory.rmm.turn_learning import GATE_SIGMAS

    db = tmp_path / "db"
    with ReflectiveMemory(db, embedder=HashingEmbedder(256)) as mem:
        for i, text in enumerate(["I grow tomatoes on the balcony.", "My bike is blue."]):
            mem.add_turn("kim", f"s{i}", "user", text)
        r = mem.retrieve("kim", "What do I grow?", budget_tokens=200)
        mem.feedback(r, cited=[0])
        want = mem.ranker_weights("kim")
    with mock.patch("reflective_memory.engine.default_embedder", lambda: HashingEmbedder(256)):
        assert main(["weights", "--db", str(db), "--user", "kim"]) == 0
    out = capsys.readouterr().out
    for label, gate in (("all users", want["shared_gate"]), ("this user", want["user_gate"])):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"what {label} taught"))
        assert f"over {gate['judged']} judged episodes ({gate['t']:+.2f} standard errors" in line
        assert f"ranks above {GATE_SIGMAS})" in line
