"""`reflective-memory mcp`: the SDK's own client against the server in a subprocess.

Over stdio (the client starts the server) and over streamable HTTP on loopback (a server on a
free port, tokens for two users): remember in one MCP session and recall in another, user
isolation by token, `feedback` on a recall (what it takes and refuses; what it teaches is the
feedback contract's, `tests/test_surface_feedback.py`), bad arguments as tool errors, bearer
tokens required, oversized bodies refused before they are read, and `langchain-mcp-adapters`
loading the tools. The subprocesses run this checkout's CLI with the hashing embedder
(`tests/hashing_cli.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.types import CallToolResult  # noqa: E402
from reflective_memory.cli import main  # noqa: E402
from reflective_memory.errors import ConfigError  # noqa: E402
from reflective_memory.memory_block import memory_block  # noqa: E402
from reflective_memory.serve.mcp import MAX_ANSWER_CHARS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / "tests" / "hashing_cli.py")
ANA = "ana-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
CAROL = "carol-token-0123456789abcdef"
LIMIT = 64 * 1024
TOOLS = {"remember", "recall", "feedback", "list_sessions", "end_session", "forget"}

PIXEL = [
    {"role": "user", "text": "My dog Pixel loves the beach.", "timestamp": "2024-03-01T10:00:00"},
    {"role": "assistant", "text": "Pixel sounds like a happy dog!"},
]


# -- clients -----------------------------------------------------------------------------------
def _stdio(db: Path | str, user: str = "ana") -> StdioServerParameters:
    """The stdio server of `user` over the store directory `db` or the PostgreSQL DSN `db`."""
    store = ["--dsn", db] if str(db).startswith("postgresql://") else ["--db", str(db)]
    return StdioServerParameters(command=sys.executable, args=[CLI, "mcp", *store, "--user", user])


async def _stdio_listed(
    db: Path | str, calls: list[tuple[str, dict[str, Any]]], user: str = "ana"
) -> tuple[Any, list[CallToolResult]]:
    """Start the stdio server, open one MCP session, list the tools, make the calls in order."""
    async with stdio_client(_stdio(db, user)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            return listed, [await session.call_tool(name, args) for name, args in calls]


async def _stdio_calls(
    db: Path | str, calls: list[tuple[str, dict[str, Any]]], user: str = "ana"
) -> list[CallToolResult]:
    """Start the stdio server, open one MCP session, make the calls in order."""
    return (await _stdio_listed(db, calls, user))[1]


async def _http_calls(
    url: str, token: str | None, calls: list[tuple[str, dict[str, Any]]]
) -> list[CallToolResult]:
    """One MCP session over streamable HTTP with `token`; the calls in order."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return [await session.call_tool(name, args) for name, args in calls]


def _ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


# -- stdio -------------------------------------------------------------------------------------
def test_stdio_remembers_in_one_session_and_recalls_in_another(tmp_path: Path) -> None:
    db = tmp_path / "db"
    first = asyncio.run(
        _stdio_calls(
            db,
            [
                ("remember", {"session_id": "s1", "turns": PIXEL, "end_session": True}),
                (
                    "remember",
                    {"session_id": "s2", "turns": [{"role": "Lena", "text": "I moved to Porto."}]},
                ),
                ("list_sessions", {}),
            ],
        )
    )
    done = _ok(first[0])
    assert done["turn_ids"] == ["s1:0", "s1:1"] and done["ended"] and done["memories"] > 0
    sessions = {s["session_id"]: s for s in _ok(first[2])["sessions"]}
    assert sessions["s1"]["status"] == "ended" and sessions["s1"]["turns"] == 2
    assert sessions["s2"]["status"] == "open"

    # a new server process and a new MCP session: the memory is in the store
    again = asyncio.run(
        _stdio_calls(
            db,
            [
                ("recall", {"query": "What is my dog called?"}),
                ("recall", {"query": "Where did Lena move?", "budget_tokens": 40}),
                ("list_sessions", {"status": "open"}),
            ],
        )
    )
    found = _ok(again[0])
    best = found["passages"][0]
    assert best["session_id"] == "s1" and best["turn_ids"][0] == "s1:0"
    assert best["date"] == "2024-03-01T10:00:00+00:00" and "Pixel" in best["text"]
    assert "2024-03-01" in _text(again[0])
    assert "s1" in [p["session_id"] for p in _ok(again[0])["passages"]]
    lena = _ok(again[1])["passages"]
    assert lena[0]["session_id"] == "s2" and "Lena: I moved to Porto." in lena[0]["text"]
    assert [s["session_id"] for s in _ok(again[2])["sessions"]] == ["s2"]


