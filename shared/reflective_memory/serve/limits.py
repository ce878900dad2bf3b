"""Bounded requests: a body over a size limit, a slow body, or a token over its rate is refused.

`BodyLimit` bounds what reading request bodies may cost (ASGI): a request whose
`Content-Length` exceeds the limit is answered 413 without reading a byte of its body; any other
body (chunked, or a `Content-Length` that lies) is read in the server's chunks and refused with
413 as soon as the bytes received pass the limit. A body must arrive whole within
`read_seconds` (else 408), and at most `max_pending` bodies are read at once (past that, 503
at once), so stalled bodies hold bounded memory for a bounded time. A body check (the MCP
server's JSON-RPC check) runs off the event loop for bodies past a few KiB. Only then do access
checks, CSRF checks and form or JSON parsing see the request, and they see the body already
read (at most the limit held in memory).

`RequestRate` bounds the requests of each authenticated identity in a sliding time window (MCP
over HTTP, behind `serve.bearer.BearerGate`), answering 429 beyond it without reading the
body; other identities are not affected.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from reflective_memory.errors import ConfigError

__all__ = [
    "BodyLimit",
    "BodyCheck",
    "Refusal",
    "RequestRate",
    "ASGIApp",
    "Message",
    "Receive",
    "Send",
    "answer",
    "MAX_BODY_BYTES",
    "BODY_READ_SECONDS",
    "MAX_PENDING_BODIES",
    "MAX_SESSIONS_PER_TOKEN",
    "MAX_REQUESTS_PER_MINUTE",
    "RATE_WINDOW_SECONDS",
    "SESSION_IDLE_SECONDS",
    "JSONRPC_INVALID_REQUEST",
    "check_body_limit",
    "jsonrpc_refusal",
]

logger = logging.getLogger(__name__)

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
#: Default seconds a request body has to arrive whole once its headers are in (else 408): a 1 MiB
#: body at 100 KB/s. A client that stalls half-way holds its bytes this long at most.
BODY_READ_SECONDS = 10.0
#: Default most request bodies read at once (a request past it is answered 503 at once), so
#: clients that stall their bodies hold at most this many times `max_bytes`.
MAX_PENDING_BODIES = 64
#: Bodies up to this size are checked on the event loop; larger ones in a worker thread.
_CHECK_ON_LOOP_BYTES = 4096
#: Default most MCP sessions one token may hold open at once (the SDK's own cap, 10,000, is
#: for the whole server: one token could take every one of them).
MAX_SESSIONS_PER_TOKEN = 100
#: Default seconds an MCP session may have no request before it is closed (the SDK's: 1,800).
SESSION_IDLE_SECONDS = 300
#: Default most requests one token may make in `RATE_WINDOW_SECONDS` (MCP over HTTP): 10 a
#: second on average, where an agent makes a handful per turn of a conversation.
MAX_REQUESTS_PER_MINUTE = 600
#: The sliding window `MAX_REQUESTS_PER_MINUTE` counts in.
RATE_WINDOW_SECONDS = 60.0
#: JSON-RPC 2.0's "Invalid Request" error code.
JSONRPC_INVALID_REQUEST = -32600


def jsonrpc_refusal(status: int, code: int, message: str) -> Refusal:
    """A `Refusal` of `status` carrying a JSON-RPC error (id null: the request was not read)."""
    answer = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return status, b"application/json", json.dumps(answer).encode()


def check_body_limit(max_bytes: Any) -> int:
    """Check that a body limit is a positive int; return it.

    Raises:
        ConfigError: It is not.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_body_bytes must be a positive integer, got {max_bytes!r}")
    return max_bytes


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


class BodyLimit:
    """ASGI middleware that bounds what reading request bodies costs (see the module docs).

    Args:
        app: The application wrapped.
        max_bytes: Largest body accepted, in bytes (413 past it).
        check: Looks at each whole body (within the limit) before the app may parse it; run in
            a worker thread for bodies past a few KiB, so a costly check never holds the event
            loop.
        jsonrpc: Refusals are JSON-RPC errors (id null), as a JSON-RPC client reads them
            (MCP); otherwise JSON under `/api`, text elsewhere.
        read_seconds: A body must arrive whole within this many seconds (408 otherwise).
        max_pending: Most bodies read at once; a request past it gets 503 at once.

    Raises:
        ConfigError: A limit is not a positive number.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = MAX_BODY_BYTES,
        check: BodyCheck | None = None,
        *,
        jsonrpc: bool = False,
        read_seconds: float = BODY_READ_SECONDS,
        max_pending: int = MAX_PENDING_BODIES,
    ) -> None:
        self.app, self.max_bytes = app, check_body_limit(max_bytes)
        self.check, self.jsonrpc = check, jsonrpc
        _check_positive("the body read time", read_seconds)
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"the pending bodies must be a positive integer, got {max_pending!r}")
        self.read_seconds, self.max_pending = float(read_seconds), max_pending
        #: Bodies being read now (one event loop: no lock needed).
        self.pending = 0

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        """Check the declared size, read the body within the limits, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
        if declared:
            try:
                size = int(declared[0])
            except ValueError:
                await self._refuse(scope, send, 400, "the Content-Length header is not a number")
                return
            if size > self.max_bytes:
                await self._refuse(scope, send, 413, self._too_large(f"it declares {size:,}"))
                return
        if self.pending >= self.max_pending:
            logger.warning("refused a request: %d request bodies are being read", self.pending)
            busy = "the server is reading too many requests; retry"
            await _refuse(scope, send, 503, busy, [_RETRY], jsonrpc=self.jsonrpc)
            return
        import anyio

        self.pending += 1
        try:
            with anyio.move_on_after(self.read_seconds) as timer:
                body = await self._read(scope, receive, send)
        finally:
            self.pending -= 1
        if timer.cancelled_caught:
            await self._refuse(
                scope, send, 408, f"the request body did not arrive within {self.read_seconds:g} s"
            )
            return
        if body is None:  # refused, or the client went away
            return
        refusal = None
        if self.check is not None:
            if len(body) <= _CHECK_ON_LOOP_BYTES:
                refusal = self.check(scope, body)
            else:
                refusal = await anyio.to_thread.run_sync(self.check, scope, body)
        if refusal is not None:
            await answer(send, *refusal)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope: Message, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None (answered 413, or the client went away)."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._refuse(scope, send, 413, self._too_large("more arrived"))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Message, send: Send, status: int, message: str) -> None:
        """Answer `status`: a JSON-RPC error (`jsonrpc`), else as `_refuse` does."""
        await _refuse(scope, send, status, message, jsonrpc=self.jsonrpc)

    def _too_large(self, what: str) -> str:
        return f"request body too large: at most {self.max_bytes:,} bytes are accepted ({what})"


