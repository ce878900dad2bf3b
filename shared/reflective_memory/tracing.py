"""OpenTelemetry traces of the memory's operations, free when nobody collects them.

With `opentelemetry-api` installed (the `otel` extra) and a tracer provider configured, the
library emits one span per operation, with counts, timings, the path taken and LLM token usage
as attributes:

* `add_turns` (and `add_turn`), `end_session` (also when a session rule ends one inside a
  write), `feedback`;
* `retrieval reflective_memory` (`retrieve`), with a child span per pipeline stage (the names of
  `diagnostics["timings_ms"]`) and one for loading the user's index;
* `text_completion` for every LLM call, with `gen_ai.usage.input_tokens` / `output_tokens`;
* `tools/call <tool>` for each MCP tool call, and `<METHOD> <route>` for each HTTP request of
  the web app and the MCP server over HTTP (`TracedASGI`; a `traceparent` header is honoured).

The GenAI semantic conventions are used where they fit (`gen_ai.operation.name` `retrieval`,
`text_completion`, `execute_tool`; `gen_ai.request.top_k`; `gen_ai.usage.*`; `mcp.method.name`;
`error.type`); the rest are `reflective_memory.*` attributes.

No attribute holds user text (turns, queries, answers, prompts, completions, speaker names,
exception messages), nor a raw user or session id: a user is `enduser.pseudo.id`, a session
`gen_ai.conversation.id`, each a keyed hash (HMAC-SHA256, 128 bits in hex). The key is
`REFLECTIVE_MEMORY_TRACE_KEY` from the environment or `set_hash_key`; without either each process
draws a random key, so pseudonyms match within a process only. Give every process the same key
to follow a user across a fleet; `pseudonym(user_id)` gives the value to search for.

Nothing of OpenTelemetry is imported by this module. Each operation asks `tracer()`, which
answers `None` (and the operation pays one dictionary lookup) unless OpenTelemetry was imported
by the application and a real provider is set globally (`opentelemetry.trace.set_tracer_provider`)
or here (`set_tracer_provider`).

Example:
    >>> from reflective_memory import tracing
    >>> tracing.tracer() is None  # no provider configured
    True
    >>> len(tracing.pseudonym("ana"))
    32
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from reflective_memory.retrieval.state import RetrievalState
    from reflective_memory.rmm.answer_feedback import FeedbackResult
    from reflective_memory.types import Memory, Retrieval, Turn

__all__ = [
    "KEY_ENV",
    "TRACER_NAME",
    "RETRIEVAL_SPAN",
    "RETRIEVAL_ATTRIBUTES",
    "set_tracer_provider",
    "set_hash_key",
    "pseudonym",
    "tracer",
    "span",
    "describe",
    "retrieval_attributes",
    "stage_attributes",
    "usage_attributes",
    "feedback_attributes",
    "session_attributes",
    "turns_attributes",
    "TracedASGI",
    "HTTP_METHODS",
]

logger = logging.getLogger(__name__)

#: Environment variable holding the key of the user and session pseudonyms.
KEY_ENV = "REFLECTIVE_MEMORY_TRACE_KEY"
#: The instrumentation scope of every span.
TRACER_NAME = "reflective_memory"

#: The name of a `retrieve` span and its attributes (the GenAI conventions' retrieval).
RETRIEVAL_SPAN = "retrieval reflective_memory"
RETRIEVAL_ATTRIBUTES = {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": TRACER_NAME}
#: An attribute value (what OpenTelemetry accepts).
AttributeValue = str | bool | int | float

_OFF: AbstractContextManager[None] = nullcontext(None)
_lock = threading.Lock()
_provider: TracerProvider | None = None  # set here; None: the global provider
_cached: tuple[Any, Tracer] | None = None  # (provider, its tracer)
_key: bytes | None = None
_env_checked = False  # the API was asked once (it loads a provider the environment names)
_MISSING = object()


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Send this library's spans to `provider` instead of the global one (`None`: global again).

    OpenTelemetry's global provider can be set once per process; this one can be changed at
    any time (tests give each test its own provider and in-memory exporter).

    Args:
        provider: Any OpenTelemetry `TracerProvider`, or `None`.
    """
    global _provider, _cached
    with _lock:
        _provider, _cached = provider, None