def test_recall_numbers_passages_from_zero_and_says_so(tmp_path: Path) -> None:
    """One citation numbering: [0] first, as the adapters, `format_memories` and `feedback`."""
    lena = [{"role": "Lena", "text": "I moved to Porto with my dog Pixel."}]

    calls = [
        ("remember", {"session_id": "s1", "turns": PIXEL}),
        ("remember", {"session_id": "s2", "turns": lena}),
        ("recall", {"query": "Pixel the dog"}),
    ]
    listed, (_, _, recalled) = asyncio.run(_stdio_listed(tmp_path / "db", calls))
    described = {t.name: t.description or "" for t in listed.tools}
    assert "numbered from [0]" in described["recall"]
    n = len(_ok(recalled)["passages"])
    assert n >= 2
    heads = [ln for ln in _text(recalled).splitlines() if not ln.startswith(" ")]
    assert [h.split(" ", 1)[0] for h in heads] == [f"[{i}]" for i in range(n)]
    # the text is the block every surface shows a model (memory_block), the sessions structured
    passages = _ok(recalled)["passages"]
    assert _text(recalled) == memory_block([p["text"] for p in passages], instruction=None)


LENA = [
    ("s1", "I live in Lyon near the old town."),
    ("s2", "I moved to Oslo last month."),
    ("s3", "My sister lives in Bergen."),
]


def _remember_lena() -> list[tuple[str, dict[str, Any]]]:
    """Three sessions, so that a question shows more than one passage."""
    return [
        ("remember", {"session_id": sid, "turns": [{"role": "user", "text": text}]})
        for sid, text in LENA
    ]


def test_stdio_feedback_answers_one_recall_once(tmp_path: Path) -> None:
    """`recall` gives a retrieval id; `feedback` with it teaches the user's ranker once."""
    asked = {"query": "Where do I live now?"}

    async def calls() -> dict[str, CallToolResult]:
        async with stdio_client(_stdio(tmp_path / "db")) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for name, args in _remember_lena():
                    await session.call_tool(name, args)
                out = {"first": await session.call_tool("recall", asked)}
                rid = _ok(out["first"])["retrieval_id"]
                for key, args in (
                    ("refused", {"retrieval_id": rid, "cited": [7]}),  # the recall still waits
                    ("both", {"retrieval_id": rid, "answer": "Oslo [0].", "cited": [0]}),
                    ("long", {"retrieval_id": rid, "answer": "a" * (MAX_ANSWER_CHARS + 1)}),
                    ("bare", {"retrieval_id": rid, "answer": "[0]"}),  # an answer, though JSON
                    ("again", {"retrieval_id": rid, "answer": "Oslo [0]."}),  # answered already
                ):
                    out[key] = await session.call_tool("feedback", args)
                out["second"] = await session.call_tool("recall", asked)
                rid = _ok(out["second"])["retrieval_id"]
                said = {"retrieval_id": rid, "answer": "You live in Oslo [0] (see also [9])."}
                out["learned"] = await session.call_tool("feedback", said)
                rid = _ok(await session.call_tool("recall", asked))["retrieval_id"]
                await session.call_tool("forget", {"session_id": "s3"})
                out["forgotten"] = await session.call_tool(
                    "feedback", {"retrieval_id": rid, "cited": []}
                )
                return out

    out = asyncio.run(calls())
    shown = len(_ok(out["first"])["passages"])
    assert shown >= 2
    refused = _text(out["refused"])
    assert out["refused"].isError and f"cited position 7 is not a hit (0..{shown - 1})" in refused
    assert out["both"].isError and "give either answer" in _text(out["both"])
    assert out["long"].isError and f"at most {MAX_ANSWER_CHARS} characters" in _text(out["long"])
    bare = _ok(out["bare"])
    assert bare["learned"] and bare["reason"] is None and bare["episodes"] == 1
    assert bare["cited"] == [0] and not bare["inferred"] and not bare["no_cite"]
    again = _text(out["again"])
    assert out["again"].isError and "no recall" in again and "one feedback" in again
    # one episode is learned, not yet proven: the next recall is scored as before (the gate)
    scores = [[p["score"] for p in _ok(out[k])["passages"]] for k in ("first", "second")]
    assert not bare["serving"] and scores[0] == scores[1]
    learned = _ok(out["learned"])
    assert learned["learned"] and learned["episodes"] == 2
    assert learned["cited"] == [0] and learned["out_of_range"] == 1
    assert out["forgotten"].isError and "no recall" in _text(out["forgotten"])


