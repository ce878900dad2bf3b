"""Issue 50 (1-3, 12): the HTTP MCP server authenticates first and bounds every body it reads.

A live `reflective-memory mcp --transport http` on loopback (this checkout's CLI with the
hashing embedder, as in `test_mcp_server.py`), attacked over real sockets and used by the SDK's
own client: duplicate `Authorization` headers, bodies sent without a valid token (declared,
sent whole or stalled), stalled bodies of a valid token, and numbers that are not finite.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx  # noqa: E402
from reflective_memory.errors import ConfigError  # noqa: E402
from test_mcp_server import (  # noqa: E402
    ANA,
    BOB,
    HELLO,
    JSON_OR_SSE,
    PIXEL,
    _http_calls,
    _http_server,
)

NESTED = b"[" * 30 + b"1" + b"]" * 30


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _server_pid(port: int) -> int:
    """The pid of the process listening on `port` (the server subprocess)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if int(cols[1].split(":")[1], 16) == port and cols[3] == "0A":  # LISTEN
                inode = cols[9]
    assert inode is not None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if fd.readlink().as_posix() == f"socket:[{inode}]":
                    return int(proc.name)
        except OSError:
            continue
    raise AssertionError("no process listens there")


def _still_serves(url: str) -> None:
    """Ana's SDK client remembers a turn: the server goes on."""
    calls = [("remember", {"session_id": "ok", "turns": PIXEL})]
    (stored,) = asyncio.run(_http_calls(url, ANA, calls))
    assert not stored.isError


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def _initialize(url: str, headers: list[tuple[str, str]]) -> httpx.Response:
    """POST an `initialize` with exactly these headers (repeated names kept)."""
    return httpx.post(
        url, content=json.dumps(HELLO).encode(), headers=[*JSON_OR_SSE.items(), *headers]
    )


def _answer(sock: socket.socket, wait: float) -> bytes:
    """What the server sends on `sock` until it closes the connection (or `wait` passes)."""
    sock.settimeout(wait)
    data = b""
    try:
        while got := sock.recv(65536):
            data += got
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _stalled(port: int, token: str | None, declared: int, sent: int) -> socket.socket:
    """A POST that declares `declared` body bytes, sends `sent` of them and stalls."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    auth = "" if token is None else f"Authorization: Bearer {token}\r\n"
    sock.sendall(
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{auth}"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    piece = b"[" * 4096
    done = 0
    try:
        while done < sent:
            sock.sendall(piece[: min(len(piece), sent - done)])
            done += min(len(piece), sent - done)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed already
    return sock


def test_duplicate_authorization_headers_are_refused_and_bypass_no_limit(tmp_path: Path) -> None:
    """Issue 50 (1): the limits read the last header, the SDK the first; `Bearer <valid>` then
    `Bearer junk-<uuid>` opened 40 of 40 sessions under a cap of 2 and passed 100 of 100
    requests under 5 a minute. Now two headers are a 400 whatever they hold, and the caps
    count the user the token stands for."""
    options = ("--max-sessions-per-token", "2", "--max-requests-per-minute", "5")
    with _http_server(tmp_path, *options) as url:
        twice = [
            _initialize(url, [("Authorization", f"Bearer {ANA}"), ("Authorization", f"Bearer {j}")])
            for j in (f"junk-{uuid.uuid4()}" for _ in range(10))
        ]
        assert {r.status_code for r in twice} == {400}
        error = twice[0].json()["error"]
        assert (
            "2 Authorization headers" in error["message"]
            and "mcp-session-id" not in twice[0].headers
        )
        same = _initialize(url, [("Authorization", f"Bearer {ANA}")] * 2)
        assert same.status_code == 400  # even the same token twice
        # one header: the cap of 2 sessions holds, the third is refused
        opened = [_initialize(url, [("Authorization", f"Bearer {ANA}")]) for _ in range(3)]
        assert [r.status_code for r in opened] == [200, 200, 429]
        # and the rate: ana made 3 counted requests (the 400s did not count); 2 more, then 429
        more = [_initialize(url, [("Authorization", f"Bearer {ANA}")]) for _ in range(3)]
        assert [r.status_code for r in more][-1] == 429
        assert "at most 5" in more[-1].json()["error"]["message"]
        # bob's SDK client is not affected
        (stored,) = asyncio.run(
            _http_calls(url, BOB, [("remember", {"session_id": "b", "turns": PIXEL})])
        )
        assert not stored.isError


def test_a_request_without_a_valid_token_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    """Issue 50 (2): the JSON-RPC body check ran before authentication, so any client could
    make the server read and parse 1 MiB bodies (~0.5 s of the event loop each). Now a
    request without a valid token is answered 401 from its headers alone: a POST declaring
    1 MiB and sending none of it is answered at once."""
    with _http_server(tmp_path) as url:
        port = _port(url)
        for token in (None, "wrong-token-0123456789abcdef"):
            started = time.monotonic()
            sock = _stalled(port, token, 1_048_000, 0)
            with sock:
                data = _answer(sock, 10)
            assert time.monotonic() - started < 5, "the server waited for the body"
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 401"), head[:80]
            assert b"www-authenticate: bearer" in head.lower()
            assert json.loads(body)["error"] == "invalid_token"
        # a nested body without a token: refused without being parsed, the server goes on
        r = httpx.post(url, content=NESTED * 30_000, headers=JSON_OR_SSE)
        assert r.status_code == 401
        _still_serves(url)


def test_stalled_bodies_hold_bounded_memory_for_a_bounded_time(tmp_path: Path) -> None:
    """Issue 50 (3): 200 connections declaring ~1 MB that sent ~1 MB and stalled raised the
    server's RSS from 112 to 309 MB and stayed open. Unauthenticated ones are now answered
    401 and closed at once; a valid token's stalled body gets 408 after `--body-read-seconds`;
    past `--max-pending-bodies` a body is refused with 503 at once."""
    options = ("--body-read-seconds", "2", "--max-pending-bodies", "3")
    with _http_server(tmp_path, *options) as url:
        port = _port(url)
        pid = _server_pid(port)
        before = _rss_kb(pid)
        socks = [_stalled(port, None, 1_048_000, 256 * 1024) for _ in range(100)]
        started = time.monotonic()
        answers = [_answer(s, 15) for s in socks]
        closed_after = time.monotonic() - started
        for s in socks:
            s.close()
        assert all(a.startswith(b"HTTP/1.1 401") for a in answers)
        assert closed_after < 15  # every connection was closed by the server
        assert _rss_kb(pid) - before < 40_000, "stalled bodies still held"
        # a valid token's stalled bodies: 3 are read (and time out), the 4th is refused at once
        held = [_stalled(port, ANA, 60_000, 1000) for _ in range(3)]
        time.sleep(0.5)
        fourth = _stalled(port, ANA, 60_000, 1000)
        with fourth:
            started = time.monotonic()
            refused = _answer(fourth, 10)
        assert refused.startswith(b"HTTP/1.1 503") and time.monotonic() - started < 1.5
        timed_out = [_answer(s, 10) for s in held]
        for s in held:
            s.close()
        assert all(a.startswith(b"HTTP/1.1 408") for a in timed_out), [a[:40] for a in timed_out]
        assert b"did not arrive within 2 s" in timed_out[0]
        _still_serves(url)


def _session(url: str) -> dict[str, str]:
    """Open an MCP session over raw HTTP as ana; the headers of its further requests."""
    auth = {**JSON_OR_SSE, "Authorization": f"Bearer {ANA}"}
    opened = httpx.post(url, content=json.dumps(HELLO).encode(), headers=auth)
    assert opened.status_code == 200
    auth["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(url, content=json.dumps(note).encode(), headers=auth).status_code == 202
    return auth


def test_a_number_that_is_not_finite_is_an_invalid_argument(tmp_path: Path) -> None:
    """Issue 50 (12): `budget_tokens: NaN` was read by the SDK as absent (a recall at the
    default budget). Now it is refused naming the argument, with the request's id."""
    with _http_server(tmp_path) as url:
        _still_serves(url)
        headers = _session(url)
        for number in ("NaN", "Infinity", "-Infinity", "1e999"):
            body = (
                '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"recall",'
                f'"arguments":{{"query":"dog","budget_tokens":{number}}}}}}}'
            )
            r = httpx.post(url, content=body.encode(), headers=headers)
            assert r.status_code == 400
            answer = r.json()
            assert answer["id"] == 7 and answer["error"]["code"] == -32602
            message = answer["error"]["message"]
            assert message.startswith(f"Invalid params: budget_tokens is {number}"), message
        calls = [("recall", {"query": "dog", "budget_tokens": 50})]
        (ok,) = asyncio.run(_http_calls(url, ANA, calls))
        assert not ok.isError