def set_hash_key(key: str | bytes | None) -> None:
    """Set the key of the user and session pseudonyms (`None`: the environment's, or random).

    Args:
        key: A secret shared by the processes whose traces should name a user alike.
    """
    global _key
    _key = key.encode("utf-8") if isinstance(key, str) else key


def _hash_key() -> bytes:
    global _key
    if _key is None:
        configured = os.environ.get(KEY_ENV)
        with _lock:
            if _key is None:
                _key = configured.encode("utf-8") if configured else os.urandom(32)
    return _key


def pseudonym(*ids: str) -> str:
    """The keyed hash (HMAC-SHA256, 32 hex digits) traces carry instead of an id.

    Args:
        ids: A user id, or a user id and a session id (a session is named within its user).

    Returns:
        The pseudonym, stable for one key.
    """
    message = "\x00".join(ids).encode("utf-8", "surrogatepass")
    return hmac.new(_hash_key(), message, hashlib.sha256).hexdigest()[:32]


def tracer() -> Tracer | None:
    """The tracer of this library's spans, or `None` while nobody collects them.

    `None` when no provider was given to `set_tracer_provider` and either OpenTelemetry was
    never imported (so no provider can be set) or the global provider is still the API's
    default (proxy or no-op).
    """
    global _cached
    provider: Any = _provider
    if provider is None:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:
            return None
        # `get_tracer_provider()` looks up an environment variable on each call while no
        # provider is set (about 2 µs, more than a stage of a small retrieval): read the API's
        # global first, and ask the API once it holds a provider (or if it has no such global).
        if getattr(trace, "_TRACER_PROVIDER", _MISSING) is None and _env_checked:
            return None
        provider = _global_provider(trace)
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    from opentelemetry import trace as api

    from reflective_memory import __version__

    made = api.get_tracer(TRACER_NAME, __version__, tracer_provider=provider)
    with _lock:
        _cached = (provider, made)
    return made


def _global_provider(trace: Any) -> Any:
    """The API's global provider (the first call also loads one named by the environment)."""
    global _env_checked
    provider = trace.get_tracer_provider()
    _env_checked = True
    return provider


def span(
    name: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    kind: str = "internal",
    headers: Mapping[str, str] | None = None,
) -> AbstractContextManager[Span | None]:
    """A span around a block, current inside it; yields `None` when nobody collects it.

    Set what the block found with `describe` (worked out only while the span records). An
    exception ends the span with an error status and `error.type` (its class;
    `reflective_memory.error.cause`: its cause's), never its message, which may quote user text.

    Args:
        name: The span's name.
        attributes: Attributes set at its start.
        user_id: The user the operation acts for, recorded as `enduser.pseudo.id`.
        session_id: With `user_id`, the session, recorded as `gen_ai.conversation.id`.
        kind: `internal`, `server` (a request handled) or `client` (a call out, e.g. an LLM).
        headers: Incoming request headers (lower-case names) whose trace context the span
            continues (`traceparent`).

    Returns:
        A context manager yielding the recording span, or `None`.
    """
    active = tracer()
    if active is None:
        return _OFF
    return _live(active, name, attributes, user_id, session_id, kind, headers)


def describe(span: Span | None, attributes: Callable[..., Mapping[str, Any]], *args: Any) -> None:
    """Set `attributes(*args)` on `span`, if any; a failure is logged, never raised.

    What a span says about an operation is worked out only while the span records, and a
    mistake in it never fails the operation.

    Args:
        span: The span (`None`: nothing is computed).
        attributes: Makes the attributes from `args` (e.g. `retrieval_attributes`).
        args: Its arguments.
    """
    if span is None:
        return
    try:
        span.set_attributes(attributes(*args))
    except Exception:
        logger.exception("could not describe the span %s", getattr(span, "name", "?"))


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