def test_read_only_tools_on_a_mistyped_db_create_nothing(tmp_path: Path) -> None:
    """recall, list_sessions, end_session and forget say there is no store; remember makes it."""
    db = tmp_path / "memroy"
    reads: list[tuple[str, dict[str, Any]]] = [
        ("recall", {"query": "What is my dog called?"}),
        ("list_sessions", {}),
        ("end_session", {"session_id": "s1"}),
        ("forget", {"everything": True, "confirm": "forget everything"}),
    ]

    async def calls() -> tuple[list[CallToolResult], bool, list[CallToolResult]]:
        async with stdio_client(_stdio(db)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                before = [await session.call_tool(name, args) for name, args in reads]
                existed = db.exists()
                after = [
                    await session.call_tool("remember", {"session_id": "s1", "turns": PIXEL}),
                    await session.call_tool("list_sessions", {}),
                ]
                return before, existed, after

    before, existed, after = asyncio.run(calls())
    for (name, _), result in zip(reads, before, strict=True):
        assert result.isError, name
        assert f"there is no store at {db}" in _text(result), (name, _text(result))
    assert not existed
    assert _ok(after[0])["turn_ids"] == ["s1:0", "s1:1"]
    assert [s["session_id"] for s in _ok(after[1])["sessions"]] == ["s1"]


def test_stdio_on_postgresql_remembers_and_recalls_per_user(pg_dsn: str) -> None:
    remember = {"session_id": "pg1", "turns": PIXEL, "end_session": True}
    (done,) = asyncio.run(_stdio_calls(pg_dsn, [("remember", remember)]))
    assert _ok(done)["memories"] > 0
    mine, theirs = (
        asyncio.run(_stdio_calls(pg_dsn, [("recall", {"query": "What is my dog called?"})], user))[
            0
        ]
        for user in ("ana", "bob")
    )
    assert _ok(mine)["passages"][0]["session_id"] == "pg1"
    assert _ok(theirs)["passages"] == []


def test_stdio_bad_arguments_are_tool_errors_and_the_server_goes_on(tmp_path: Path) -> None:
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("recall", {"query": "  "}, "query"),
        ("recall", {"query": "dog", "budget_tokens": 0}, "budget"),
        ("recall", {"query": "dog", "budget_tokens": "many"}, "budget_tokens"),
        ("recall", {"query": "dog", "now": "yesterday-ish"}, "now"),
        ("recall", {}, "query"),
        ("remember", {"session_id": "s1", "turns": []}, "turns"),
        ("remember", {"session_id": "", "turns": PIXEL}, "session_id"),
        ("remember", {"session_id": "s1", "turns": [{"role": "user"}]}, "text"),
        ("remember", {"session_id": "s1", "turns": [{**PIXEL[0], "user_id": "bob"}]}, "user_id"),
        ("remember", {"session_id": "s1", "turns": [{**PIXEL[0], "timestamp": "soon"}]}, "soon"),
        ("end_session", {"session_id": "nope"}, "nope"),
        ("forget", {}, "either session_id or everything"),
        ("forget", {"session_id": "s1", "everything": True}, "either"),
        ("forget", {"session_id": "nope"}, "nope"),
        ("list_sessions", {"status": "closed"}, "status"),
        ("feedback", {"retrieval_id": "nope", "answer": "[0]"}, "no recall 'nope' of this user"),
        ("feedback", {"retrieval_id": "nope"}, "give either answer"),
        ("feedback", {"retrieval_id": "", "cited": [0]}, "retrieval_id"),
        ("no_such_tool", {}, "no_such_tool"),
    ]
    calls = [(name, args) for name, args, _ in bad]
    first = ("remember", {"session_id": "s0", "turns": PIXEL})  # the store exists
    results = asyncio.run(
        _stdio_calls(
            tmp_path / "db", [first, *calls, ("remember", {"session_id": "s1", "turns": PIXEL})]
        )
    )[1:]
    for (name, args, says), result in zip(bad, results, strict=False):
        assert result.isError, (name, args, result)
        assert says in _text(result), (name, args, _text(result))
        assert "Traceback" not in _text(result)
    assert _ok(results[-1])["turn_ids"] == ["s1:0", "s1:1"]  # nothing bad was stored


