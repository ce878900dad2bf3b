"""Logs as people have them (issue 49): session ids wherever the formats keep them, gaps by default.

LangChain `messages_to_dict` dumps keep a session id in `data` (an extra field of the message) or
in `data.additional_kwargs` / `data.response_metadata`; LlamaIndex in `additional_kwargs`; OpenAI
in `metadata` (or the Assistants API's `thread_id`). The dumps here are written by the frameworks
themselves. A log without ids is cut into sessions at silences longer than
`sessions.idle_seconds` (the measured default, docs/cli.md), `--session-gap` overrides it, and a
log without times is one session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.chatlog import MESSAGE_FIELDS
from reflective_memory.cli import main
from reflective_memory.errors import InvalidFileError
from reflective_memory.io import load_conversations
from reflective_memory.sessions.config import SessionConfig

#: Two sessions five months apart: the user lived in Lisbon, then moved to Porto.
LISBON = [
    ("user", "Hi! I live in Lisbon, in a small flat in Alfama.", "2025-01-12T09:00:00"),
    ("assistant", "Lisbon is lovely. How do you like living in Alfama?", "2025-01-12T09:00:20"),
    ("user", "The trams are loud, but the view over the river is worth it.", "2025-01-12T09:02:00"),
    ("assistant", "That view is hard to beat.", "2025-01-12T09:02:15"),
    ("user", "Can you suggest a bakery for pastel de nata?", "2025-01-12T09:05:00"),
    ("assistant", "Try the old bakery in Belém; go early.", "2025-01-12T09:05:30"),
]
PORTO = [
    ("user", "Big news: I moved to Porto last week. My flat is in Bonfim.", "2025-06-03T18:00:00"),
    ("assistant", "Congratulations on the move to Porto!", "2025-06-03T18:00:20"),
    ("user", "Could you recommend a running route along the Douro?", "2025-06-03T18:03:00"),
    ("assistant", "Run from Ribeira to Foz along the river.", "2025-06-03T18:03:30"),
]
#: Where a LangChain message may carry its session id: `messages_to_dict` writes each under `data`.
LANGCHAIN_PLACES = ["field", "additional_kwargs", "response_metadata"]


@pytest.fixture(autouse=True)
def _hashing(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("integration") is None:
        import reflective_memory.engine as engine_mod

        monkeypatch.setattr(engine_mod, "default_embedder", lambda: HashingEmbedder(64))


def _sessions(convs) -> list[tuple[str, list[str]]]:
    return [(s.session_id, [t["text"] for t in s.turns]) for c in convs for s in c.sessions]


def _langchain_dump(place: str, *, times: bool = True) -> list[dict[str, Any]]:
    """`messages_to_dict` of the two sessions, each message's session id kept at `place`."""
    messages = pytest.importorskip("langchain_core.messages")
    history = []
    for sid, turns in (("lisbon-chat", LISBON), ("porto-chat", PORTO)):
        for n, (role, text, when) in enumerate(turns):
            kwargs: dict[str, Any] = {"id": f"{sid}-msg-{n}"}  # the message's own id
            extra = {"timestamp": when} if times else {}
            if place == "field":
                kwargs["session_id"] = sid  # an extra field: BaseMessage allows them
            elif place == "additional_kwargs":
                extra["session_id"] = sid
            else:
                kwargs["response_metadata"] = {"thread_id": sid}
            cls = messages.HumanMessage if role == "user" else messages.AIMessage
            history.append(cls(text, additional_kwargs=extra, **kwargs))
    return messages.messages_to_dict(history)


@pytest.mark.parametrize("place", LANGCHAIN_PLACES)
def test_langchain_session_ids_in_data_are_read(tmp_path: Path, place: str) -> None:
    path = tmp_path / "history.json"
    path.write_text(json.dumps(_langchain_dump(place)))
    for gap in (None, SessionConfig.idle_seconds):  # read from the ids, not from the gap
        got = _sessions(load_conversations(path, default_user="u", session_gap=gap))
        assert got == [
            ("lisbon-chat", [t for _, t, _ in LISBON]),
            ("porto-chat", [t for _, t, _ in PORTO]),
        ]


def test_langchain_message_ids_are_not_sessions(tmp_path: Path) -> None:
    """`data.id` is the message's own id: messages of one session keep their own ids."""
    dump = _langchain_dump("additional_kwargs", times=False)
    for m in dump:
        del m["data"]["additional_kwargs"]["session_id"]
    assert len({m["data"]["id"] for m in dump}) == len(dump)
    path = tmp_path / "history.json"
    path.write_text(json.dumps(dump))
    ((sid, texts),) = _sessions(load_conversations(path, default_user="u"))
    assert sid == "history" and len(texts) == len(LISBON) + len(PORTO)


