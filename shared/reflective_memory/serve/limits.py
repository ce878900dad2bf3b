"""Bounded request bodies: refuse one over a size limit before anything reads or parses it.

`BodyLimit` is the outermost layer of the app (ASGI): a request whose `Content-Length` exceeds
the limit is answered 413 without reading a byte of its body; any other body (chunked, or a
`Content-Length` that lies) is read in the server's chunks and refused with 413 as soon as the
bytes received pass the limit. Only then do access checks, CSRF checks and form or JSON parsing
see the request, and they see the body already read (at most the limit held in memory).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from reflective_memory.errors import ConfigError

__all__ = [
    "BodyLimit",
    "BodyCheck",
    "Refusal",
    "MAX_BODY_BYTES",
    "MAX_SESSIONS_PER_TOKEN",
    "SESSION_IDLE_SECONDS",
    "check_body_limit",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]
#: An answer given instead of the app's: status, content type, body.
Refusal = tuple[int, bytes, bytes]
#: Looks at a request (its ASGI scope and whole body, within the limit) before the app does:
#: None lets it through, a `Refusal` is answered instead (the connection is then closed).
BodyCheck = Callable[[Message, bytes], "Refusal | None"]

#: Default largest request body: 1 MiB. The largest body the app accepts is a chat message of
#: `chat.MAX_MESSAGE_CHARS` (8,000) characters; written as JSON `\\uXXXX` surrogate pairs or as a
#: percent-encoded form it takes 12 bytes per character, 96 KB, so 1 MiB leaves ten times that.
MAX_BODY_BYTES = 2**20
#: Default most MCP sessions one token may hold open at once (the SDK's own cap, 10,000, is
#: for the whole server: one token could take every one of them).
MAX_SESSIONS_PER_TOKEN = 100
#: Default seconds an MCP session may have no request before it is closed (the SDK's: 1,800).
SESSION_IDLE_SECONDS = 300


def check_body_limit(max_bytes: Any) -> int:
    """Check that a body limit is a positive int; return it.

    Raises:
        ConfigError: It is not.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_body_bytes must be a positive integer, got {max_bytes!r}")
    return max_bytes


class BodyLimit:
    """ASGI middleware that refuses request bodies over `max_bytes` with 413.

    Args:
        app: The application wrapped.
        max_bytes: Largest body accepted, in bytes.
        check: Looks at each whole body (within the limit) before the app may parse it.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, check: BodyCheck | None = None
    ) -> None:
        self.app, self.max_bytes = app, check_body_limit(max_bytes)
        self.check = check

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        """Check the declared size, read the body within the limit, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
        if declared:
            try:
                size = int(declared[0])
            except ValueError:
                await _refuse(scope, send, 400, "the Content-Length header is not a number")
                return
            if size > self.max_bytes:
                await _refuse(scope, send, 413, self._too_large(f"it declares {size:,}"))
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _refuse(scope, send, 413, self._too_large("more arrived"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        refusal = None if self.check is None else self.check(scope, body)
        if refusal is not None:
            await _answer(send, *refusal)
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self, what: str) -> str:
        return f"request body too large: at most {self.max_bytes:,} bytes are accepted ({what})"


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the read body once, then passes on to the server's."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _refuse(scope: Message, send: Send, status: int, message: str) -> None:
    """Answer `status` (JSON under /api, text elsewhere) and close the connection."""
    path = scope.get("path", "")
    if path == "/api" or path.startswith("/api/"):
        body, kind = json.dumps({"detail": message, "status": status}).encode(), b"application/json"
    else:
        body, kind = f"{status}: {message}\n".encode(), b"text/plain; charset=utf-8"
    await _answer(send, status, kind, body)


async def _answer(send: Send, status: int, kind: bytes, body: bytes) -> None:
    """Send a whole response of `status` and close the connection."""
    headers = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