COERCED: list[tuple[str, dict[str, Any], str]] = [
    *(
        ("forget", {"everything": value}, "everything: a JSON boolean")
        for value in ("true", "yes", "1", "on", 1)
    ),
    ("forget", {"everything": True}, "confirm='forget everything'"),
    ("forget", {"everything": True, "confirm": "true"}, "confirm='forget everything'"),
    ("forget", {"everything": True, "confirm": True}, "confirm"),
    ("forget", {"session_id": "s1", "everyting": True}, "everyting: unknown argument"),
    (
        "remember",
        {"session_id": "s1", "turns": PIXEL, "end_session": "yes"},
        "end_session: a JSON boolean",
    ),
    ("recall", {"query": "dog", "budget_tokens": "5"}, "budget_tokens: a JSON integer"),
    ("recall", {"query": "dog", "budget_tokens": True}, "budget_tokens: a JSON integer"),
    ("recall", {"query": "dog", "budget_tokens": 5.0}, "budget_tokens: a JSON integer"),
    ("list_sessions", {"status": "open", "user": "bob"}, "user: unknown argument"),
    ("feedback", {"retrieval_id": "r", "cited": [True]}, "cited.0: a JSON integer"),
    ("feedback", {"retrieval_id": "r", "cited": ["0"]}, "cited.0: a JSON integer"),
    ("remember", {"session_id": 7, "turns": PIXEL}, "session_id"),
]


def _check_no_coercion(results: list[CallToolResult]) -> None:
    """Every coerced call is an `isError` naming the argument; nothing was erased or ended."""
    for (name, args, says), result in zip(COERCED, results[1:], strict=False):
        assert result.isError, (name, args, result)
        assert says in _text(result), (name, args, _text(result))
    sessions = _ok(results[-1])["sessions"]
    assert [(s["session_id"], s["status"], s["turns"]) for s in sessions] == [("s1", "open", 2)]


def test_stdio_no_argument_is_coerced_and_nothing_is_erased(tmp_path: Path) -> None:
    """Issue 39 (1): "true", "yes", "1", "on", 1 for a boolean; "5" for an integer."""
    calls = [("remember", {"session_id": "s1", "turns": PIXEL})]
    calls += [(name, args) for name, args, _ in COERCED] + [("list_sessions", {})]
    _check_no_coercion(asyncio.run(_stdio_calls(tmp_path / "db", calls)))


def test_stdio_tools_publish_strict_schemas_and_forget_needs_its_confirmation(tmp_path) -> None:
    calls = [
        ("remember", {"session_id": "s1", "turns": PIXEL}),
        ("forget", {"everything": True, "confirm": "forget everything"}),
        ("list_sessions", {}),
    ]
    listed, (_, forgot, sessions) = asyncio.run(_stdio_listed(tmp_path / "db", calls))
    for tool in listed.tools:
        assert tool.inputSchema.get("additionalProperties") is False, tool.name
    forget = next(t for t in listed.tools if t.name == "forget")
    assert "forget everything" in forget.inputSchema["properties"]["confirm"]["description"]
    assert _ok(forgot) == {"scope": "user", "session_id": None, "turns": 2}
    assert _ok(sessions)["sessions"] == []


