"""Bounded request bodies: 413 before reading, for declared and for chunked bodies.

The large bodies go over real sockets to a live uvicorn server running in this process, so the
server's memory can be measured: the peak resident set (VmHWM, reset through
/proc/self/clear_refs) may grow by less than 10 MB while a 50 MB body is refused.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from reflective_memory.cli import main
from reflective_memory.errors import ConfigError
from reflective_memory.serve.app import create_app
from reflective_memory.serve.chat import MAX_MESSAGE_CHARS
from reflective_memory.serve.limits import MAX_BODY_BYTES
from serve_helpers import csrf, live_server, seeded_memory

BIG = 50 * 2**20
PIECE = b"a" * 2**16


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


@pytest.fixture(scope="module")
def live() -> Iterator[int]:
    """A live server (uvicorn in a thread of this process) over a seeded store; its port."""
    mem = seeded_memory()
    try:
        with live_server(create_app(mem)) as port:
            yield port
    finally:
        mem.close()


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                break
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            got = sock.recv(65536)
            if not got:
                break
            body += got
    except ConnectionResetError:
        pass
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data.split()[1]), body


def _post(
    port: int, path: str, total: int, *, chunked: bool, headers: str = ""
) -> tuple[int, bytes, int]:
    """POST `total` bytes (from one 64 KiB piece) until the server answers; (status, body, sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}{headers}{framing}\r\n\r\n".encode())
    sent = 0
    try:
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered (or closed): stop sending
            piece = PIECE[: total - sent]
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            sent += len(piece)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    with sock:
        status, body = _read_response(sock)
    return status, body, sent


def _token(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/api/csrf")
    return json.loads(conn.getresponse().read())["csrf_token"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/api/users/ana/chat", "/users/ana/chat"])
def test_a_50mb_body_is_refused_with_413_and_little_memory(
    live: int, chunked: bool, path: str
) -> None:
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc to measure the peak resident set")
    _post(live, path, 2 * MAX_BODY_BYTES, chunked=chunked)  # warm up the code path
    _reset_peak()
    before = _status_kb("VmRSS")
    status, body, sent = _post(live, path, BIG, chunked=chunked, headers="X-CSRF-Token: bogus\r\n")
    grown_mb = (_status_kb("VmHWM") - before) / 1024
    assert status == 413, body
    assert b"too large" in body
    assert grown_mb < 10, f"peak RSS grew by {grown_mb:.1f} MB"
    if not chunked:
        assert sent < BIG  # answered from the header, before the body was sent


def test_normal_requests_are_unaffected(live: int) -> None:
    token = _token(live)
    message = json.dumps({"message": "What is my puppy called?"}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", live, timeout=60)
    conn.request(
        "POST",
        "/api/users/ana/chat",
        body=message,
        headers={"Content-Type": "application/json", "X-CSRF-Token": token},
    )
    r = conn.getresponse()
    assert r.status == 200, r.read()
    assert "Pixel" in json.loads(r.read())["reply"]
    # the same small body, chunked, passes too
    status, body, _ = _post(
        live, "/api/users/ana/chat", 0, chunked=True, headers=f"X-CSRF-Token: {token}\r\n"
    )
    assert status == 400  # read and parsed: an empty body is a bad request, not a 413
    assert b"too large" not in body


@pytest.fixture
def small(smem) -> TestClient:
    return TestClient(create_app(smem, max_body_bytes=1000), follow_redirects=True)


def test_the_limit_is_exact(small: TestClient) -> None:
    token = csrf(small)
    headers = {"Content-Type": "application/json", "X-CSRF-Token": token}
    fits = json.dumps({"message": "x" * 980}).encode().ljust(1000)
    r = small.post("/api/users/ana/chat", content=fits, headers=headers)
    assert r.status_code == 200, r.text
    r = small.post("/api/users/ana/chat", content=fits + b" ", headers=headers)
    assert r.status_code == 413 and r.json()["status"] == 413
    assert "at most 1,000 bytes" in r.json()["detail"]


def test_a_chunked_body_over_the_limit_is_refused(small: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield from (b" " * 400 for _ in range(3))

    r = small.post("/api/users/ana/chat", content=chunks(), headers={"X-CSRF-Token": "x"})
    assert r.status_code == 413
    r = small.post("/users/ana/chat", content=chunks())
    assert r.status_code == 413 and "too large" in r.text


def test_the_default_fits_the_largest_chat_message_ten_times() -> None:
    escaped = json.dumps({"message": "\U0001f600" * MAX_MESSAGE_CHARS}).encode()
    assert 10 * len(escaped) <= MAX_BODY_BYTES


def test_a_bad_limit_is_a_config_error(smem, tmp_path) -> None:
    with pytest.raises(ConfigError, match="max_body_bytes"):
        create_app(smem, max_body_bytes=0)
    assert main(["serve", "--max-body-bytes", "0", "--db", str(tmp_path / "db")]) == 2
    assert not (tmp_path / "db").exists()