@contextmanager
def _live(
    active: Tracer,
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    user_id: str | None,
    session_id: str | None,
    kind: str,
    headers: Mapping[str, str] | None,
) -> Iterator[Span | None]:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    attrs: dict[str, AttributeValue] = {} if attributes is None else dict(attributes)
    if isinstance(user_id, str):  # not checked yet: a call's own check refuses a bad one
        attrs["enduser.pseudo.id"] = pseudonym(user_id)
        if isinstance(session_id, str):
            attrs["gen_ai.conversation.id"] = pseudonym(user_id, session_id)
    context = None
    if headers is not None:
        from opentelemetry.propagate import extract

        context = extract(headers)
    with active.start_as_current_span(
        name,
        context=context,
        kind=SpanKind[kind.upper()],
        attributes=attrs,
        record_exception=False,  # its message may quote user text
        set_status_on_exception=False,
    ) as current:
        try:
            yield current if current.is_recording() else None
        except BaseException as exc:
            current.set_attribute("error.type", _error_type(exc))
            if exc.__cause__ is not None:
                current.set_attribute("reflective_memory.error.cause", _error_type(exc.__cause__))
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


# -- attributes of results (counts, paths, timings; never text) -------------------------------
def retrieval_attributes(out: Retrieval) -> dict[str, AttributeValue]:
    """A `retrieve` span's attributes: counts, the path taken, time, LLM usage.

    Args:
        out: The retrieval.

    Returns:
        Attribute name -> value.
    """
    diag = out.diagnostics
    attrs: dict[str, AttributeValue] = {
        "reflective_memory.retrieval.id": out.retrieval_id,
        "reflective_memory.path": str(diag.get("path", "")),
        "reflective_memory.mode": str(diag.get("mode", "")),
        "reflective_memory.hits": len(out.hits),
        "reflective_memory.index_size": int(diag.get("index_size", 0)),
    }
    if diag.get("k") is not None:
        attrs["gen_ai.request.top_k"] = int(diag["k"])
    if diag.get("budget_tokens") is not None:
        attrs["reflective_memory.budget_tokens"] = int(diag["budget_tokens"])
    for name, count in diag.get("candidates", {}).items():
        attrs[f"reflective_memory.candidates.{name}"] = int(count)
    if "rounds" in diag:
        attrs["reflective_memory.recall.rounds"] = int(diag["rounds"])
    attrs["reflective_memory.reranked"] = out.rerank is not None
    reflection = diag.get("reflection")
    if reflection is not None:  # its rounds hold queries and keywords: only the outcome
        attrs["reflective_memory.reflection.stopped"] = str(reflection["stopped"])
    passages = diag.get("passages")
    if passages is not None:
        for key in ("units_ranked", "turns_voted", "turns_packed", "tokens_used"):
            attrs[f"reflective_memory.retrieval.passages.{key}"] = int(passages[key])
    timings = diag.get("timings_ms", {})
    if "total" in timings:
        attrs["reflective_memory.duration_ms"] = float(timings["total"])
    if out.usage.llm_calls:
        attrs.update(usage_attributes(out.usage.prompt_tokens, out.usage.completion_tokens))
        attrs["reflective_memory.llm_calls"] = out.usage.llm_calls
    return attrs


def stage_attributes(
    name: str, widened: int, state: RetrievalState, ms: float
) -> dict[str, AttributeValue]:
    """A pipeline stage's span attributes: its name, the widening round, counts, time.

    Args:
        name: The stage's name.
        widened: How often the pipeline widened the candidate pool before this run.
        state: The retrieval's state after the stage.
        ms: The stage's time.

    Returns:
        Attribute name -> value.
    """
    return {
        "reflective_memory.stage": name,
        "reflective_memory.stage.widened": widened,
        "reflective_memory.candidates.per_ranker": state.n,
        "reflective_memory.ranked": len(state.order),
        "reflective_memory.hits": len(state.hits),
        "reflective_memory.duration_ms": ms,
    }


def usage_attributes(prompt_tokens: int, completion_tokens: int) -> dict[str, AttributeValue]:
    """Token usage as the GenAI conventions name it."""
    return {
        "gen_ai.usage.input_tokens": int(prompt_tokens),
        "gen_ai.usage.output_tokens": int(completion_tokens),
    }