# -- streamable HTTP ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _http_server(tmp: Path, *options: str) -> Iterator[str]:
    """A live `reflective-memory mcp --transport http` for ana, bob and carol; its /mcp URL.

    On exit, the server's log must hold no traceback.
    """
    tokens = tmp / "tokens"
    # a BOM (as some editors write) and an inline comment: neither is part of a user or token
    tokens.write_text(f"\ufeff# MCP tokens\nbob={BOB}  # bob's laptop\ncarol={CAROL}\n")
    port = _free_port()
    argv = [sys.executable, CLI, "mcp", "--db", str(tmp / "db"), "--transport", "http"]
    argv += ["--port", str(port), "--token", f"ana={ANA}", "--tokens-file", str(tokens)]
    argv += ["--max-body-bytes", str(LIMIT), *options]
    log = (tmp / "server.log").open("w+")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, Path(log.name).read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
        assert "Traceback" not in Path(log.name).read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The HTTP server with its default options."""
    with _http_server(tmp_path_factory.mktemp("mcp-http")) as url:
        yield url


def test_http_remembers_in_one_session_and_recalls_in_another(http_url: str) -> None:
    (done,) = asyncio.run(
        _http_calls(
            http_url, ANA, [("remember", {"session_id": "h1", "turns": PIXEL, "end_session": True})]
        )
    )
    assert _ok(done)["ended"]
    recalled, sessions = asyncio.run(
        _http_calls(
            http_url,
            ANA,
            [("recall", {"query": "What is my dog called?"}), ("list_sessions", {})],
        )
    )
    best = _ok(recalled)["passages"][0]
    assert best["session_id"] == "h1" and "Pixel" in best["text"]
    assert best["date"] == "2024-03-01T10:00:00+00:00"  # naive is UTC
    assert "h1" in [s["session_id"] for s in _ok(sessions)["sessions"]]


def test_http_a_second_users_token_cannot_read_the_first_users_memories(http_url: str) -> None:
    asyncio.run(
        _http_calls(
            http_url,
            ANA,
            [
                (
                    "remember",
                    {
                        "session_id": "secret",
                        "turns": [{"role": "user", "text": "My PIN is 4711."}],
                    },
                )
            ],
        )
    )
    recalled, sessions, forgot, ended = asyncio.run(
        _http_calls(
            http_url,
            BOB,
            [
                ("recall", {"query": "What is my PIN?"}),
                ("list_sessions", {}),
                ("forget", {"session_id": "secret"}),
                ("end_session", {"session_id": "secret"}),
            ],
        )
    )
    assert _ok(recalled)["passages"] == [] and "4711" not in _text(recalled)
    assert _ok(sessions)["sessions"] == []
    assert forgot.isError and ended.isError  # bob has no such session
    (mine,) = asyncio.run(_http_calls(http_url, ANA, [("recall", {"query": "What is my PIN?"})]))
    assert "4711" in _ok(mine)["passages"][0]["text"]


def test_http_feedback_names_only_the_users_own_recalls(http_url: str) -> None:
    """Bob cannot answer ana's recall (told as for an unknown one); it still waits for ana."""

    async def calls() -> tuple[CallToolResult, CallToolResult, CallToolResult]:
        ana = {"Authorization": f"Bearer {ANA}"}
        async with create_mcp_http_client(headers=ana) as http:
            async with streamable_http_client(http_url, http_client=http) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for name, args in _remember_lena():
                        await session.call_tool(name, args)
                    found = await session.call_tool("recall", {"query": "Where do I live now?"})
                    rid = _ok(found)["retrieval_id"]
                    (theirs,) = await _http_calls(
                        http_url, BOB, [("feedback", {"retrieval_id": rid, "cited": [0]})]
                    )
                    mine = await session.call_tool(
                        "feedback", {"retrieval_id": rid, "answer": "In Oslo [0]."}
                    )
                    return found, theirs, mine

    found, theirs, mine = asyncio.run(calls())
    rid = _ok(found)["retrieval_id"]
    assert theirs.isError and f"no recall {rid!r} of this user" in _text(theirs)
    assert _ok(mine)["retrieval_id"] == rid and _ok(mine)["cited"] == [0]


HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
JSON_OR_SSE = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    import httpx

    r = httpx.post(url, content=body, headers=headers, timeout=30)
    return r.status_code, dict(r.headers), r.content


def test_http_requires_a_valid_bearer_token_and_binds_sessions_to_it(http_url: str) -> None:
    kind = JSON_OR_SSE
    body = json.dumps(HELLO).encode()
    for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": ANA}):
        status, headers, _ = _post(http_url, body, {**kind, **auth})
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    status, headers, _ = _post(http_url, body, {**kind, "Authorization": f"Bearer {ANA}"})
    assert status == 200
    session = headers["mcp-session-id"]
    listing = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode()
    status, _, _ = _post(
        http_url, listing, {**kind, "Authorization": f"Bearer {BOB}", "Mcp-Session-Id": session}
    )
    assert status == 404  # ana's MCP session is not bob's to use
    rebound = {**kind, "Authorization": f"Bearer {ANA}", "Host": "evil.example"}
    assert _post(http_url, body, rebound)[0] == 421  # a loopback bind takes loopback names only


def test_http_bad_arguments_are_tool_errors(http_url: str) -> None:
    results = asyncio.run(
        _http_calls(
            http_url,
            ANA,
            [
                ("recall", {"query": "dog", "budget_tokens": -5}),
                ("remember", {"session_id": "x", "turns": "not a list"}),
                ("recall", {"query": "dog"}),
            ],
        )
    )
    assert results[0].isError and "budget" in _text(results[0])
    assert results[1].isError and "turns" in _text(results[1])
    assert not results[2].isError


