"""Role aliases (issue 49): `human`, `ai`, `User`, `Assistant`, `bot`, `model` are the two sides.

Every surface stores them as `user` / `assistant` (`validation.ROLE_ALIASES`): `add_turn` and
`add_turns`, conversation files and chat logs, MCP `remember`, and the adapters (through
`add_turn`). A speaker's name (`Kate`) and `system` / `tool` turns are stored as given.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.cli import main
from reflective_memory.io import Conversation, SessionData, ingest_conversations, load_conversations
from reflective_memory.retrieval.speakers import speaker_of
from reflective_memory.validation import ROLE_ALIASES, canonical_role, role_or

#: Each alias in the cases people write it, and the role it is stored as.
ALIASES = [
    ("user", "user"),
    ("User", "user"),
    ("USER", "user"),
    ("human", "user"),
    ("Human", "user"),
    ("assistant", "assistant"),
    ("Assistant", "assistant"),
    ("ai", "assistant"),
    ("AI", "assistant"),
    ("bot", "assistant"),
    ("Bot", "assistant"),
    ("model", "assistant"),
    ("Model", "assistant"),
    ("chatbot", "assistant"),
]
#: Labels that are no alias: stored exactly as given.
KEPT = ["Kate", "system", "tool", "Narrator", "users", "AI assistant"]


@pytest.fixture
def mem():
    with ReflectiveMemory(embedder=HashingEmbedder(64)) as m:
        yield m


@pytest.fixture(autouse=True)
def _hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    import reflective_memory.engine as engine_mod

    monkeypatch.setattr(engine_mod, "default_embedder", lambda: HashingEmbedder(64))


def test_the_aliases_are_the_documented_ones() -> None:
    assert {a.casefold() for a, _ in ALIASES} == set(ROLE_ALIASES)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text("utf-8")
    assert all(f"`{alias}`" in doc for alias in ROLE_ALIASES)
    assert [canonical_role(k) for k in KEPT] == KEPT


@pytest.mark.parametrize(("alias", "role"), ALIASES)
def test_add_turn_stores_an_alias_as_its_role(mem, alias: str, role: str) -> None:
    turn = mem.add_turn("ana", "s1", alias, "I live in Lisbon.")
    assert turn.role == role and [t.role for t in mem.turns("ana")] == [role]


def test_add_turns_and_other_labels(mem) -> None:
    rows = [{"user_id": "ana", "session_id": "s1", "role": r, "text": f"said by {r}"} for r in KEPT]
    rows += [{"user_id": "ana", "session_id": "s1", "role": a, "text": "hi"} for a, _ in ALIASES]
    stored = mem.add_turns(rows)
    assert [t.role for t in stored] == KEPT + [role for _, role in ALIASES]


def test_a_named_chat_role_turn_still_names_its_speaker(mem) -> None:
    turn = mem.add_turn("ana", "s1", "Bot", "Kate: see you at eight")
    assert turn.role == "assistant" and speaker_of(turn) == "Kate"


def test_a_resent_turn_stored_with_an_alias_is_no_conflict(mem) -> None:
    """An older version stored `Human` as given: re-sending the turn stores nothing."""
    (old,) = mem.store.add_turns(
        [{"user_id": "ana", "session_id": "s1", "role": "Human", "text": "hi", "turn_id": "t1",
          "timestamp": None}]
    )  # fmt: skip
    again = mem.add_turn("ana", "s1", "Human", "hi", turn_id="t1")
    assert again.role == "Human" and len(mem.turns("ana")) == 1
    conv = Conversation("ana", [SessionData("s1", [{"role": "human", "text": "hi"}])])
    report = ingest_conversations(mem, [conv], progress=False)
    assert report.added == {"ana": 0} and report.skipped == {"ana": 1}


def test_jsonl_ingest_maps_every_alias(tmp_path: Path, capsys) -> None:
    rows = [{"role": a, "content": f"message {i}"} for i, (a, _) in enumerate(ALIASES)]
    rows += [{"role": r, "content": f"from {r}"} for r in KEPT]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    expected = [role for _, role in ALIASES] + KEPT
    (conv,) = load_conversations(path, default_user="ana")
    assert [t["role"] for s in conv.sessions for t in s.turns] == expected
    db = tmp_path / "memory"
    assert main(["ingest", str(path), "--user", "ana", "--db", str(db), "--quiet"]) == 0
    capsys.readouterr()
    with ReflectiveMemory(db) as stored:
        assert [t.role for t in stored.turns("ana")] == expected


def test_our_json_schema_maps_aliases(tmp_path: Path) -> None:
    path = tmp_path / "conv.json"
    turns = [{"role": "Human", "text": "I moved."}, {"role": "AI", "text": "Where to?"}]
    path.write_text(json.dumps({"format": "reflective-memory/v1", "sessions": [{"turns": turns}]}))
    (conv,) = load_conversations(path, default_user="ana")
    assert [t["role"] for t in conv.sessions[0].turns] == ["user", "assistant"]


def test_langchain_names_and_chat_roles(tmp_path: Path) -> None:
    messages = pytest.importorskip("langchain_core.messages")
    history = [
        messages.ChatMessage("I moved to Porto.", role="User"),
        messages.ChatMessage("Nice!", role="Bot"),
        messages.HumanMessage("Hello.", name="Bot"),  # a name that is an alias names no one
        messages.HumanMessage("Hi, I am Kate.", name="Kate"),
        messages.AIMessage("Welcome.", name="assistant"),
    ]
    path = tmp_path / "lc.json"
    path.write_text(json.dumps(messages.messages_to_dict(history)))
    (conv,) = load_conversations(path, default_user="ana")
    roles = [t["role"] for s in conv.sessions for t in s.turns]
    assert roles == ["user", "assistant", "user", "Kate", "assistant"]
    assert role_or("Model", "user") == "user" and role_or("Kate", "assistant") == "Kate"


def test_mcp_remember_maps_aliases(mem) -> None:
    pytest.importorskip("mcp")
    from reflective_memory.serve.mcp import build_server

    server = build_server(mem, lambda ctx: "ana")
    turns = [{"role": a, "text": f"message {i}"} for i, (a, _) in enumerate(ALIASES)]
    turns.append({"role": "Kate", "text": "I am Kate."})
    result = asyncio.run(server.call_tool("remember", {"session_id": "s1", "turns": turns}))
    assert not getattr(result, "isError", False), result
    assert [t.role for t in mem.turns("ana")] == [role for _, role in ALIASES] + ["Kate"]