def test_llamaindex_session_ids_in_additional_kwargs(tmp_path: Path) -> None:
    llms = pytest.importorskip("llama_index.core.llms")
    rows = []
    for sid, turns in (("lisbon-chat", LISBON), ("porto-chat", PORTO)):
        for role, text, when in turns:
            kwargs = {"session_id": sid, "timestamp": when, "user_id": "maria"}
            message = llms.ChatMessage(role=role, content=text, additional_kwargs=kwargs)
            rows.append(json.dumps(message.model_dump(mode="json")))
    path = tmp_path / "llama.jsonl"
    path.write_text("\n".join(rows) + "\n")
    (conv,) = load_conversations(path, default_user="someone-else", session_gap=None)
    assert conv.user_id == "maria"
    assert [(s.session_id, len(s.turns)) for s in conv.sessions] == [
        ("lisbon-chat", len(LISBON)),
        ("porto-chat", len(PORTO)),
    ]
    assert conv.sessions[1].turns[0]["timestamp"] == PORTO[0][2]


def test_openai_metadata_thread_ids_and_parts(tmp_path: Path) -> None:
    """Message `metadata`, a request's `metadata`, and Assistants API thread messages."""
    chat = [
        {"role": "user", "content": LISBON[0][1], "metadata": {"conversation_id": 41}},
        {"role": "assistant", "content": LISBON[1][1], "metadata": {"conversation_id": 41}},
        {"role": "user", "content": PORTO[0][1], "metadata": {"session_id": "june"}},
    ]
    path = tmp_path / "openai.jsonl"
    path.write_text("\n".join(map(json.dumps, chat)) + "\n")
    assert [s for s, _ in _sessions(load_conversations(path, "u"))] == ["41", "june"]
    request = {"metadata": {"session_id": "jan"}, "messages": chat[:2], "model": "gpt-4o"}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    assert [s for s, _ in _sessions(load_conversations(path, "u"))] == ["41"]  # its own first
    path.write_text(json.dumps({**request, "messages": [{"role": "user", "content": "hi"}]}))
    assert [s for s, _ in _sessions(load_conversations(path, "u"))] == ["jan"]
    thread = {  # GET /v1/threads/{id}/messages: `data` holds message objects
        "object": "thread.message",
        "thread_id": "thread_abc",
        "created_at": 1748973600,
        "role": "user",
        "content": [{"type": "text", "text": {"value": PORTO[0][1], "annotations": []}}],
        "metadata": {},
    }
    responses = {  # a Responses API input item
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": PORTO[1][1], "annotations": []}],
        "metadata": {"session_id": "thread_abc"},
    }
    path = tmp_path / "thread.json"
    path.write_text(json.dumps([thread, responses]))
    (conv,) = load_conversations(path, "u")
    assert _sessions([conv]) == [("thread_abc", [PORTO[0][1], PORTO[1][1]])]
    assert conv.sessions[0].turns[0]["timestamp"] == 1748973600


def test_the_accepted_keys_are_named_in_one_place() -> None:
    assert MESSAGE_FIELDS.nested == ("additional_kwargs", "response_metadata", "metadata")
    assert "thread_id" in MESSAGE_FIELDS.session and "timestamp" in MESSAGE_FIELDS.nested_time
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text("utf-8")
    for key in {*MESSAGE_FIELDS.nested, *MESSAGE_FIELDS.session, *MESSAGE_FIELDS.time}:
        assert f"`{key}`" in doc, key


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ({"role": "user", "content": "hi", "metadata": "june"}, "[0].metadata: must be an object"),
        (
            {"role": "user", "content": "hi", "metadata": {"session_id": ["a"]}},
            "[0].metadata.session_id: must be a string",
        ),
        (
            {"type": "human", "data": {"content": "hi", "additional_kwargs": {"user_id": ""}}},
            "[0].data.additional_kwargs.user_id",
        ),
    ],
)
def test_a_bad_id_names_where_it_is(tmp_path: Path, message: dict, said: str) -> None:
    path = tmp_path / "log.json"
    path.write_text(json.dumps([message]))
    with pytest.raises(InvalidFileError, match=f"log.json: {said}".replace("[", r"\[")):
        load_conversations(path, "u")