def test_http_no_argument_is_coerced_and_nothing_is_erased(http_url: str) -> None:
    """Issue 39 (1) over HTTP, with a user of its own (carol) so other tests do not interfere."""
    calls = [("remember", {"session_id": "s1", "turns": PIXEL})]
    calls += [(name, args) for name, args, _ in COERCED] + [("list_sessions", {})]
    _check_no_coercion(asyncio.run(_http_calls(http_url, CAROL, calls)))


def test_http_an_overlong_recall_query_is_refused_before_any_work(http_url: str) -> None:
    """Issue 39 near miss: a ~900 KB query cost 7 s of CPU. A query past
    `search.max_query_chars` (20,000) is an `isError` naming the limit, answered at once."""
    long_query = "where is my dog " * 1_875  # 30,000 characters, within the body limit
    started = time.monotonic()
    _, refused, ok = asyncio.run(
        _http_calls(
            http_url,
            ANA,
            [
                ("remember", {"session_id": "long", "turns": PIXEL}),  # the store exists
                ("recall", {"query": long_query}),
                ("recall", {"query": "dog " * 100}),
            ],
        )
    )
    assert refused.isError
    assert "query has 30,000 characters, more than max_query_chars=20,000" in _text(refused)
    assert not ok.isError
    assert time.monotonic() - started < 30


MALFORMED = {
    "an id of 5,000 digits": b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}',
    "30,000 nested arrays": b"[" * 30_000 + b"]" * 30_000,  # within the 64 KiB limit
    "5,000 nested objects": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "invalid UTF-8": b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_http_malformed_bodies_get_400_and_a_jsonrpc_error(http_url: str, body: bytes) -> None:
    """Issue 39 (2): answered before the SDK parses them (it raised: 500 and a traceback)."""
    auth = {**JSON_OR_SSE, "Authorization": f"Bearer {ANA}"}
    status, headers, data = _post(http_url, body, auth)
    assert status == 400 and headers["content-type"] == "application/json"
    answer = json.loads(data)
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32700 and answer["error"]["message"].startswith("Parse")
    (ok,) = asyncio.run(_http_calls(http_url, ANA, [("list_sessions", {})]))
    assert not ok.isError  # the server goes on; the fixture checks its log has no traceback


def _open_session(url: str, token: str) -> tuple[int, str | None, bytes]:
    """POST an initialize with `token`: (status, the new session's id or None, body)."""
    auth = {**JSON_OR_SSE, "Authorization": f"Bearer {token}"}
    status, headers, body = _post(url, json.dumps(HELLO).encode(), auth)
    return status, headers.get("mcp-session-id"), body


def test_http_one_token_cannot_take_every_session(tmp_path: Path) -> None:
    """Issue 39 (3): ana's token is refused beyond its cap; bob still gets in; ended or idle
    sessions stop counting."""
    from reflective_memory.serve.limits import MAX_SESSIONS_PER_TOKEN

    assert MAX_SESSIONS_PER_TOKEN <= 1000
    with _http_server(
        tmp_path, "--max-sessions-per-token", "3", "--session-idle-seconds", "3"
    ) as url:
        opened = [_open_session(url, ANA) for _ in range(3)]
        assert [status for status, _, _ in opened] == [200, 200, 200]
        status, session, body = _open_session(url, ANA)
        assert status == 429 and session is None
        error = json.loads(body)["error"]
        assert "holds 3 open MCP sessions (at most 3)" in error["message"]
        assert _open_session(url, BOB)[0] == 200  # another token is not locked out
        (stored,) = asyncio.run(
            _http_calls(url, BOB, [("remember", {"session_id": "b", "turns": PIXEL})])
        )
        assert not stored.isError

        import httpx

        theirs = {"Authorization": f"Bearer {BOB}", "Mcp-Session-Id": opened[1][1]}
        assert httpx.delete(url, headers=theirs).status_code == 404  # not bob's to end
        assert _open_session(url, ANA)[0] == 429  # and it still counts for ana
        ended = httpx.delete(
            url, headers={"Authorization": f"Bearer {ANA}", "Mcp-Session-Id": opened[0][1]}
        )
        assert ended.status_code < 400
        assert _open_session(url, ANA)[0] == 200  # the ended session no longer counts
        assert _open_session(url, ANA)[0] == 429
        time.sleep(4.5)  # every one of ana's sessions is idle past 3 s
        assert [_open_session(url, ANA)[0] for _ in range(3)] == [200, 200, 200]