def feedback_attributes(out: FeedbackResult) -> dict[str, AttributeValue]:
    """A `feedback` span's attributes: what was cited and learned (the reason is ours, fixed).

    Args:
        out: The feedback's result.

    Returns:
        Attribute name -> value.
    """
    attrs: dict[str, AttributeValue] = {
        "enduser.pseudo.id": pseudonym(out.user_id),
        "reflective_memory.retrieval.id": out.retrieval_id,
        "reflective_memory.feedback.cited": len(out.cited),
        "reflective_memory.feedback.rewarded": len(out.rewards),
        "reflective_memory.feedback.inferred": out.inferred,
        "reflective_memory.feedback.no_cite": out.no_cite,
        "reflective_memory.feedback.learned": out.learned,
        "reflective_memory.feedback.updates": out.updates,
        "reflective_memory.feedback.pending": out.pending,
    }
    if out.reason:
        attrs["reflective_memory.feedback.reason"] = out.reason
    return attrs


def session_attributes(
    memories: Sequence[Memory], segmenter: str | None
) -> dict[str, AttributeValue]:
    """An `end_session` span's attributes: the memories built, in all and per granularity.

    Args:
        memories: The session's memories.
        segmenter: The segmenter's class when this process built them; `None` when another
            process sharing the store did (the path `built_elsewhere`).

    Returns:
        Attribute name -> value.
    """
    attrs: dict[str, AttributeValue] = {
        "reflective_memory.path": "built" if segmenter is not None else "built_elsewhere",
        "reflective_memory.memories": len(memories),
        "reflective_memory.turns": len({t for m in memories for t in m.turn_ids}),
    }
    if segmenter is not None:
        attrs["reflective_memory.segmenter"] = segmenter
    for kind, n in Counter(m.granularity for m in memories).items():
        attrs[f"reflective_memory.memories.{kind}"] = n
    return attrs


def turns_attributes(turns: Sequence[Turn]) -> dict[str, AttributeValue]:
    """An `add_turns` span's attributes: turns, users and sessions written (one user named)."""
    users = {t.user_id for t in turns}
    sessions = {(t.user_id, t.session_id) for t in turns}
    attrs: dict[str, AttributeValue] = {
        "reflective_memory.turns": len(turns),
        "reflective_memory.users": len(users),
        "reflective_memory.sessions": len(sessions),
    }
    if len(sessions) == 1:
        ((user, session),) = sessions
        attrs["enduser.pseudo.id"] = pseudonym(user)
        attrs["gen_ai.conversation.id"] = pseudonym(user, session)
    return attrs


# -- HTTP requests ----------------------------------------------------------------------------
#: The HTTP methods a span names; any other is `_OTHER` (span `HTTP <route>`), as the
#: OpenTelemetry HTTP conventions say, so a client cannot write its own words into span names.
HTTP_METHODS = frozenset(
    ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]
)


class TracedASGI:
    """ASGI middleware: one server span per HTTP request, `<METHOD> <route>`.

    The span holds the method, the route's template (never the path, which may hold a user
    id), the scheme and the response status; it continues the caller's trace (`traceparent`).
    Without a collector the request passes straight through.

    Args:
        app: The ASGI app.
        route: The route of every request (an app with one endpoint); else read from the
            router (`scope["route"]`), after the request.
    """

    def __init__(self, app: Any, *, route: str | None = None) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Handle one ASGI call."""
        if scope.get("type") != "http" or tracer() is None:
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET"))
        method = method if method in HTTP_METHODS else "_OTHER"  # a client's word is no name
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        status: dict[str, int] = {}

        async def watch(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        attrs = {"http.request.method": method, "url.scheme": str(scope.get("scheme", "http"))}
        with span(
            "HTTP" if method == "_OTHER" else method, attrs, kind="server", headers=headers
        ) as current:
            try:
                await self.app(scope, receive, watch)
            finally:
                if current is not None:
                    self._finish(current, scope, status.get("code"), method)

    def _finish(self, current: Span, scope: Any, code: int | None, method: str) -> None:
        route = self.route if self.route is not None else getattr(scope.get("route"), "path", None)
        if isinstance(route, str):
            current.set_attribute("http.route", route)
            current.update_name(f"{'HTTP' if method == '_OTHER' else method} {route}")
        if code is not None:
            current.set_attribute("http.response.status_code", code)
            if code >= 500:
                from opentelemetry.trace import Status, StatusCode

                current.set_attribute("error.type", str(code))
                current.set_status(Status(StatusCode.ERROR))
