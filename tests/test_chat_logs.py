"""The chat logs people have (issue 41): JSON Lines, OpenAI, LangChain and LlamaIndex messages.

Each layout is read from a realistic file (the LangChain and LlamaIndex ones written by the
frameworks themselves), ingested by the CLI, and found again in an `export`; each malformed
kind exits 2 with one line naming the file and the line or position, writing nothing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, InvalidInputError, ReflectiveMemory
from reflective_memory.cli import main
from reflective_memory.errors import InvalidFileError
from reflective_memory.io import load_conversations

CLAIRE = [
    {"role": "system", "content": "You are a helpful assistant.", "session_id": "march"},
    {
        "role": "user",
        "name": "Claire",
        "content": "I adopted a beagle called Pixel.",
        "timestamp": "2025-03-01T09:30:00",
        "session_id": "march",
    },
    {
        "role": "assistant",
        "content": "Pixel is a lovely name!",
        "timestamp": "2025-03-01T09:30:05",
        "session_id": "march",
    },
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}], "session_id": "march"},
    {
        "role": "user",
        "content": "Pixel chewed my red sneakers.",
        "created_at": 1743500000,
        "session_id": "april",
    },
]


@pytest.fixture(autouse=True)
def _hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    import reflective_memory.engine as engine_mod

    monkeypatch.setattr(engine_mod, "default_embedder", lambda: HashingEmbedder(64))


def _jsonl(path: Path, rows: list[object], *, blank: bool = True) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank:
        lines.insert(2, "")  # a blank line is allowed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _turns(convs) -> list[tuple[str, str, str, str, object]]:
    return [
        (c.user_id, s.session_id, t["role"], t["text"], t["timestamp"])
        for c in convs
        for s in c.sessions
        for t in s.turns
    ]


def test_jsonl_messages_with_names_times_and_sessions(tmp_path) -> None:
    path = _jsonl(tmp_path / "claire.jsonl", CLAIRE)
    assert _turns(load_conversations(path, default_user="claire")) == [
        ("claire", "march", "system", "You are a helpful assistant.", None),
        ("claire", "march", "Claire", "I adopted a beagle called Pixel.", "2025-03-01T09:30:00"),
        ("claire", "march", "assistant", "Pixel is a lovely name!", "2025-03-01T09:30:05"),
        ("claire", "april", "user", "Pixel chewed my red sneakers.", 1743500000),
    ]


def test_jsonl_is_told_by_shape_and_read_gzipped(tmp_path) -> None:
    rows = [{k: v for k, v in m.items() if k != "session_id"} for m in CLAIRE]
    plain = _jsonl(tmp_path / "claire.txt", rows, blank=False)
    (conv,) = load_conversations(plain, default_user="u")
    # no session ids: March and April are a month apart, two sessions (the default gap)
    assert [s.session_id for s in conv.sessions] == ["claire", "claire-2"] and conv.n_turns == 4
    packed = tmp_path / "claire.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert _turns(load_conversations(packed, default_user="u")) == _turns([conv])


def test_session_gap_cuts_a_log_without_session_ids(tmp_path) -> None:
    rows = [
        {"role": "user", "content": f"message {i}", "timestamp": f"2025-03-0{day}T{hour:02d}:00:00"}
        for i, (day, hour) in enumerate([(1, 10), (1, 11), (2, 9), (2, 10), (5, 8)])
    ]
    rows.insert(3, {"role": "assistant", "content": "no time: stays in its session"})
    path = _jsonl(tmp_path / "log.jsonl", rows)
    (conv,) = load_conversations(path, default_user="u", session_gap=6 * 3600)
    assert [(s.session_id, len(s.turns)) for s in conv.sessions] == [
        ("log", 2),
        ("log-2", 3),
        ("log-3", 1),
    ]
    (conv,) = load_conversations(path, default_user="u", session_gap=None)
    assert [(s.session_id, len(s.turns)) for s in conv.sessions] == [("log", 6)]
    with pytest.raises(InvalidInputError, match="session_gap"):
        load_conversations(path, default_user="u", session_gap=0)


def test_openai_messages_object_bare_list_and_fine_tuning_lines(tmp_path) -> None:
    parts = [{"type": "text", "text": "Here is my dog."}, {"type": "image_url", "image_url": {}}]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": "What a cute beagle."},
    ]
    obj = tmp_path / "openai.json"
    obj.write_text(json.dumps({"messages": messages, "session_id": "s9", "model": "gpt-4o"}))
    assert _turns(load_conversations(obj, default_user="u")) == [
        ("u", "s9", "user", "Here is my dog.", None),
        ("u", "s9", "assistant", "What a cute beagle.", None),
    ]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(messages, indent=2))
    assert [s.session_id for s in load_conversations(bare, "u")[0].sessions] == ["bare"]
    tuning = _jsonl(tmp_path / "train.jsonl", [{"messages": messages}] * 3, blank=False)
    (conv,) = load_conversations(tuning, default_user="u")
    assert [s.session_id for s in conv.sessions] == ["train-1", "train-2", "train-3"]
    many = tmp_path / "many.json"
    many.write_text(json.dumps([{"messages": messages, "user_id": "ana"}, {"messages": messages}]))
    got = [(c.user_id, [s.session_id for s in c.sessions]) for c in load_conversations(many, "u")]
    assert got == [("ana", ["many-1"]), ("u", ["many-2"])]


def test_langchain_messages_to_dict(tmp_path) -> None:
    messages = pytest.importorskip("langchain_core.messages")
    history = [
        messages.SystemMessage("Be brief."),
        messages.HumanMessage(
            "My sister Lea moved to Porto.",
            name="Claire",
            additional_kwargs={"timestamp": "2025-05-02T18:00:00"},
        ),
        messages.AIMessage("Porto is beautiful.", tool_calls=[]),
        messages.AIMessage("", tool_calls=[{"name": "x", "args": {}, "id": "1"}]),
        messages.ToolMessage("done", tool_call_id="1"),
        messages.ChatMessage("Hello from the bot.", role="narrator"),
    ]
    path = tmp_path / "lc.json"
    path.write_text(json.dumps(messages.messages_to_dict(history)))
    expected = [
        ("u", "lc", "system", "Be brief.", None),
        ("u", "lc", "Claire", "My sister Lea moved to Porto.", "2025-05-02T18:00:00"),
        ("u", "lc", "assistant", "Porto is beautiful.", None),
        ("u", "lc", "tool", "done", None),
        ("u", "lc", "narrator", "Hello from the bot.", None),
    ]
    assert _turns(load_conversations(path, default_user="u")) == expected
    dumps = tmp_path / "lc.jsonl"
    _jsonl(dumps, [m.model_dump() for m in history], blank=False)
    got = _turns(load_conversations(dumps, default_user="u"))
    assert got == [(u, "lc", r, t, w) for u, _, r, t, w in expected]


def test_llamaindex_chat_message_dumps(tmp_path) -> None:
    llms = pytest.importorskip("llama_index.core.llms")
    history = [
        llms.ChatMessage(role="user", content="I run the Lyon marathon in October.",
                         additional_kwargs={"timestamp": "2025-06-01T07:00:00"}),
        llms.ChatMessage(role="assistant", content="Good luck with the training!"),
    ]  # fmt: skip
    path = tmp_path / "li.json"
    path.write_text(json.dumps([m.model_dump(mode="json") for m in history]))
    assert _turns(load_conversations(path, default_user="u")) == [
        ("u", "li", "user", "I run the Lyon marathon in October.", "2025-06-01T07:00:00"),
        ("u", "li", "assistant", "Good luck with the training!", None),
    ]


def test_ingest_then_export_round_trip(tmp_path, capsys) -> None:
    path = _jsonl(tmp_path / "claire.jsonl", CLAIRE)
    db = tmp_path / "memory"
    assert main(["ingest", str(path), "--user", "claire", "--db", str(db), "--quiet"]) == 0
    assert "claire: 4 turns" in capsys.readouterr().out
    assert main(["ingest", str(path), "--user", "claire", "--db", str(db), "--quiet"]) == 0
    assert "4 already stored, skipped" in capsys.readouterr().out
    with ReflectiveMemory(db) as mem:
        stored = [(t.session_id, t.role, t.text) for t in mem.turns("claire")]
    assert sorted(stored) == sorted(
        (s, r, t) for _, s, r, t, _ in _turns(load_conversations(path, default_user="claire"))
    )
    out = tmp_path / "export.jsonl"
    assert main(["export", "--db", str(db), "-o", str(out)]) == 0, capsys.readouterr().err
    exported = out.read_text("utf-8")
    for _, _, text in stored:
        assert json.dumps(text)[1:-1] in exported


def test_the_docs_example(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    lines = [
        '{"role": "user", "content": "I adopted a beagle called Pixel.", '
        '"timestamp": "2025-03-01T09:30:00"}',
        '{"role": "assistant", "content": "Lovely name!"}',
    ]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text("utf-8")
    assert all(line in doc for line in lines)
    Path("claire.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["ingest", "claire.jsonl", "--user", "claire", "--db", "./memory", "--quiet"]) == 0
    assert "claire: 2 turns" in capsys.readouterr().out


BAD = [
    ("bad-json-line", "claire.jsonl", b'{"role": "user", "content": "hi"}\n{"role": "user"\n',
     "line 2: is not valid JSON"),
    ("not-a-message", "claire.jsonl", b'{"role": "user", "content": "hi"}\n{"speaker": "x"}\n',
     "line 2: is not a message"),
    ("content-int", "log.json", b'[{"role": "user", "content": 5}]',
     "[0].content: must be a string or a list, got an integer"),
    ("bad-role", "log.json", b'[{"role": "us:er", "content": "hi"}]', "[0].role: role"),
    ("langchain-type", "lc.jsonl",
     b'{"type": "human", "data": {"content": "hi"}}\n{"type": "robot", "data": {"content": "x"}}\n',
     "line 2.type: unknown LangChain message type 'robot'"),
    ("langchain-data", "lc.json", b'[{"type": "human", "data": "hi"}]',
     "[0].data: must be an object, got a string"),
    ("llamaindex-blocks", "li.json", b'[{"role": "user", "blocks": "hi", "additional_kwargs": {}}]',
     "[0].blocks: must be a list, got a string"),
    ("bad-time", "claire.jsonl", b'{"role": "user", "content": "hi", "timestamp": "soon"}\n{}\n',
     "line 1.timestamp"),
    ("empty", "claire.jsonl", b'{"role": "user", "content": ""}\n{"role": "ai", "content": " "}\n',
     "holds no message with text"),
    ("messages-not-list", "o.json", b'{"messages": {"role": "user"}}',
     "messages: must be a list, got an object"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "filename", "data", "said"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_chat_log_exits_2_with_one_line(
    tmp_path, capsys, name: str, filename: str, data: bytes, said: str
) -> None:
    path = tmp_path / filename
    path.write_bytes(data)
    db = tmp_path / "store"
    capsys.readouterr()
    rc = main(["ingest", str(path), "--user", "u", "--db", str(db), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(path) in err and said in err, err
    assert not db.exists()  # nothing written


def test_a_log_without_users_needs_a_default(tmp_path) -> None:
    path = _jsonl(tmp_path / "claire.jsonl", CLAIRE)
    with pytest.raises(InvalidFileError, match="no default user"):
        load_conversations(path)


def test_session_gap_flag(tmp_path, capsys) -> None:
    rows = [
        {"role": "user", "content": "morning", "timestamp": "2025-03-01T08:00:00"},
        {"role": "user", "content": "evening", "timestamp": "2025-03-01T20:00:00"},
    ]
    path = _jsonl(tmp_path / "day.jsonl", rows, blank=False)
    db = tmp_path / "memory"
    argv = ["ingest", str(path), "--user", "u", "--db", str(db), "--quiet", "--session-gap", "60"]
    assert main(argv) == 0, capsys.readouterr().err
    with ReflectiveMemory(db) as mem:
        assert sorted({t.session_id for t in mem.turns("u")}) == ["day", "day-2"]
    one = tmp_path / "one"
    assert main([*argv[:5], str(one), "--quiet", "--session-gap", "720"]) == 0
    with ReflectiveMemory(one) as mem:  # twelve hours apart: one session at 720 minutes
        assert sorted({t.session_id for t in mem.turns("u")}) == ["day"]
    assert main([*argv[:-1], "-1"]) == 2
    assert "--session-gap" in capsys.readouterr().err
