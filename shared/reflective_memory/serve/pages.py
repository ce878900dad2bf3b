"""HTML pages: users, a user's sessions and memories, search, chat, and confirmed deletion.

Every state change is a POST carrying the CSRF token and ends in a redirect (post/redirect/get),
so reloading a page never repeats it. Blocking work runs in the thread pool.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from reflective_memory.serve import views
from reflective_memory.serve.chat import new_session_id
from reflective_memory.serve.context import (
    CSRF_FIELD,
    known_user,
    path_for,
    principal,
    require_csrf,
    state,
    visible_user,
)
from reflective_memory.serve.inspect import (
    delete_memory,
    delete_session,
    delete_user,
    memory_detail,
    parse_k,
    search,
    session_detail,
    user_detail,
    users_overview,
)
from reflective_memory.serve.rendering import render

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


async def _form(request: Request) -> FormData:
    form = await request.form()
    presented = form.get(CSRF_FIELD)
    require_csrf(request, presented if isinstance(presented, str) else None)
    return form


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        raise HTTPException(400, f"the form field {name!r} is required")
    return value


def _chat_url(user_id: str, session_id: str) -> str:
    return path_for("users", user_id, "chat") + "?" + urlencode({"session": session_id})


def _redirect(request: Request, target: str, notice: str | None = None, **kw: Any) -> Response:
    if notice is not None:
        key = state(request).flash(notice, owner=principal(request).name, **kw)
        sep = "&" if "?" in target else "?"
        anchor = ""
        if "#" in target:
            target, anchor = target.split("#", 1)
            anchor = "#" + anchor
        target = f"{target}{sep}notice={key}{anchor}"
    return RedirectResponse(target, status_code=303)


# ------------------------------------------------------------------ reading
@router.get("/")
async def index(request: Request) -> Response:
    """Every user the caller may see, with counts."""
    rows = await run_in_threadpool(users_overview, state(request).memory, principal(request))
    return render(request, "index.html", users=rows)


@router.get("/chat")
async def open_chat(request: Request, user: str | None = None) -> Response:
    """Go to a user's chat (the user may be new)."""
    if user is None or not user.strip():
        raise HTTPException(400, "give a user id to chat as")
    visible_user(request, user.strip())
    return RedirectResponse(path_for("users", user.strip(), "chat"), status_code=303)


@router.get("/users/{user_id}")
async def user_page(request: Request, user_id: str) -> Response:
    """A user's sessions and memories of every kind."""
    known_user(request, user_id)
    detail = await run_in_threadpool(user_detail, state(request).memory, user_id)
    return render(request, "user.html", user_id=user_id, **detail)


@router.get("/users/{user_id}/sessions/{session_id}")
async def session_page(request: Request, user_id: str, session_id: str) -> Response:
    """A session's turns and the memories built from it."""
    known_user(request, user_id)
    detail = await run_in_threadpool(session_detail, state(request).memory, user_id, session_id)
    return render(request, "session.html", user_id=user_id, session_id=session_id, **detail)


@router.get("/users/{user_id}/memories/{memory_id}")
async def memory_page(request: Request, user_id: str, memory_id: str) -> Response:
    """One memory with its source turns."""
    known_user(request, user_id)
    detail = await run_in_threadpool(memory_detail, state(request).memory, user_id, memory_id)
    return render(request, "memory.html", user_id=user_id, **detail)


@router.get("/users/{user_id}/search")
async def search_page(
    request: Request, user_id: str, q: str | None = None, k: str | None = None
) -> Response:
    """Ranked memories for a query, with the retrieval's diagnostics."""
    known_user(request, user_id)
    k_value = parse_k(k, state(request).chat.k)
    result = None
    if q is not None:
        result = await run_in_threadpool(search, state(request).memory, user_id, q, k_value)
    return render(request, "search.html", user_id=user_id, q=q or "", k=k_value, result=result)


