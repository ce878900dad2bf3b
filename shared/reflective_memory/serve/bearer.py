"""Who an HTTP MCP request acts for, settled before anything of its body is read.

`BearerGate` is the first layer of the MCP HTTP app (after tracing). A request must carry
exactly one `Authorization` header: with two or more it is answered 400, so no later layer can
read another header than the one the SDK authenticates with. Its bearer token must be one the
server knows (`TokenUsers`), else it is answered 401 with `WWW-Authenticate: Bearer`, as the
SDK answers, without a byte of its body read or parsed: a client without a valid token costs
one header comparison, whatever body it sends or stalls.

The user the token stands for is put in the request's scope (`identity(scope)`); the request
rate and the session quota count by it, so every limit is keyed by the same user the tools act
for (`mcp.token_user` reads it from the SDK's check of the same single header).
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any, Protocol

from reflective_memory.serve.limits import (
    JSONRPC_INVALID_REQUEST,
    ASGIApp,
    Receive,
    Send,
    answer,
    jsonrpc_refusal,
)

__all__ = ["BearerGate", "TokenCheck", "identity", "authorization", "IDENTITY_KEY"]

#: The scope key holding the user an authenticated request acts for.
IDENTITY_KEY = "reflective_memory.user"


class TokenCheck(Protocol):
    """What the gate asks about a token: the SDK's `TokenVerifier` (`mcp.TokenUsers`)."""

    async def verify_token(self, token: str) -> Any:
        """The token's access (its `subject` is the user), or None."""
        ...


def authorization(scope: MutableMapping[str, Any]) -> list[bytes]:
    """Every `Authorization` header value of a request, in order."""
    return [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]


def identity(scope: MutableMapping[str, Any]) -> str | None:
    """The user a request that passed `BearerGate` acts for (None: it did not pass one)."""
    user = scope.get(IDENTITY_KEY)
    return user if isinstance(user, str) else None


async def _unauthorized(send: Send, description: str) -> None:
    """401 as the SDK's `RequireAuthMiddleware` answers it (JSON and `WWW-Authenticate`)."""
    body = json.dumps({"error": "invalid_token", "error_description": description}).encode()
    challenge = f'Bearer error="invalid_token", error_description="{description}"'
    await answer(send, 401, b"application/json", body, [(b"www-authenticate", challenge.encode())])


class BearerGate:
    """ASGI middleware: one `Authorization: Bearer <token>` of a known user, or no entry.

    Args:
        app: The application wrapped (the limits, then the SDK's app).
        tokens: Checks a token and names its user (`subject`).
    """

    def __init__(self, app: ASGIApp, tokens: TokenCheck) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """Authenticate from the request's headers alone, then let the app see it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.pop(IDENTITY_KEY, None)  # only this gate sets it
        values = authorization(scope)
        if len(values) > 1:
            message = f"the request carries {len(values)} Authorization headers (give exactly one)"
            await answer(send, *jsonrpc_refusal(400, JSONRPC_INVALID_REQUEST, message))
            return
        header = values[0].decode("latin-1") if values else ""
        if not header.lower().startswith("bearer "):
            await _unauthorized(send, "Authentication required")
            return
        access = await self.tokens.verify_token(header[7:])  # as the SDK's backend reads it
        user = getattr(access, "subject", None)
        if not isinstance(user, str) or not user:
            await _unauthorized(send, "Authentication required")
            return
        scope[IDENTITY_KEY] = user
        await self.app(scope, receive, send)
