"""What every route needs: the app's state, who is asking, per-user rights and CSRF checks."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request

from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError, UnknownUserError
from reflective_memory.serve.chat import ChatService
from reflective_memory.serve.security import AccessPolicy, Principal
from reflective_memory.validation import check_id

__all__ = [
    "ServeState",
    "state",
    "principal",
    "visible_user",
    "known_user",
    "require_csrf",
    "path_for",
    "CSRF_FIELD",
    "CSRF_HEADER",
]

#: Form field and header that carry the CSRF token.
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

_MAX_FLASHES = 256


@dataclass
class ServeState:
    """The running app's parts.

    Attributes:
        memory: The store.
        chat: The chat service over it.
        policy: Tokens and CSRF secret.
        llm_name: What answers (`offline extractive` or the LLM's name), for the pages.
        flashes: One-shot notices shown after a redirect, by random id.
    """

    memory: ReflectiveMemory
    chat: ChatService
    policy: AccessPolicy
    llm_name: str
    flashes: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def flash(self, message: str, *, kind: str = "info", owner: str = "") -> str:
        """Keep a notice for the next page; return its id (for `?notice=`)."""
        key = secrets.token_urlsafe(12)
        with self.lock:
            self.flashes[key] = {"message": message, "kind": kind, "owner": owner}
            while len(self.flashes) > _MAX_FLASHES:
                self.flashes.popitem(last=False)
        return key

    def take_flash(self, key: str | None, owner: str) -> dict[str, Any] | None:
        """The notice with id `key` if it belongs to `owner` (shown once)."""
        if not key:
            return None
        with self.lock:
            found = self.flashes.get(key)
            if found is None or found["owner"] != owner:
                return None
            return self.flashes.pop(key)


def state(request: Request) -> ServeState:
    """The app's `ServeState`."""
    return request.app.state.serve  # type: ignore[no-any-return]


def principal(request: Request) -> Principal:
    """Who the request acts as (set by the access middleware)."""
    return request.state.principal  # type: ignore[no-any-return]


def visible_user(request: Request, user_id: str) -> str:
    """Check a user id from the URL and the caller's right to it (the user may be new).

    Raises:
        HTTPException: 400 for a malformed id, 403 when the token has no right to the user.
    """
    try:
        check_id("user_id", user_id)
    except InvalidInputError as exc:
        raise HTTPException(400, str(exc)) from exc
    if not principal(request).may_see(user_id):
        raise HTTPException(403, f"this access token has no rights to user {user_id!r}")
    return user_id


def known_user(request: Request, user_id: str) -> str:
    """Like `visible_user`, and the user must have something stored.

    Raises:
        UnknownUserError: Nothing is stored for the user (shown as 404).
    """
    visible_user(request, user_id)
    if user_id not in state(request).memory.users():
        raise UnknownUserError(f"no user {user_id!r}: nothing is stored for that id")
    return user_id


def require_csrf(request: Request, presented: str | None) -> None:
    """Reject a state-changing request without the caller's CSRF token.

    Requests authenticated by an `Authorization` header need none (a browser never adds that
    header to a cross-site request on its own).

    Raises:
        HTTPException: 403 when the token is missing or wrong.
    """
    if getattr(request.state, "header_auth", False):
        return
    if not state(request).policy.check_csrf(principal(request), presented):
        raise HTTPException(
            403,
            "missing or invalid CSRF token: reload the page and try again (API clients: send "
            "the token from GET /api/csrf in the X-CSRF-Token header)",
        )


def path_for(*parts: str) -> str:
    """An absolute URL path from raw segments, each percent-encoded."""
    return "/" + "/".join(quote(p, safe="") for p in parts)
