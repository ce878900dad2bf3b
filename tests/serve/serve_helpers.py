"""Helpers of the web app tests: a seeded store and a client that knows its CSRF token."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.serve.app import create_app

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'

ANA_S1 = [
    "I adopted a beagle puppy called Pixel last weekend.",
    "Congratulations! Beagles are lovely and curious.",
    "Pixel already chewed my running shoes.",
    "Puppies do that; a chew toy might save the next pair.",
]
ANA_S2 = [
    f"Please remember this odd snippet from my blog: {XSS}",
    "Noted, I will keep it as plain text.",
    "I am training for the Berlin half marathon in April.",
    "Great goal; build up your long runs slowly.",
]
BOB_S1 = [
    "My sister Lena lives in Porto and teaches chemistry.",
    "Porto is beautiful; does she enjoy teaching?",
]


def seeded_memory() -> ReflectiveMemory:
    """An in-memory store: ana with two ended sessions (one holds an XSS payload), bob with one."""
    mem = ReflectiveMemory(embedder=HashingEmbedder(dim=128), config=MemoryConfig())
    for user, sid, texts in (
        ("ana", "s1", ANA_S1),
        ("ana", "s2", ANA_S2),
        ("bob", "b1", BOB_S1),
    ):
        for i, text in enumerate(texts):
            mem.add_turn(
                user,
                sid,
                "user" if i % 2 == 0 else "assistant",
                text,
                timestamp=f"2025-0{1 + len(sid)}-1{i}T10:00:00",
            )
        mem.end_session(user, sid)
    return mem


def client_for(mem: ReflectiveMemory, **kw) -> TestClient:
    """A test client of an app over `mem` (extra keywords go to `create_app`)."""
    return TestClient(create_app(mem, **kw), follow_redirects=True)


def csrf(client: TestClient, **kw) -> str:
    """The caller's CSRF token, from the API."""
    r = client.get("/api/csrf", **kw)
    assert r.status_code == 200, r.text
    return r.json()["csrf_token"]


def form_value(html: str, name: str) -> str:
    """The value of the first hidden input called `name` in a page."""
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert m, f"no input {name!r} in the page"
    return m.group(1)


@contextmanager
def live_server(app: Any, *, lifespan: str = "off") -> Iterator[int]:
    """Serve `app` with uvicorn in a thread of this process on a free loopback port; yield it.

    `lifespan="on"` runs the app's startup (the MCP server's session manager needs it).
    """
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
