"""The web app: `create_app` wires the store, chat, access rules, pages and JSON API together.

Everything runs in one process over one `ReflectiveMemory`. Pages are rendered on the server
(Jinja2, autoescaping on: every memory text is shown as text), forms post with a CSRF token,
and there is no JavaScript. The JSON API lives under `/api/`; its OpenAPI schema is served at
`/api/openapi.json` and summarised at `/api` (no page loads anything from another site).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from urllib.parse import urlencode

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from reflective_memory import __version__, tracing
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    LLMError,
    ReflectiveMemoryError,
    StoreClosedError,
    UnknownMemoryError,
    UnknownSessionError,
    UnknownUserError,
)
from reflective_memory.serve import api, pages
from reflective_memory.serve.answer import OfflineAnswerer
from reflective_memory.serve.chat import Answerer, ChatService, UnknownExchangeError
from reflective_memory.serve.context import ServeState, state
from reflective_memory.serve.limits import MAX_BODY_BYTES, BodyLimit, check_body_limit
from reflective_memory.serve.rendering import render, templates
from reflective_memory.serve.security import AccessPolicy

__all__ = ["create_app", "TOKEN_COOKIE"]

logger = logging.getLogger(__name__)

#: Cookie that keeps a browser's access token after it opened `/?token=...` once.
TOKEN_COOKIE = "rm_token"

_SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def _status(exc: ReflectiveMemoryError) -> int:
    if isinstance(
        exc, (UnknownUserError, UnknownSessionError, UnknownMemoryError, UnknownExchangeError)
    ):
        return 404
    if isinstance(exc, (InvalidInputError, ConfigError)):
        return 400
    if isinstance(exc, StoreClosedError):
        return 503
    if isinstance(exc, LLMError):
        return 502
    return 500


def _wants_json(request: Request) -> bool:
    return request.url.path == "/api" or request.url.path.startswith("/api/")


def _error(request: Request, status: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"detail": message, "status": status}, status_code=status)
    return render(request, "error.html", status=status, status_code=status, message=message)


def _host_allowed(host_header: str, allowed: set[str]) -> bool:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8765
        host = host[: host.find("]") + 1]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    return host in allowed


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def create_app(
    memory: ReflectiveMemory,
    *,
    answerer: Answerer | None = None,
    policy: AccessPolicy | None = None,
    allowed_hosts: list[str] | None = None,
    k: int = 5,
    llm_name: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """Build the web app over an open `ReflectiveMemory` (the caller closes it).

    Args:
        memory: The store to inspect and chat with.
        answerer: Makes the replies (default: `OfflineAnswerer` with the store's embedder).
        policy: Access tokens and CSRF secret (default: open, for a loopback bind).
        allowed_hosts: Accepted `Host` header names (without port); `None` accepts any. An open
            app on 127.0.0.1 should list only loopback names, so a page on another site that
            re-points its domain to 127.0.0.1 (DNS rebinding) cannot read it.
        k: Memories retrieved per chat message and by default per search.
        llm_name: Shown on the pages as what answers.
        max_body_bytes: Largest request body accepted (default 1 MiB); a larger one is
            refused with 413 before it is read (by its Content-Length) or as soon as more
            arrives (chunked), ahead of access, CSRF and form or JSON parsing.

    Returns:
        The FastAPI application (serve it with uvicorn).

    Raises:
        ConfigError: `max_body_bytes` is not a positive integer.
    """
    max_body_bytes = check_body_limit(max_body_bytes)
    answerer = answerer if answerer is not None else OfflineAnswerer(memory.embedder)
    policy = policy if policy is not None else AccessPolicy()
    if llm_name is None:
        describe = getattr(answerer, "describe", None)
        llm_name = describe() if callable(describe) else "offline extractive answerer"
    app = FastAPI(
        title="reflective-memory inspector",
        version=__version__,
        description="Inspect, search, chat with and prune a reflective-memory store.",
        openapi_url="/api/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.serve = ServeState(
        memory=memory,
        chat=ChatService(memory, answerer, k=k),
        policy=policy,
        llm_name=llm_name,
    )
    app.state.templates = templates()
    hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    @app.middleware("http")
    async def access(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if hosts is not None and not _host_allowed(request.headers.get("host", ""), hosts):
            return JSONResponse(
                {"detail": "this Host header is not served here", "status": 400}, 400
            )
        pol = state(request).policy
        header_token = _bearer(request)
        query_token = request.query_params.get("token")
        token = header_token or query_token or request.cookies.get(TOKEN_COOKIE)
        who = pol.authenticate(token)
        if who is None:
            request.state.principal = None
            msg = (
                "an access token is required: open the address printed by `reflective-memory "
                "serve` (it ends in ?token=...) or send 'Authorization: Bearer <token>'"
            )
            if token:
                msg = "this access token is not valid"
            response = _error(request, 401, msg)
        elif query_token and not pol.open and request.method == "GET":
            # Keep the token in an HttpOnly cookie and take it out of the address bar.
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(
                TOKEN_COOKIE, query_token, httponly=True, samesite="strict", path="/"
            )
        else:
            request.state.principal = who
            request.state.header_auth = header_token is not None and not pol.open
            response = await call_next(request)
        for key, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    @app.exception_handler(ReflectiveMemoryError)
    async def memory_error(request: Request, exc: ReflectiveMemoryError) -> Response:
        status = _status(exc)
        if status >= 500:
            logger.exception("request failed", exc_info=exc)
        return _error(request, status, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no page at {request.url.path}"
        if exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return _error(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where}: {err.get('msg', 'invalid')}")
        return _error(request, 400, "bad request: " + "; ".join(problems))

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(tracing.TracedASGI)  # outermost: runs first (a span per request)
    static = resources.files("reflective_memory.serve") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    return app