@router.get("/users/{user_id}/chat")
async def chat_page(request: Request, user_id: str, session: str | None = None) -> Response:
    """Chat in one session; each reply shows the memories it used and why."""
    visible_user(request, user_id)
    st = state(request)
    if session is None or not session.strip():
        open_ids = await run_in_threadpool(st.memory.open_sessions, user_id)
        sid = open_ids[-1] if open_ids else new_session_id()
        return RedirectResponse(_chat_url(user_id, sid), status_code=303)

    def load() -> dict[str, Any]:
        turns = st.memory.turns(user_id)
        sessions = views.session_views(turns, st.memory.open_sessions(user_id))
        here = [views.turn_view(t) for t in turns if t.session_id == session]
        exchanges = {
            e.assistant_turn_id: views.exchange_view(e) for e in st.chat.exchanges(user_id, session)
        }
        return {"sessions": sessions, "turns": here, "exchanges": exchanges}

    data = await run_in_threadpool(load)
    is_open = session in [s["session_id"] for s in data["sessions"] if s["status"] == "open"]
    is_new = session not in [s["session_id"] for s in data["sessions"]]
    return render(
        request,
        "chat.html",
        user_id=user_id,
        session_id=session,
        session_open=is_open or is_new,
        **data,
    )


# ------------------------------------------------------------------ changing
@router.post("/users/{user_id}/chat")
async def chat_send(request: Request, user_id: str) -> Response:
    """Send a message in a session."""
    visible_user(request, user_id)
    form = await _form(request)
    session_id = _field(form, "session_id")
    message = form.get("message")
    st = state(request)
    ex = await run_in_threadpool(
        st.chat.send, user_id, session_id, message if isinstance(message, str) else ""
    )
    target = _chat_url(user_id, session_id)
    return _redirect(request, f"{target}#ex-{ex.exchange_id}")


@router.post("/users/{user_id}/sessions/new")
async def session_new(request: Request, user_id: str) -> Response:
    """End the user's open sessions (they become memories) and open a new one."""
    visible_user(request, user_id)
    await _form(request)
    sid, ended = await run_in_threadpool(state(request).chat.start_session, user_id)
    notice = None
    if ended:
        notice = f"Ended {len(ended)} session(s): {', '.join(ended)}; their turns are memories now."
    target = _chat_url(user_id, sid)
    return _redirect(request, target, notice)


@router.post("/users/{user_id}/sessions/{session_id}/end")
async def session_end(request: Request, user_id: str, session_id: str) -> Response:
    """Turn a session into memories."""
    known_user(request, user_id)
    form = await _form(request)
    made = await run_in_threadpool(state(request).chat.end_session, user_id, session_id)
    kinds: dict[str, int] = {}
    for m in made:
        kinds[m.granularity] = kinds.get(m.granularity, 0) + 1
    notice = f"Session {session_id} ended: {len(made)} memories {kinds}."
    if form.get("next") == "chat":
        target = _chat_url(user_id, session_id)
    else:
        target = path_for("users", user_id, "sessions", session_id)
    return _redirect(request, target, notice)


@router.post("/users/{user_id}/feedback")
async def feedback(request: Request, user_id: str) -> Response:
    """Mark a recalled memory helpful or not; the mark trains the user's reranker."""
    known_user(request, user_id)
    form = await _form(request)
    exchange_id = _field(form, "exchange_id")
    try:
        position = int(_field(form, "hit"))
    except ValueError as exc:
        raise HTTPException(400, "the form field 'hit' must be a whole number") from exc
    helpful_raw = _field(form, "helpful")
    if helpful_raw not in ("1", "0"):
        raise HTTPException(400, "the form field 'helpful' must be 1 or 0")
    st = state(request)
    result = await run_in_threadpool(
        st.chat.mark, user_id, exchange_id, position, helpful_raw == "1"
    )
    ex = st.chat.exchange(user_id, exchange_id)
    verdict = "helpful" if helpful_raw == "1" else "not helpful"
    if result.learned:
        notice = (
            f"Marked memory [{position}] {verdict}: the turn ranker got an episode with "
            f"{len(result.rewards)} rewards ({result.pending} waiting to be stored)."
        )
    else:
        notice = f"Marked memory [{position}] {verdict}; nothing learned: {result.reason}"
    target = _chat_url(user_id, ex.session_id)
    return _redirect(request, f"{target}#ex-{exchange_id}", notice)