#: The header of a 503 for too many pending bodies: try again in a second.
_RETRY = (b"retry-after", b"1")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the read body once, then passes on to the server's."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _refuse(
    scope: Message,
    send: Send,
    status: int,
    message: str,
    extra: Sequence[tuple[bytes, bytes]] = (),
    *,
    jsonrpc: bool = False,
) -> None:
    """Answer `status` and close the connection.

    A JSON-RPC error with id null (`jsonrpc`: as an MCP client reads one), else JSON under
    `/api` and text elsewhere.
    """
    if jsonrpc:
        await answer(send, *jsonrpc_refusal(status, JSONRPC_INVALID_REQUEST, message), extra)
        return
    path = scope.get("path", "")
    if path == "/api" or path.startswith("/api/"):
        body, kind = json.dumps({"detail": message, "status": status}).encode(), b"application/json"
    else:
        body, kind = f"{status}: {message}\n".encode(), b"text/plain; charset=utf-8"
    await answer(send, status, kind, body, extra)


async def answer(
    send: Send, status: int, kind: bytes, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Send a whole response of `status` (with `extra` headers) and close the connection."""
    headers = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestRate:
    """ASGI middleware: each identity makes at most `per_window` requests in any `window`.

    A request beyond it is answered 429 with a JSON-RPC error and a `Retry-After` header before
    its body is read; refused requests do not count, so a client that waits gets in again, and
    other identities are not affected. `DELETE` (ending an MCP session, which frees the server)
    is never refused. The identity is what `key` reads from the request (the user
    `serve.bearer.BearerGate` authenticated); a request without one is not counted, so the
    bookkeeping stays bounded by the configured users.

    Args:
        app: The application wrapped.
        per_window: Most requests per identity in a window.
        key: The identity of a request (None: not counted).
        window: The sliding window, in seconds.
        clock: Monotonic seconds (tests pass their own).

    Raises:
        ConfigError: `per_window` is not a positive integer or `window` not positive.
    """

    def __init__(
        self,
        app: ASGIApp,
        per_window: int = MAX_REQUESTS_PER_MINUTE,
        *,
        key: Callable[[Message], str | None],
        window: float = RATE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(per_window, bool) or not isinstance(per_window, int) or per_window < 1:
            raise ConfigError(
                f"the requests per token must be a positive integer, got {per_window!r}"
            )
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0:
            raise ConfigError(f"the rate window must be a positive number, got {window!r}")
        self.app, self.per_window, self.window = app, per_window, float(window)
        self.key, self.clock = key, clock
        self.seen: dict[str, deque[float]] = {}
        self._warned: dict[str, float] = {}

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        """Count the request against its identity's window, or refuse it with 429."""
        owner = self.key(scope) if scope["type"] == "http" else None
        if owner is None or scope.get("method") == "DELETE":
            await self.app(scope, receive, send)
            return
        now = self.clock()
        times = self.seen.setdefault(owner, deque())
        while times and now - times[0] >= self.window:
            times.popleft()
        if len(times) >= self.per_window:
            wait = max(1, int(self.window - (now - times[0]) + 0.999))
            if now - self._warned.get(owner, -self.window) >= self.window:  # once a window
                self._warned[owner] = now
                logger.warning(
                    "refused MCP requests: a token made %d in %g s", len(times), self.window
                )
            message = (
                f"too many requests: this token made {len(times)} in the last "
                f"{self.window:g} s (at most {self.per_window}); retry in {wait} s"
            )
            status, kind, body = jsonrpc_refusal(429, JSONRPC_INVALID_REQUEST, message)
            await answer(send, status, kind, body, [(b"retry-after", str(wait).encode())])
            return
        times.append(now)
        await self.app(scope, receive, send)