def test_http_one_token_cannot_flood_the_server_with_requests(tmp_path: Path) -> None:
    """Issue 39 (what to build): a per-token request rate. Past it ana gets 429 and a JSON-RPC
    error (her SDK client cannot even initialize), bob's client works, ana may still DELETE."""
    from reflective_memory.serve.limits import MAX_REQUESTS_PER_MINUTE

    assert MAX_REQUESTS_PER_MINUTE <= 1000
    with _http_server(tmp_path, "--max-requests-per-minute", "6") as url:
        opened = [_open_session(url, ANA) for _ in range(6)]
        assert [status for status, _, _ in opened] == [200] * 6
        status, headers, body = _post(
            url, json.dumps(HELLO).encode(), {**JSON_OR_SSE, "Authorization": f"Bearer {ANA}"}
        )
        assert status == 429 and 1 <= int(headers["retry-after"]) <= 60
        answer = json.loads(body)
        assert answer["jsonrpc"] == "2.0" and answer["id"] is None
        assert answer["error"]["code"] == -32600
        assert "this token made 6 in the last 60 s (at most 6)" in answer["error"]["message"]
        with pytest.raises(BaseException) as refused:  # the SDK client's own initialize
            asyncio.run(_http_calls(url, ANA, [("list_sessions", {})]))
        assert "429" in repr(refused.value) or "Too Many" in repr(refused.value)
        # another token is not affected: a whole SDK session, five requests
        stored, listed = asyncio.run(
            _http_calls(
                url, BOB, [("remember", {"session_id": "b", "turns": PIXEL}), ("list_sessions", {})]
            )
        )
        assert not stored.isError and [s["session_id"] for s in _ok(listed)["sessions"]] == ["b"]
        import httpx

        ended = httpx.delete(
            url, headers={"Authorization": f"Bearer {ANA}", "Mcp-Session-Id": opened[0][1]}
        )
        assert ended.status_code < 400  # ending a session is never refused


def test_the_request_rate_window_slides_and_an_unauthenticated_request_is_not_counted() -> None:
    """`RequestRate` in process, on a clock of its own: a request leaves the count after the
    window; refused requests do not count; requests without an identity (none passed the
    bearer gate) are not tracked."""
    from reflective_memory.serve.bearer import IDENTITY_KEY, identity
    from reflective_memory.serve.limits import RequestRate

    now = [0.0]
    passed: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["path"])

    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    rate = RequestRate(app, 2, key=identity, window=10, clock=lambda: now[0])

    def call(user: str | None, path: str, method: str = "POST") -> None:
        scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": []}
        if user is not None:
            scope[IDENTITY_KEY] = user
        asyncio.run(rate(scope, None, send))

    call("ana", "/a"), call("ana", "/b")
    now[0] = 5.0
    call("ana", "/refused"), call("ana", "/refused")
    call("ana", "/delete", "DELETE")
    for _ in range(5):
        call(None, "/guess")
    now[0] = 10.0  # the first two requests leave the window; the refused ones never counted
    call("ana", "/c"), call("ana", "/d"), call("ana", "/refused")
    assert passed == ["/a", "/b", "/delete", *["/guess"] * 5, "/c", "/d"]
    assert statuses == [429, 429, 429]
    assert len(rate.seen) == 1  # only the authenticated user is tracked


def _raw_post(url: str, total: int, *, chunked: bool) -> tuple[int, bytes, int]:
    """POST `total` bytes until the server answers; (status, body, bytes sent).

    With a `Content-Length`, nothing of the body is sent until the server has had 20 s to answer
    from the header alone.
    """
    host, port = url.split("//")[1].split("/")[0].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sock.sendall(
        f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ANA}\r\n{framing}\r\n\r\n".encode()
    )
    piece, sent = b"a" * 4096, 0
    if not chunked:
        select.select([sock], [], [], 20)
    try:
        while sent < total and not select.select([sock], [], [], 0)[0]:
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    with sock:
        try:
            while got := sock.recv(65536):  # the server closes the connection after a 413
                data += got
        except ConnectionResetError:
            pass
    return int(data.split()[1]), data, sent


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_http_refuses_an_oversized_body_before_reading_it(http_url: str, chunked: bool) -> None:
    status, data, sent = _raw_post(http_url, 64 * LIMIT, chunked=chunked)
    assert status == 413 and b"too large" in data
    # a JSON-RPC error, as an MCP client reads one (it was plain text)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    answer = json.loads(body)
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32600 and "too large" in answer["error"]["message"]
    assert sent < 64 * LIMIT  # the server answered before the body was sent
    if not chunked:
        assert sent == 0  # from the declared size alone