def _log(path: Path, turns) -> Path:
    """A JSON Lines log of `(role, text, time)` messages that name no session."""
    rows = [{"role": r, "content": t, "timestamp": w} for r, t, w in turns]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    return path


def test_a_log_without_ids_splits_at_long_gaps_by_default(tmp_path: Path) -> None:
    path = _log(tmp_path / "maria.jsonl", LISBON + PORTO)
    got = _sessions(load_conversations(path, default_user="u"))
    assert got == [("maria", [t for _, t, _ in LISBON]), ("maria-2", [t for _, t, _ in PORTO])]
    # the default is the live idle time: 31 minutes apart splits, 29 do not
    gaps = [("user", "a", "2025-03-01T10:00:00"), ("user", "b", "2025-03-01T10:29:00")]
    gaps += [("user", "c", "2025-03-01T11:00:00+00:00")]  # aware; naive times are read as UTC
    path = _log(tmp_path / "day.jsonl", gaps)
    assert [t for _, t in _sessions(load_conversations(path, "u"))] == [["a", "b"], ["c"]]
    one = load_conversations(path, "u", session_gap=3600.0)
    assert [t for _, t in _sessions(one)] == [["a", "b", "c"]]


def test_a_log_without_times_is_one_session(tmp_path: Path) -> None:
    path = tmp_path / "notimes.jsonl"
    rows = [{"role": r, "content": t} for r, t, _ in LISBON + PORTO]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    ((sid, texts),) = _sessions(load_conversations(path, "u"))
    assert sid == "notimes" and len(texts) == len(rows)


def test_conversation_objects_without_ids_split_too(tmp_path: Path) -> None:
    messages = [{"role": r, "content": t, "created_at": w} for r, t, w in LISBON + PORTO]
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"messages": messages}))
    assert [s for s, _ in _sessions(load_conversations(path, "u"))] == ["export", "export-2"]
    path.write_text(json.dumps({"messages": messages, "session_id": "all"}))  # named: one
    assert [s for s, _ in _sessions(load_conversations(path, "u"))] == ["all"]


@pytest.mark.parametrize(
    ("flag", "sessions"),
    [
        (None, ["maria", "maria-2"]),
        ("0", ["maria"]),
        ("none", ["maria"]),
        ("60", ["maria", "maria-2"]),
    ],
)
def test_the_cli_splits_by_default_and_session_gap_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str | None, sessions: list[str]
) -> None:
    path = _log(tmp_path / "maria.jsonl", LISBON + PORTO)
    db = tmp_path / "memory"
    argv = ["ingest", str(path), "--user", "maria", "--db", str(db), "--quiet"]
    assert main(argv + ([] if flag is None else ["--session-gap", flag])) == 0
    capsys.readouterr()
    with ReflectiveMemory(db) as mem:
        assert sorted({t.session_id for t in mem.turns("maria")}) == sessions


@pytest.mark.parametrize("flag", ["-5", "soon", "inf"])
def test_a_bad_session_gap_exits_2(tmp_path: Path, capsys, flag: str) -> None:
    path = _log(tmp_path / "maria.jsonl", LISBON)
    argv = ["ingest", str(path), "--user", "u", "--db", str(tmp_path / "m"), "--session-gap", flag]
    assert main(argv) == 2
    assert "--session-gap: must be a positive number of minutes, or 0 / none" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "m").exists()


@pytest.mark.integration
@pytest.mark.parametrize("place", ["field", "additional_kwargs"])
def test_a_langchain_dump_of_two_sessions_answers_with_the_new_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], place: str
) -> None:
    """The reported failure, on the real MiniLM: the dump was one session dated January."""
    path = tmp_path / "history.json"
    path.write_text(json.dumps(_langchain_dump(place)))
    db = tmp_path / "memory"
    assert main(["ingest", str(path), "--user", "maria", "--db", str(db), "--quiet"]) == 0
    capsys.readouterr()
    with ReflectiveMemory(db) as mem:
        for k in (1, 3):
            r = mem.retrieve("maria", "Where do I live now?", k=k)
            first = r.hits[0].memory
            assert "Porto" in first.text and first.session_id == "porto-chat", r.hits
            assert "2025-06-03" in first.text  # dated with its own session, not January
        dates = {
            s: sorted({t.timestamp.date().isoformat() for t in mem.turns("maria", s)})
            for s in ("lisbon-chat", "porto-chat")
        }
        assert dates == {"lisbon-chat": ["2025-01-12"], "porto-chat": ["2025-06-03"]}
