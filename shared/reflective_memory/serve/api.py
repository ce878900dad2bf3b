"""The JSON API under `/api/`: the same reads, chat, feedback and deletions as the pages.

State-changing calls are POSTs. A client authenticated by `Authorization: Bearer <token>` needs
nothing else; any other client (an open local app, a browser holding the token cookie) sends
the CSRF token from `GET /api/csrf` in the `X-CSRF-Token` header. Errors are
`{"detail": ..., "status": ...}` with 400 (bad input), 401/403 (token), 404 (unknown id).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from reflective_memory.serve import inspect, views
from reflective_memory.serve.chat import MAX_MESSAGE_CHARS, new_session_id
from reflective_memory.serve.context import (
    known_user,
    principal,
    require_csrf,
    state,
    visible_user,
)

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["api"])

_CSRF = Header(default=None, alias="X-CSRF-Token", description="token from GET /api/csrf")


class ChatIn(BaseModel):
    """A chat message."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    session_id: str | None = Field(
        default=None, max_length=512, description="session to talk in (default: a new one)"
    )


class FeedbackIn(BaseModel):
    """A helpful / not-helpful mark on one hit of a chat reply."""

    exchange_id: str = Field(min_length=1, description="the reply's exchange_id")
    hit: int = Field(ge=0, description="position of the hit in the reply's hits")
    helpful: bool


@router.get("/csrf", summary="CSRF token for POSTs without an Authorization header")
def csrf(request: Request) -> dict[str, str]:
    """The caller's CSRF token."""
    return {"csrf_token": state(request).policy.csrf_token(principal(request))}


@router.get("/users", summary="Users the caller may see, with counts")
def users(request: Request) -> dict[str, Any]:
    """Every visible user with turn, session and memory counts."""
    return {"users": inspect.users_overview(state(request).memory, principal(request))}


@router.get("/users/{user_id}", summary="A user's counts, sessions and memories by kind")
def user(request: Request, user_id: str) -> dict[str, Any]:
    """Sessions and memory units (with provenance) of one user."""
    known_user(request, user_id)
    return {"user_id": user_id, **inspect.user_detail(state(request).memory, user_id)}


@router.get("/users/{user_id}/sessions/{session_id}", summary="A session's turns and memories")
def session(request: Request, user_id: str, session_id: str) -> dict[str, Any]:
    """Turns of one session and the memories built from them."""
    known_user(request, user_id)
    detail = inspect.session_detail(state(request).memory, user_id, session_id)
    return {"user_id": user_id, "session_id": session_id, **detail}


@router.get("/users/{user_id}/memories/{memory_id}", summary="One memory and its source turns")
def memory(request: Request, user_id: str, memory_id: str) -> dict[str, Any]:
    """A memory unit with the turns it was built from."""
    known_user(request, user_id)
    return {"user_id": user_id, **inspect.memory_detail(state(request).memory, user_id, memory_id)}


@router.get("/users/{user_id}/search", summary="Ranked memories for a query, with diagnostics")
def search(request: Request, user_id: str, q: str, k: str | None = None) -> dict[str, Any]:
    """Retrieve like the chat does and show path, scores, reranker movement and timings."""
    known_user(request, user_id)
    st = state(request)
    return inspect.search(st.memory, user_id, q, inspect.parse_k(k, st.chat.k))


@router.get("/users/{user_id}/exchanges/{exchange_id}", summary="A chat reply with its memories")
def exchange(request: Request, user_id: str, exchange_id: str) -> dict[str, Any]:
    """A reply held by this server: message, answer, citations, hits, feedback."""
    visible_user(request, user_id)
    return views.exchange_view(state(request).chat.exchange(user_id, exchange_id))


@router.post("/users/{user_id}/chat", summary="Send a message; get the cited reply")
async def chat(
    request: Request, user_id: str, body: ChatIn, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """Store the message, retrieve memories for it, answer with citations, store the answer."""
    visible_user(request, user_id)
    require_csrf(request, x_csrf_token)
    sid = body.session_id if body.session_id is not None else new_session_id()
    ex = await run_in_threadpool(state(request).chat.send, user_id, sid, body.message)
    return views.exchange_view(ex)


@router.post("/users/{user_id}/sessions/{session_id}/end", summary="Turn a session into memories")
async def end_session(
    request: Request, user_id: str, session_id: str, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """End a session: its turns become memory units."""
    known_user(request, user_id)
    require_csrf(request, x_csrf_token)
    made = await run_in_threadpool(state(request).chat.end_session, user_id, session_id)
    return {"session_id": session_id, "memories": [views.memory_view(m) for m in made]}


@router.post("/users/{user_id}/feedback", summary="Mark a recalled memory helpful or not")
async def feedback(
    request: Request, user_id: str, body: FeedbackIn, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """Train the user's reranker with the reply's citations, corrected by this mark."""
    known_user(request, user_id)
    require_csrf(request, x_csrf_token)
    result = await run_in_threadpool(
        state(request).chat.mark, user_id, body.exchange_id, body.hit, body.helpful
    )
    return views.feedback_view(result)


@router.post("/users/{user_id}/delete", summary="Delete a user (verified)")
async def delete_user(
    request: Request, user_id: str, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """Delete every turn, memory and the reranker of a user."""
    known_user(request, user_id)
    require_csrf(request, x_csrf_token)
    return await run_in_threadpool(inspect.delete_user, state(request), user_id)


@router.post("/users/{user_id}/sessions/{session_id}/delete", summary="Delete a session (verified)")
async def delete_session(
    request: Request, user_id: str, session_id: str, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """Delete a session's turns and memories."""
    known_user(request, user_id)
    require_csrf(request, x_csrf_token)
    return await run_in_threadpool(inspect.delete_session, state(request), user_id, session_id)


@router.post("/users/{user_id}/memories/{memory_id}/delete", summary="Delete a memory (verified)")
async def delete_memory(
    request: Request, user_id: str, memory_id: str, x_csrf_token: str | None = _CSRF
) -> dict[str, Any]:
    """Delete one memory unit."""
    known_user(request, user_id)
    require_csrf(request, x_csrf_token)
    return await run_in_threadpool(inspect.delete_memory, state(request), user_id, memory_id)