# -- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--transport", "http"], "requires access tokens"),
        (["--transport", "http", "--host", "0.0.0.0"], "requires access tokens"),
        (["--transport", "http", "--user", "ana", "--token", f"bob={BOB}"], "each token names"),
        (["--transport", "http", "--token", "ana=short"], "at least 16"),
        (["--transport", "http", "--token", ANA], "USER=TOKEN"),
        (["--transport", "http", "--token", f"a={ANA}", "--token", f"b={ANA}"], "twice"),
        (["--transport", "http", "--token", f"a={ANA}", "--port", "70000"], "--port"),
        ([], "give --user"),
        (["--user", "ana", "--token", f"ana={ANA}"], "stdio serves --user only"),
    ],
)
def test_bad_options_fail_before_the_store_is_created(tmp_path, capsys, argv, message) -> None:
    db = tmp_path / "db"
    assert main(["mcp", "--db", str(db), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not db.exists()


def test_a_stdio_server_without_user_tells_the_client_why(tmp_path: Path) -> None:
    """The client reads the reason (not "Connection closed"), and no store is created."""
    from mcp.shared.exceptions import McpError

    db = tmp_path / "db"
    params = StdioServerParameters(command=sys.executable, args=[CLI, "mcp", "--db", str(db)])

    async def start() -> str:
        try:
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
        except Exception as exc:  # McpError, inside the SDK's task group
            while not isinstance(exc, McpError) and getattr(exc, "exceptions", None):
                exc = exc.exceptions[0]
            assert isinstance(exc, McpError), exc
            return str(exc)
        return "started"

    said = asyncio.run(start())
    assert said.startswith("reflective-memory mcp cannot start: ")
    assert "the stdio transport serves one user: give --user" in said
    assert not db.exists()


def test_the_store_is_given_once(tmp_path, capsys) -> None:
    argv = ["mcp", "--db", str(tmp_path), "--dsn", "postgresql://x/y", "--user", "ana"]
    assert main(argv) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["mcp", "--user", "ana"]) == 2


def test_a_tokens_file_with_a_bom_and_inline_comments(tmp_path) -> None:
    from reflective_memory.serve.mcp import read_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text(f"\ufeffalice={ANA} # laptop\n# bob\nbob={BOB}\t#desk\n", "utf-8")
    assert read_tokens(str(tokens)) == {"alice": ANA, "bob": BOB}
    tokens.write_text(f"alice={ANA} and more\n", "utf-8")
    with pytest.raises(ConfigError, match="token of user 'alice' .* holds a space"):
        read_tokens(str(tokens))


def test_a_malformed_tokens_file_is_named(tmp_path, capsys) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# comment\nana\n")
    argv = ["mcp", "--db", str(tmp_path / "db"), "--transport", "http"]
    assert main([*argv, "--tokens-file", str(tokens)]) == 2
    assert f"a line of {tokens} must look like USER=TOKEN" in capsys.readouterr().err


# -- LangChain ---------------------------------------------------------------------------------
def test_langchain_mcp_adapters_load_the_tools_and_recall(http_url: str, tmp_path: Path) -> None:
    pytest.importorskip("langchain_mcp_adapters")
    from langchain_mcp_adapters.client import MultiServerMCPClient

    asyncio.run(
        _http_calls(
            http_url,
            ANA,
            [
                (
                    "remember",
                    {"session_id": "lc", "turns": [{"role": "user", "text": "I play the cello."}]},
                )
            ],
        )
    )
    client = MultiServerMCPClient(
        {
            "memory": {
                "transport": "streamable_http",
                "url": http_url,
                "headers": {"Authorization": f"Bearer {ANA}"},
            },
            "local": {
                "transport": "stdio",
                "command": sys.executable,
                "args": _stdio(tmp_path).args,
            },
        }
    )

    async def use() -> tuple[set[str], set[str], Any]:
        remote = {t.name: t for t in await client.get_tools(server_name="memory")}
        local = {t.name for t in await client.get_tools(server_name="local")}
        return (
            set(remote),
            local,
            await remote["recall"].ainvoke({"query": "Which instrument do I play?"}),
        )

    remote, local, answer = asyncio.run(use())
    assert remote == TOOLS and local == TOOLS
    shown = answer if isinstance(answer, str) else json.dumps(answer, default=str)
    assert "cello" in shown