# ------------------------------------------------------------------ deleting
@router.get("/users/{user_id}/delete")
async def user_delete_confirm(request: Request, user_id: str) -> Response:
    """Ask before deleting a user."""
    known_user(request, user_id)
    stats = await run_in_threadpool(state(request).memory.stats, user_id)
    return render(
        request,
        "confirm.html",
        user_id=user_id,
        what=f"user {user_id}",
        detail=f"{stats['turns']} turns, {stats['sessions']} sessions, "
        f"{stats['memories']} memories and the user's reranker",
        action=path_for("users", user_id, "delete"),
        back=path_for("users", user_id),
    )


@router.post("/users/{user_id}/delete")
async def user_delete(request: Request, user_id: str) -> Response:
    """Delete a user and verify that nothing of theirs is left."""
    known_user(request, user_id)
    await _form(request)
    report = await run_in_threadpool(delete_user, state(request), user_id)
    return _redirect(request, "/", report["message"])


@router.get("/users/{user_id}/sessions/{session_id}/delete")
async def session_delete_confirm(request: Request, user_id: str, session_id: str) -> Response:
    """Ask before deleting a session."""
    known_user(request, user_id)
    detail = await run_in_threadpool(session_detail, state(request).memory, user_id, session_id)
    return render(
        request,
        "confirm.html",
        user_id=user_id,
        what=f"session {session_id} of user {user_id}",
        detail=f"{len(detail['turns'])} turns and {len(detail['memories'])} memories built "
        "from them",
        action=path_for("users", user_id, "sessions", session_id, "delete"),
        back=path_for("users", user_id, "sessions", session_id),
    )


@router.post("/users/{user_id}/sessions/{session_id}/delete")
async def session_delete(request: Request, user_id: str, session_id: str) -> Response:
    """Delete a session and verify that it is gone."""
    known_user(request, user_id)
    await _form(request)
    report = await run_in_threadpool(delete_session, state(request), user_id, session_id)
    left = user_id in await run_in_threadpool(state(request).memory.users)
    return _redirect(request, path_for("users", user_id) if left else "/", report["message"])


@router.get("/users/{user_id}/memories/{memory_id}/delete")
async def memory_delete_confirm(request: Request, user_id: str, memory_id: str) -> Response:
    """Ask before deleting a memory."""
    known_user(request, user_id)
    detail = await run_in_threadpool(memory_detail, state(request).memory, user_id, memory_id)
    mem = detail["memory"]
    return render(
        request,
        "confirm.html",
        user_id=user_id,
        what=f"{mem['granularity']} memory {memory_id}",
        detail=mem["text"],
        action=path_for("users", user_id, "memories", memory_id, "delete"),
        back=path_for("users", user_id, "memories", memory_id),
    )


@router.post("/users/{user_id}/memories/{memory_id}/delete")
async def memory_delete(request: Request, user_id: str, memory_id: str) -> Response:
    """Delete one memory and verify that it is gone."""
    known_user(request, user_id)
    await _form(request)
    report = await run_in_threadpool(delete_memory, state(request), user_id, memory_id)
    return _redirect(request, path_for("users", user_id), report["message"])


@router.get("/api")
async def api_page(request: Request) -> Response:
    """The JSON API's routes, listed from the OpenAPI schema."""
    schema = request.app.openapi()
    routes = [
        {"method": method.upper(), "path": path, "summary": op.get("summary", "")}
        for path, ops in schema.get("paths", {}).items()
        for method, op in ops.items()
    ]
    return render(request, "api.html", routes=routes)