def test_the_body_check_runs_off_the_event_loop_for_large_bodies() -> None:
    """Issue 50 (2): a large body's JSON-RPC check (up to ~0.5 s for 1 MiB of nested arrays)
    runs in a worker thread, so the event loop serves other requests meanwhile."""
    import threading

    from reflective_memory.serve.limits import BodyLimit

    where: list[str] = []

    def check(scope: Any, body: bytes) -> None:
        where.append(threading.current_thread().name)
        return None

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})

    async def call(body: bytes) -> None:
        sent = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return sent.pop()

        async def send(message: Any) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}
        await BodyLimit(app, 2**20, check=check)(scope, receive, send)

    asyncio.run(call(b"[]"))
    asyncio.run(call(NESTED * 10_000))
    main = threading.main_thread().name
    assert where[0] == main and where[1] != main


def test_a_tokens_file_refuses_invisible_token_characters_and_bad_users(tmp_path: Path) -> None:
    """Issue 50 near miss: a tokens file took control and zero-width characters in a token and
    a NUL or 600-character user."""
    from reflective_memory.serve.mcp import read_tokens

    cases = {
        "ana=abc\u200bdefghijklmnopqrs\n": r"U\+200B",
        "ana=abc\x07defghijklmnopqrs\n": r"U\+0007",
        "an\x00a=abcdefghijklmnopqrs\n": "NUL",
        "a" * 600 + "=abcdefghijklmnopqrs\n": "longer than 512",
    }
    for text, problem in cases.items():
        path = tmp_path / "tokens"
        path.write_text(text)
        with pytest.raises(ConfigError, match=problem):
            from reflective_memory.serve.security import AccessPolicy

            AccessPolicy(None, read_tokens(str(path)))
    fifo = tmp_path / "fifo"
    import os

    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_tokens(str(fifo))  # did hang until a writer came


def test_a_client_chosen_http_method_is_not_a_span_name(spans: Any) -> None:
    """Issue 50 near miss: `SECRETMETHOD /mcp` appeared as a span name."""
    from reflective_memory.tracing import TracedASGI

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": []})

    async def send(message: Any) -> None:
        pass

    for method in ("SECRETMETHOD", "GET"):
        scope = {"type": "http", "method": method, "path": "/mcp", "headers": []}
        asyncio.run(TracedASGI(app, route="/mcp")(scope, None, send))
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["HTTP /mcp", "GET /mcp"]
    assert spans.get_finished_spans()[0].attributes["http.request.method"] == "_OTHER"
