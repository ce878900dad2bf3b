"""`reflective-memory mcp`: a user's long-term memory as Model Context Protocol tools.

Built on the official `mcp` SDK (`FastMCP`), over stdio (a desktop client or an agent starts the
server as a subprocess) or streamable HTTP. Six tools: `remember` (turns of a session),
`recall` (passages under a token budget, with their dates and sessions), `feedback` (the answer
written from a recall, whose citations teach the user's turn ranker), `list_sessions`,
`end_session` and `forget` (a session, or everything of the user).

The user is never a tool argument, so no call can name another user's id:

* stdio serves the one user given at start (`--user`);
* HTTP requires `Authorization: Bearer <token>` on every request and each token reaches one
  user (`--token USER=SECRET`, or a tokens file). The SDK binds an MCP session to the token
  that opened it; each tool call reads its user from the token of the request carrying it.

Bad arguments are tool errors (`isError` results with the library's typed-error message), never
a crash. Arguments are validated strictly before a tool runs (`StrictFastMCP`): no string
becomes a boolean or a number, unknown arguments are refused, and erasing everything of a user
takes `confirm="forget everything"`. Over HTTP a request body larger than `--max-body-bytes` is
refused (413) before it is read (`reflective_memory.serve.limits.BodyLimit`). Needs the `mcp`
extra.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import numpy as np

try:
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.server.fastmcp.exceptions import ToolError
    from mcp.server.fastmcp.tools import Tool
    from mcp.types import (
        INTERNAL_ERROR,
        INVALID_PARAMS,
        INVALID_REQUEST,
        PARSE_ERROR,
        CallToolResult,
        ErrorData,
        JSONRPCError,
        TextContent,
        ToolAnnotations,
    )
    from mcp.types import Tool as MCPTool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"the MCP server needs its extra: pip install 'reflective-memory[mcp]' ({exc})"
    ) from exc
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError

from reflective_memory import tracing
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import (
    ConfigError,
    InvalidFileError,
    NoStoreError,
    ReflectiveMemoryError,
)
from reflective_memory.jsonfile import read_text_file
from reflective_memory.kept_retrievals import RetrievalCache
from reflective_memory.memory_block import shown_memories
from reflective_memory.portable.commands import read_dsn_of
from reflective_memory.portable.endpoints import STORE_FILE
from reflective_memory.serve.bearer import BearerGate, identity
from reflective_memory.serve.limits import (
    BODY_READ_SECONDS,
    MAX_PENDING_BODIES,
    MAX_REQUESTS_PER_MINUTE,
    MAX_SESSIONS_PER_TOKEN,
    RATE_WINDOW_SECONDS,
    SESSION_IDLE_SECONDS,
    BodyLimit,
    Refusal,
    RequestRate,
    check_body_limit,
)
from reflective_memory.serve.security import (
    AccessPolicy,
    check_bind,
    check_port,
    parse_user_tokens,
)
from reflective_memory.types import Hit, Retrieval
from reflective_memory.validation import MAX_ID_CHARS

__all__ = [
    "TurnIn",
    "Remembered",
    "Passage",
    "Recalled",
    "Learned",
    "SessionRow",
    "Sessions",
    "Ended",
    "Forgotten",
    "MemoryTools",
    "PendingStore",
    "TokenUsers",
    "build_server",
    "strict_arguments",
    "StrictFastMCP",
    "FORGET_EVERYTHING",
    "MAX_ANSWER_CHARS",
    "MAX_CITED",
    "KEPT_RECALLS",
    "KEPT_RECALLS_PER_USER",
    "http_app",
    "SessionQuota",
    "MAX_SESSIONS_PER_TOKEN",
    "MAX_REQUESTS_PER_MINUTE",
    "SESSION_IDLE_SECONDS",
    "json_body_problem",
    "check_jsonrpc_body",
    "read_tokens",
    "refuse_over_stdio",
    "run",
    "SERVER_NAME",
]

logger = logging.getLogger(__name__)

#: The name the server gives itself in the MCP handshake.
SERVER_NAME = "reflective-memory"

_INSTRUCTIONS = (
    "Long-term memory of the user's conversations. Call `remember` with the turns of the "
    "current session (and end_session=true when the conversation is over), and `recall` with a "
    "question to get dated passages of earlier sessions, numbered from [0] (cite them as [0], "
    "[1], ...). After answering from a recall, call `feedback` with its retrieval_id and your "
    "answer as written (or the numbers of the passages you used): the memory learns which "
    "passages help."
)

T = TypeVar("T")

#: The `confirm` value `forget` needs to erase everything of a user.
FORGET_EVERYTHING = "forget everything"
#: Longest answer `feedback` reads: an answer without a citation number is read sentence by
#: sentence (the attribution fallback embeds each), so its length bounds the work.
MAX_ANSWER_CHARS = 20_000
#: Most passage numbers `feedback` takes (a recall shows far fewer passages).
MAX_CITED = 256
#: Recalls the server keeps for `feedback` (the oldest goes first), and per user (so that one
#: user's recalls never push another user's out).
KEPT_RECALLS = 1024
KEPT_RECALLS_PER_USER = 32


# -- tool inputs and outputs -------------------------------------------------------------------
class TurnIn(BaseModel):
    """One utterance to remember."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: str = Field(
        description="Who spoke: 'user', 'assistant' (any case; 'human', 'ai', 'bot' and "
        "'model' are stored as these), 'system', or a speaker's name (e.g. 'Maya')"
    )
    text: str = Field(description="What was said")
    timestamp: str | None = Field(
        default=None,
        description="When it was said (ISO-8601, e.g. 2025-03-01T10:00:00; UTC without an "
        "offset). Without it: the previous turn's time in a replayed log, else now",
    )
    turn_id: str | None = Field(
        default=None, description="Your own id for the turn; sending it again stores nothing"
    )


class Remembered(BaseModel):
    """What `remember` stored."""

    session_id: str = Field(description="The session the turns went to")
    turn_ids: list[str] = Field(description="Ids of the stored turns, in order")
    ended: bool = Field(description="Whether the session was ended (turned into memories)")
    memories: int = Field(description="Memories built when the session was ended, else 0")


class Passage(BaseModel):
    """One recalled passage: consecutive turns of one session."""

    session_id: str = Field(description="Session the passage comes from")
    date: str | None = Field(description="When its first turn was said (ISO-8601), if known")
    end_date: str | None = Field(description="When its last turn was said (ISO-8601), if known")
    turn_ids: list[str] = Field(description="Ids of its turns")
    relevance: float = Field(description="How well it matches the query, in [0, 1]")
    score: float = Field(
        description="What the passages are ordered by: the user's turn ranker's score of the "
        "passage (higher first; compare within one recall only; `feedback` changes it)"
    )
    text: str = Field(description="The turns as the reader sees them, dated")


class Recalled(BaseModel):
    """What `recall` found."""

    query: str = Field(description="The query")
    retrieval_id: str = Field(
        description="Id of this recall: give it to `feedback` with the answer written from it"
    )
    passages: list[Passage] = Field(description="The passages, best first")


class Learned(BaseModel):
    """What `feedback` taught the user's turn ranker."""

    retrieval_id: str = Field(description="The recall the answer was written from")
    learned: bool = Field(description="Whether the user's turn ranker learned one episode")
    reason: str | None = Field(description="Why nothing was learned (when learned is false)")
    cited: list[int] = Field(description="Numbers of the passages counted as cited")
    no_cite: bool = Field(description="The answer said [NO_CITE]")
    out_of_range: int = Field(description="Citation numbers in the answer that name no passage")
    inferred: bool = Field(
        description="The answer cites no number: what it used was read from its wording"
    )
    episodes: int = Field(description="Episodes the user's turn ranker has learned from")
    serving: bool = Field(
        description="What the user's citations taught ranks their next recall (it has ranked "
        "later citations better than the weights it replaces); false while still proven"
    )


class SessionRow(BaseModel):
    """One session of the user."""

    session_id: str = Field(description="Session id")
    status: str = Field(description="'open' (turns not yet memories) or 'ended'")
    turns: int = Field(description="Number of turns")
    first_time: str | None = Field(description="Timestamp of its first turn, if known")
    last_time: str | None = Field(description="Timestamp of its last turn, if known")


class Sessions(BaseModel):
    """The user's sessions."""

    sessions: list[SessionRow] = Field(description="Sessions, oldest first")


class Ended(BaseModel):
    """What `end_session` built."""

    session_id: str = Field(description="The session ended")
    memories: int = Field(description="Memories built from it")


class Forgotten(BaseModel):
    """What `forget` erased."""

    scope: Literal["session", "user"] = Field(description="What was erased")
    session_id: str | None = Field(description="The session erased (scope 'session')")
    turns: int = Field(description="Number of turns erased")


# -- who is calling ----------------------------------------------------------------------------
UserOf = Callable[[Context], str]


def token_user(ctx: Context) -> str:
    """The user of the bearer token on the HTTP request that carries this tool call.

    Raises:
        ToolError: The request has no authenticated user (cannot happen behind the SDK's bearer
            middleware, which answers 401 first).
    """
    request = ctx.request_context.request
    user = None if request is None else request.scope.get("user")
    if not isinstance(user, AuthenticatedUser) or not user.access_token.subject:
        raise ToolError("this call carries no valid access token")
    return user.access_token.subject


class TokenUsers:
    """The SDK's `TokenVerifier` over an `AccessPolicy` whose every token reaches one user.

    Args:
        policy: User tokens only (no admin token): each verifies as its user.

    Raises:
        ConfigError: The policy has no token (an open policy would let any token in).
    """

    def __init__(self, policy: AccessPolicy) -> None:
        if policy.open:
            raise ConfigError("the HTTP transport needs at least one --token USER=SECRET")
        self.policy = policy

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access of `token`, its user as `subject` (None: unknown, or not one user's)."""
        principal = self.policy.authenticate(token)
        if principal is None or principal.users is None or len(principal.users) != 1:
            return None
        (user,) = principal.users
        return AccessToken(token=token, client_id=principal.name, scopes=[], subject=user)


# -- the tools ---------------------------------------------------------------------------------
def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _passage(hit: Hit) -> Passage:
    return Passage(
        session_id=hit.memory.session_id,
        date=_iso(hit.memory.start_time),
        end_date=_iso(hit.memory.end_time),
        turn_ids=list(hit.memory.turn_ids),
        relevance=round(float(hit.relevance), 4),
        score=round(float(hit.score), 6),
        text=hit.memory.text,
    )


def _result(model: BaseModel, text: str | None = None) -> CallToolResult:
    """A tool result: `text` (default: the model as JSON) plus the model as structured content."""
    shown = model.model_dump_json(indent=1) if text is None else text
    return CallToolResult(
        content=[TextContent(type="text", text=shown)],
        structuredContent=model.model_dump(mode="json"),
    )


class PendingStore:
    """The memory of a store directory that holds no store yet: the first write creates it.

    Until then the tools that only read or erase answer `NoStoreError` (a mistyped `--db` is
    reported, never created by a `recall`).

    Args:
        directory: The store directory (`--db`).
        opener: Opens (and creates) the store there.
    """

    def __init__(self, directory: str, opener: Callable[[], ReflectiveMemory]) -> None:
        self.directory = directory
        self.opener = opener
        self._memory: ReflectiveMemory | None = None
        self._lock = threading.Lock()

    def get(self, *, create: bool) -> ReflectiveMemory:
        """The memory, opened now if need be; `create=False` never creates the store.

        Raises:
            NoStoreError: `create` is False and the directory holds no store.
        """
        with self._lock:
            if self._memory is None:
                if not create and not (Path(self.directory) / STORE_FILE).is_file():
                    raise NoStoreError(
                        f"there is no store at {self.directory}: nothing has been remembered "
                        "there yet (check the server's --db; the first `remember` creates it)"
                    )
                self._memory = self.opener()
            return self._memory

    def close(self) -> None:
        """Close the memory if it was opened."""
        with self._lock:
            if self._memory is not None:
                self._memory.close()


@dataclass
class MemoryTools:
    """The tools over one `ReflectiveMemory`; each call acts for the user `user_of` gives.

    The engine's methods are synchronous: each runs in a worker thread. A library error becomes
    a tool error carrying its message.

    Attributes:
        memory: The memory, or a `PendingStore` that only `remember` may create.
        user_of: Who a call acts for.
        recalls: The recalls waiting for their `feedback`, by retrieval id (in this process).
    """

    memory: ReflectiveMemory | PendingStore
    user_of: UserOf
    recalls: RetrievalCache[Retrieval] = field(
        default_factory=lambda: RetrievalCache(KEPT_RECALLS, per_user=KEPT_RECALLS_PER_USER)
    )

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
        except ReflectiveMemoryError as exc:
            raise ToolError(" ".join(str(exc).splitlines()) or type(exc).__name__) from exc

    async def _memory(self, *, write: bool = False) -> ReflectiveMemory:
        """The memory; only a write (`remember`) may create a store that is not there yet."""
        if isinstance(self.memory, ReflectiveMemory):
            return self.memory
        return await self._run(self.memory.get, create=write)

    async def remember(
        self,
        session_id: Annotated[str, Field(description="The conversation's session id")],
        turns: Annotated[list[TurnIn], Field(description="The turns, in order", min_length=1)],
        ctx: Context,
        end_session: Annotated[
            bool, Field(description="End the session now, turning it into memories")
        ] = False,
    ) -> Annotated[CallToolResult, Remembered]:
        """Remember turns of a conversation session (stored durably before this returns)."""
        user = self.user_of(ctx)
        memory = await self._memory(write=True)
        rows = [
            {"user_id": user, "session_id": session_id, **t.model_dump(exclude_none=True)}
            for t in turns
        ]
        stored = await self._run(memory.add_turns, rows)
        built = await self._run(memory.end_session, user, session_id) if end_session else []
        done = Remembered(
            session_id=session_id,
            turn_ids=[t.turn_id for t in stored],
            ended=end_session,
            memories=len(built),
        )
        return _result(done)

    async def recall(
        self,
        query: Annotated[str, Field(description="What to remember, e.g. a question")],
        ctx: Context,
        budget_tokens: Annotated[
            int | None,
            Field(
                description="Tokens of the numbered passages returned, numbers included "
                "(default: passages of the library's budget, 500)"
            ),
        ] = None,
        now: Annotated[
            str | None,
            Field(
                description="When the question is asked (ISO-8601, UTC without an offset), "
                "for 'last week' etc. (default: the user's newest turn)"
            ),
        ] = None,
    ) -> Annotated[CallToolResult, Recalled]:
        """Recall passages of earlier conversations relevant to a query, with their dates.

        The passages are numbered from [0], best first, as everywhere in this library: cite
        passage i as [i] (e.g. [0] or [0, 2]). Send the answer written from them to `feedback`
        with this recall's retrieval_id.
        """
        user = self.user_of(ctx)
        memory = await self._memory()
        found, text = await self._run(
            shown_memories,
            memory,
            user,
            query,
            k=None,
            budget_tokens=budget_tokens,
            instruction=None,
            exclude_turns=(),
            now=now,
        )
        self.recalls.put(found)
        out = Recalled(
            query=query,
            retrieval_id=found.retrieval_id,
            passages=[_passage(h) for h in found.hits],
        )
        return _result(out, text or "No memories match this query.")

    async def feedback(
        self,
        retrieval_id: Annotated[
            str,
            Field(
                description="The retrieval_id of the recall the answer was written from",
                min_length=1,
                max_length=MAX_ID_CHARS,
            ),
        ],
        ctx: Context,
        answer: Annotated[
            str,
            Field(
                description="The answer as written, citing the passages it used as [i] (e.g. "
                "[0] or [0, 2]), or [NO_CITE] when none helped",
                max_length=MAX_ANSWER_CHARS,
            ),
        ] = "",
        cited: Annotated[
            list[int] | None,
            Field(
                description="The numbers of the passages the answer used, instead of the "
                "answer ([] when none helped)",
                max_length=MAX_CITED,
            ),
        ] = None,
    ) -> Annotated[CallToolResult, Learned]:
        """Tell the memory which recalled passages an answer used: its ranker learns from it.

        Give the recall's retrieval_id and either the answer (its [i] citations are read) or
        the cited passage numbers. The passages cited against those shown but not cited are
        one lesson for this user's turn ranker, which orders the next recall's passages. Each
        recall takes one feedback, on the server that made it (recent recalls are kept there).
        """
        user = self.user_of(ctx)
        # `answer` is a plain str (empty: not given): the SDK decodes a str argument that may
        # be something else as JSON when it can, and an answer "[0]" is no list
        if (answer == "") == (cited is None):
            raise ToolError("give either answer (citing passages as [i]) or cited, not both")
        shown = self.recalls.pop(retrieval_id, user)
        if shown is None:  # unknown, answered already, dropped, or another user's: one message
            raise ToolError(
                f"no recall {retrieval_id!r} of this user waits for feedback on this server (a "
                "recall takes one feedback; the server keeps each user's last "
                f"{KEPT_RECALLS_PER_USER} recalls while it runs)"
            )
        memory = await self._memory()
        try:
            out = await self._run(memory.feedback, shown, answer or None, cited=cited)
        except ToolError:
            self.recalls.put(shown)  # refused before anything was learned: it may be sent again
            raise
        weights = await self._run(memory.ranker_weights, user)
        done = Learned(
            retrieval_id=retrieval_id,
            learned=out.learned,
            reason=out.reason or None,
            cited=list(out.cited),
            no_cite=out.no_cite,
            out_of_range=out.out_of_range,
            inferred=out.inferred,
            episodes=int(weights.get("user_episodes", 0)),
            serving=out.serving,
        )
        return _result(done)

    async def list_sessions(
        self,
        ctx: Context,
        status: Annotated[
            Literal["open", "ended"] | None, Field(description="Only sessions in this state")
        ] = None,
    ) -> Annotated[CallToolResult, Sessions]:
        """List the user's sessions: open ones (not yet memories) and ended ones."""
        user = self.user_of(ctx)
        memory = await self._memory()
        rows = await self._run(memory.store.sessions, user, status)
        out = Sessions(
            sessions=[
                SessionRow(
                    session_id=s.session_id,
                    status=s.status,
                    turns=s.n_turns,
                    first_time=_iso(s.first_time),
                    last_time=_iso(s.last_time),
                )
                for s in rows
            ]
        )
        return _result(out)

    async def end_session(
        self, session_id: Annotated[str, Field(description="The session to end")], ctx: Context
    ) -> Annotated[CallToolResult, Ended]:
        """End a session: turn its turns into memories (again, if more turns arrived)."""
        user = self.user_of(ctx)
        memory = await self._memory()
        built = await self._run(memory.end_session, user, session_id)
        return _result(Ended(session_id=session_id, memories=len(built)))

    async def forget(
        self,
        ctx: Context,
        session_id: Annotated[
            str | None, Field(description="The session to erase (or give everything=true)")
        ] = None,
        everything: Annotated[
            bool,
            Field(
                description="Erase all of the user's turns and memories (needs confirm="
                f"{FORGET_EVERYTHING!r})"
            ),
        ] = False,
        confirm: Annotated[
            str | None,
            Field(description=f"With everything=true: exactly {FORGET_EVERYTHING!r}"),
        ] = None,
    ) -> Annotated[CallToolResult, Forgotten]:
        """Erase a session, or everything remembered about the user; this cannot be undone.

        Erasing everything takes everything=true and confirm="forget everything" (no other
        value, so no client's conversion of a string or a number can erase a user).
        """
        user = self.user_of(ctx)
        if (session_id is None) == (not everything):
            raise ToolError("give either session_id or everything=true (not both)")
        if everything and confirm != FORGET_EVERYTHING:
            raise ToolError(
                f"erasing everything cannot be undone: give confirm={FORGET_EVERYTHING!r} "
                f"with everything=true (got confirm={confirm!r})"
            )
        if confirm is not None and not everything:
            raise ToolError("confirm goes with everything=true only")
        memory = await self._memory()
        if session_id is not None:
            if not await self._run(memory.turns, user, session_id):
                raise ToolError(f"there is no session {session_id!r}")
            n = await self._run(memory.delete_session, user, session_id)
            self.recalls.forget(user)  # what they showed may be gone
            return _result(Forgotten(scope="session", session_id=session_id, turns=n))
        n = await self._run(memory.delete_user, user)
        self.recalls.forget(user)
        return _result(Forgotten(scope="user", session_id=None, turns=n))


def _argument_problems(tool: str, exc: ValidationError) -> str:
    """One line naming each bad argument of a call, its problem and the type it was sent as."""
    names = {"bool_type": "a JSON boolean (true or false)", "int_type": "a JSON integer"}
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown argument")
            continue
        got = err.get("input")
        shown = "" if err["type"] == "missing" else f" (got {type(got).__name__} {got!r:.40})"
        parts.append(f"{where}: {names.get(err['type'], err['msg'])}{shown}")
    return f"invalid arguments for {tool}: " + "; ".join(parts)


def strict_arguments(fn: Callable[..., Any]) -> type[BaseModel]:
    """The arguments of the tool function `fn` as a strict model: nothing is converted.

    A boolean is a JSON boolean, an integer a JSON integer, a string a JSON string; unknown
    arguments are refused. (The SDK's own argument model converts `"true"`, `"yes"`, `"1"` and
    `1` to `True`, and `"5"` to `5`.)
    """
    base = Tool.from_function(fn).fn_metadata.arg_model
    config = ConfigDict(strict=True, extra="forbid")
    return type(f"{base.__name__}Strict", (base,), {"model_config": config})


#: The MCP and GenAI conventions' attributes of a tool call's span (`reflective_memory.tracing`).
_TOOL_SPAN = {"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool"}


class StrictFastMCP(FastMCP):
    """`FastMCP` whose tool calls are checked against strict argument models first.

    A call whose arguments do not validate is answered with an `isError` result naming each
    bad argument, before the tool runs. A list or an object sent as a JSON string is decoded
    first, as the SDK does for clients that send them so; a string is never read as a boolean or
    a number.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._strict: dict[str, tuple[type[BaseModel], Any]] = {}
        #: The bearer-token check of the HTTP transport (None over stdio).
        self.verifier: TokenUsers | None = kwargs.get("token_verifier")

    def add_strict_tool(self, fn: Callable[..., Any], **kwargs: Any) -> None:
        """`add_tool(fn, **kwargs)`, its calls validated by `strict_arguments(fn)`."""
        self.add_tool(fn, **kwargs)
        meta = Tool.from_function(fn).fn_metadata
        self._strict[fn.__name__] = (strict_arguments(fn), meta)

    async def list_tools(self) -> list[MCPTool]:
        """The tools, each with its strict input schema (`additionalProperties: false`)."""
        tools = await super().list_tools()
        for tool in tools:
            if tool.name in self._strict:
                tool.inputSchema = self._strict[tool.name][0].model_json_schema(by_alias=True)
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Validate `arguments` strictly, then call the tool.

        Raises:
            ToolError: An argument is missing, unknown or of the wrong JSON type.
        """
        tool = name if name in self._strict else "unknown"  # a client's name is not recorded
        attrs = {**_TOOL_SPAN, "gen_ai.tool.name": tool}
        with tracing.span(f"tools/call {tool}", attrs, kind="server"):
            if name in self._strict:
                model, meta = self._strict[name]
                try:
                    model.model_validate(meta.pre_parse_json(arguments))
                except ValidationError as exc:
                    raise ToolError(_argument_problems(name, exc)) from None
            return await super().call_tool(name, arguments)


def build_server(
    memory: ReflectiveMemory | PendingStore,
    user_of: UserOf,
    *,
    verifier: TokenUsers | None = None,
    host: str = "127.0.0.1",
    url: str = "http://127.0.0.1:8766",
    max_body_bytes: int | None = None,
    idle_seconds: float = SESSION_IDLE_SECONDS,
) -> StrictFastMCP:
    """The MCP server of `memory`'s tools.

    Args:
        memory: The memory served (a `PendingStore`: created by the first `remember`).
        user_of: Who a tool call acts for (the stdio user, or `token_user` over HTTP).
        verifier: Bearer-token check of the HTTP transport (None for stdio).
        host: The HTTP bind address: on a loopback one the SDK accepts only loopback `Host`
            and `Origin` headers (DNS rebinding protection).
        url: Where the HTTP server is reached (the issuer of its static tokens).
        max_body_bytes: The SDK's own request body limit (HTTP).
        idle_seconds: An HTTP session with no request for this long is closed.
    """
    settings: dict[str, Any] = {}
    if verifier is not None:
        settings["auth"] = AuthSettings(issuer_url=AnyHttpUrl(url), resource_server_url=None)
    if max_body_bytes is not None:
        settings["max_request_body_size"] = max_body_bytes
    server = StrictFastMCP(
        SERVER_NAME,
        host=host,
        instructions=_INSTRUCTIONS,
        token_verifier=verifier,
        log_level="WARNING",
        session_idle_timeout=idle_seconds,
        **settings,
    )
    tools = MemoryTools(memory, user_of)
    write = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True)
    server.add_strict_tool(tools.remember, annotations=write)
    server.add_strict_tool(tools.recall, annotations=ToolAnnotations(readOnlyHint=True))
    learn = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False)
    server.add_strict_tool(tools.feedback, annotations=learn)
    server.add_strict_tool(tools.list_sessions, annotations=ToolAnnotations(readOnlyHint=True))
    server.add_strict_tool(tools.end_session, annotations=write)
    server.add_strict_tool(tools.forget, annotations=ToolAnnotations(destructiveHint=True))
    return server


#: Deepest nesting of arrays and objects a request body may have (a tool call needs four).
MAX_JSON_DEPTH = 32
#: Most digits of an integer in a request body (a JSON-RPC id or a budget needs far fewer).
MAX_INT_DIGITS = 40
#: A JSON string, or an unterminated one up to the end (so no match fails and is retried: linear).
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class _BodyProblem(ValueError):
    """A request body the SDK must not parse (it would raise, and answer 500)."""


class _NotFinite:
    """A number of a body that is not finite (`NaN`, `Infinity`, `1e999`), kept to be named."""

    def __init__(self, text: str) -> None:
        self.text = text


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _BodyProblem(f"an integer has {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _finite_float(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def _not_finite_at(value: Any) -> tuple[str, str] | None:
    """(JSON path, text) of the first number of a parsed body that is not finite, if any."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, _NotFinite):
            return where or "the body", item.text
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def _jsonrpc_problem(body: bytes) -> tuple[int, str, Any] | None:
    """Why a body is refused: (JSON-RPC error code, message, the request's id or None)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return PARSE_ERROR, f"Parse error: the body is not valid UTF-8 (byte {exc.start})", None
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode("ascii")
    if brackets:
        marks = np.frombuffer(brackets, dtype=np.uint8)
        steps = np.where((marks == ord("[")) | (marks == ord("{")), 1, -1)
        if int(np.cumsum(steps).max()) > MAX_JSON_DEPTH:
            deep = f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
            return PARSE_ERROR, f"Parse error: {deep}", None
    try:
        parsed = json.loads(
            text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_NotFinite
        )
    except _BodyProblem as exc:
        return PARSE_ERROR, f"Parse error: {exc}", None
    except ValueError as exc:
        return PARSE_ERROR, f"Parse error: the body is not JSON ({exc})", None
    found = _not_finite_at(parsed)
    if found is None:
        return None
    where, number = found
    ident = parsed.get("id") if isinstance(parsed, dict) else None
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        ident = None
    message = (
        f"Invalid params: {where.removeprefix('params.arguments.')} is {number}, not a finite "
        "number (JSON has no NaN or Infinity)"
    )
    return INVALID_PARAMS, message, ident


def json_body_problem(body: bytes) -> str | None:
    """Why a JSON-RPC request body cannot be parsed safely, or None when it can.

    Checked without recursion and before the SDK parses it: valid UTF-8, nesting at most
    `MAX_JSON_DEPTH`, integers of at most `MAX_INT_DIGITS` digits, JSON syntax, and every
    number finite (the SDK reads `NaN` or `Infinity` in a tool's arguments as absent).
    """
    found = _jsonrpc_problem(body)
    return None if found is None else found[1]


def check_jsonrpc_body(scope: MutableMapping[str, Any], body: bytes) -> Refusal | None:
    """A `BodyCheck`: a POST whose body cannot be parsed safely gets 400 and a JSON-RPC error.

    The error is a parse error with id null (JSON-RPC 2.0's answer to a request it could not
    read), or "invalid params" with the request's id for a number that is not finite.
    """
    if scope.get("method") != "POST":
        return None
    found = _jsonrpc_problem(body)
    if found is None:
        return None
    code, message, ident = found
    answer = {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}
    return 400, b"application/json", json.dumps(answer).encode()


@dataclass
class _Open:
    """A session the quota counts: whose it is, when it was last used, requests in flight."""

    owner: str
    seen: float
    in_flight: int = 0


class SessionQuota:
    """ASGI middleware: each user's token may hold at most `per_token` MCP sessions open.

    A request that would open one more (a POST without `Mcp-Session-Id`) is answered 429 with a
    JSON-RPC error, so one token cannot take the server's every session from the others. A
    session stops counting when it is deleted, or after `idle_seconds` without a request (the
    SDK closes it then too, given the same idle timeout). Sessions are counted by the user
    `serve.bearer.BearerGate` authenticated (the user the tools act for); a request without one
    passes through (the SDK answers 401).

    Args:
        app: The SDK's streamable HTTP app.
        per_token: Most open sessions per token.
        idle_seconds: When an unused session stops counting.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        app: Any,
        per_token: int = MAX_SESSIONS_PER_TOKEN,
        idle_seconds: float = SESSION_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(per_token, bool) or not isinstance(per_token, int) or per_token < 1:
            raise ConfigError(
                f"the sessions per token must be a positive integer, got {per_token!r}"
            )
        if not idle_seconds > 0:
            raise ConfigError(f"the session idle time must be positive, got {idle_seconds!r}")
        self.app, self.per_token, self.idle_seconds, self.clock = (
            app,
            per_token,
            idle_seconds,
            clock,
        )
        self.sessions: dict[str, _Open] = {}
        self.opening: dict[str, int] = {}

    def open_sessions(self, owner: str) -> int:
        """Sessions `owner` (a user) holds or is opening now, after dropping idle ones."""
        now = self.clock()
        idle = [
            k
            for k, o in self.sessions.items()
            if not o.in_flight and now - o.seen > self.idle_seconds
        ]
        for key in idle:
            del self.sessions[key]
        return self.opening.get(owner, 0) + sum(o.owner == owner for o in self.sessions.values())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Count, admit or refuse the request, then let the SDK answer it."""
        owner = identity(scope) if scope["type"] == "http" else None
        if owner is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        session = headers.get(b"mcp-session-id", b"").decode("latin-1") or None
        if session is None and scope.get("method") == "POST":
            await self._open(owner, scope, receive, send)
        elif session is not None and session in self.sessions:
            if self.sessions[session].owner == owner:
                await self._use(session, scope, receive, send)
            else:  # another user's session: the SDK answers 404, and it still counts for its own
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _open(self, owner: str, scope: Any, receive: Any, send: Any) -> None:
        held = self.open_sessions(owner)
        if held >= self.per_token:
            logger.warning("refused a new MCP session: a token holds %d open", held)
            message = (
                f"this token holds {held} open MCP sessions (at most {self.per_token}); end one "
                f"(HTTP DELETE) or wait {self.idle_seconds:.0f} s for an idle one to close"
            )
            await _jsonrpc_error(send, 429, INVALID_REQUEST, message)
            return
        opened: list[str] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                found = dict(message.get("headers", [])).get(b"mcp-session-id")
                if found:
                    opened.append(found.decode("latin-1"))
            await send(message)

        self.opening[owner] = self.opening.get(owner, 0) + 1
        try:
            await self.app(scope, receive, watch)
        finally:
            self.opening[owner] -= 1
            if not self.opening[owner]:
                del self.opening[owner]
            for session in opened:
                self.sessions[session] = _Open(owner, self.clock())

    async def _use(self, session: str, scope: Any, receive: Any, send: Any) -> None:
        entry = self.sessions[session]
        entry.in_flight += 1
        entry.seen = self.clock()
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            entry.in_flight -= 1
            entry.seen = self.clock()
            gone = status and (
                status[0] == 404 or (scope.get("method") == "DELETE" and status[0] < 400)
            )
            if gone:
                self.sessions.pop(session, None)


async def _jsonrpc_error(send: Any, status: int, code: int, message: str) -> None:
    """Answer `status` with a JSON-RPC error (id null) and close the connection."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


def http_app(
    server: StrictFastMCP,
    max_body_bytes: int,
    *,
    per_token: int = MAX_SESSIONS_PER_TOKEN,
    idle_seconds: float = SESSION_IDLE_SECONDS,
    per_minute: int = MAX_REQUESTS_PER_MINUTE,
    read_seconds: float = BODY_READ_SECONDS,
    max_pending: int = MAX_PENDING_BODIES,
) -> tracing.TracedASGI:
    """The streamable HTTP ASGI app of `server` (at `/mcp`), behind the request limits.

    In order: each request must carry exactly one `Authorization` header with a known bearer
    token, checked from its headers alone (`BearerGate`: 400 for two or more headers, 401 for a
    missing or unknown token, before any body is read). Its user past `per_minute` requests in
    the last minute gets 429 and a JSON-RPC error before its body is read (`RequestRate`). A
    body over the limit gets 413 and a JSON-RPC error before it is read; one that does not
    arrive within `read_seconds` gets 408; past `max_pending` bodies being read, 503
    (`BodyLimit`). A body that is not UTF-8, nests too deep, holds an over-long integer, a
    number that is not finite (`NaN`, `Infinity`) or is not JSON gets 400 and a JSON-RPC error
    before the SDK parses it (its parser would raise and answer 500, or read `NaN` as absent);
    the check runs off the event loop. Each user may hold `per_token` sessions open
    (`SessionQuota`); give `server` the same `idle_seconds` (`build_server`). With a tracer
    provider set, each request is a `POST /mcp` span (`TracedASGI`).

    Raises:
        ConfigError: `server` has no bearer-token check (`build_server(verifier=...)`).
    """
    if server.verifier is None:
        raise ConfigError("the HTTP transport needs a token check: build_server(verifier=...)")
    quota = SessionQuota(server.streamable_http_app(), per_token, idle_seconds)
    body = BodyLimit(
        quota,
        max_body_bytes,
        check=check_jsonrpc_body,
        jsonrpc=True,
        read_seconds=read_seconds,
        max_pending=max_pending,
    )
    rate = RequestRate(body, per_minute, key=identity, window=RATE_WINDOW_SECONDS)
    return tracing.TracedASGI(BearerGate(rate, server.verifier), route="/mcp")


# -- the command -------------------------------------------------------------------------------
class _EndedStreamNoise(logging.Filter):
    """Drops the SDK's traceback for a client's GET stream closed by the end of its session."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        closed = isinstance(exc, anyio.ClosedResourceError)
        return not (closed and record.getMessage() == "Error in standalone SSE writer")


def read_tokens(path: str) -> dict[str, str]:
    """`{user: token}` from a tokens file: one `USER=TOKEN` per line; `#` comments, blanks.

    A comment is a line that starts with `#`, or the end of a line from a `#` after a space
    (`ana=SECRET  # laptop`); a UTF-8 byte order mark at the start is not part of the first
    user's name. The file must be a regular file of at most `MAX_TOKENS_FILE_BYTES`.

    Raises:
        ConfigError: The file cannot be read or is too large, a line is malformed, a user is
            not a valid user id, or a token holds anything but visible ASCII characters.
    """
    try:
        text = read_text_file(path, max_bytes=MAX_TOKENS_FILE_BYTES)
    except InvalidFileError as exc:
        raise ConfigError(f"cannot read the tokens file {exc}") from None
    lines = [_INLINE_COMMENT.split(ln, maxsplit=1)[0].strip() for ln in text.splitlines()]
    items = [ln for ln in lines if ln and not ln.startswith("#")]
    tokens = parse_user_tokens(items, f"a line of {path}")
    spaced = sorted(user for user, token in tokens.items() if any(c.isspace() for c in token))
    if spaced:
        raise ConfigError(f"the token of user {spaced[0]!r} in {path} holds a space")
    return tokens


#: Largest tokens file read (a line per user: room for thousands).
MAX_TOKENS_FILE_BYTES = 2**20
#: Where an inline comment starts in a tokens file: a `#` after whitespace.
_INLINE_COMMENT = re.compile(r"\s+#")


def _policy(args: argparse.Namespace) -> AccessPolicy | None:
    """The tokens of an HTTP server (None for stdio); checks the options of the transport."""
    tokens = parse_user_tokens(args.token, "--token")
    if args.tokens_file is not None:
        from_file = read_tokens(args.tokens_file)
        twice = sorted(set(tokens) & set(from_file))
        if twice:
            raise ConfigError(f"user {twice[0]!r} has a --token and a line in the tokens file")
        tokens.update(from_file)
    if args.transport == "stdio":
        if args.user is None:
            raise ConfigError(
                "the stdio transport serves one user: give --user USER (e.g. add "
                '"--user", "me" to the server\'s args; the same id you give `ingest` and `search`)'
            )
        if tokens:
            raise ConfigError("tokens are for --transport http; stdio serves --user only")
        return None
    if args.user is not None:
        raise ConfigError("over HTTP each token names its user: use --token USER=SECRET")
    if not tokens:
        raise ConfigError(
            "the HTTP transport requires access tokens: --token USER=SECRET (repeatable) or "
            "--tokens-file FILE; clients send 'Authorization: Bearer SECRET'"
        )
    policy = AccessPolicy(None, tokens)
    check_bind(args.host, policy)
    check_body_limit(args.max_body_bytes)
    check_port(args.host, args.port)
    return policy


#: How long a stdio server that cannot start waits for the client's first request to answer it.
REFUSAL_WAIT_SECONDS = 30.0


def _first_request_id(stream: Any) -> str | int | None:
    """The id of the first JSON-RPC request (not a notification) read from `stream`, if any."""
    for raw in stream:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if isinstance(message, dict) and "method" in message and "id" in message:
            ident = message["id"]
            if isinstance(ident, (str, int)) and not isinstance(ident, bool):
                return ident
    return None


def refuse_over_stdio(message: str, *, wait: float = REFUSAL_WAIT_SECONDS) -> bool:
    """Tell a stdio MCP client why this server cannot start: its first request gets `message`.

    A client that starts a server which exits at once sees only "Connection closed"; answering
    its `initialize` with a JSON-RPC error puts the reason in front of the user instead (the
    SDK's `ClientSession.initialize` raises `McpError(message)`). Nothing is done when stdin is
    a terminal or cannot be read (a person at a shell reads stderr instead).

    Args:
        message: The reason, one line.
        wait: Seconds to wait for the client's first request.

    Returns:
        Whether a client's request was answered.
    """
    stdin = sys.stdin
    try:
        if stdin is None or stdin.isatty() or not stdin.readable():
            return False
        stream = stdin.buffer
    except (AttributeError, OSError, ValueError):
        return False
    found: list[str | int | None] = []
    reader = threading.Thread(target=lambda: found.append(_first_request_id(stream)), daemon=True)
    reader.start()
    reader.join(wait)
    if not found or found[0] is None:
        return False
    error = JSONRPCError(
        jsonrpc="2.0", id=found[0], error=ErrorData(code=INTERNAL_ERROR, message=message)
    )
    sys.stdout.write(error.model_dump_json(by_alias=True, exclude_none=True) + "\n")
    sys.stdout.flush()
    return True


def _open_memory(args: argparse.Namespace) -> ReflectiveMemory | PendingStore:
    """The memory of `--dsn` (and its `--read-dsn` replicas) or `--db`.

    A `--db` that holds no store yet is not created here.
    """
    replicas = read_dsn_of(args, args.dsn)
    if args.dsn is not None:
        return ReflectiveMemory(store=args.dsn, read_dsn=replicas)
    if not (Path(args.db) / STORE_FILE).is_file():
        logger.info("no store at %s yet: the first `remember` creates it", args.db)
        return PendingStore(args.db, functools.partial(ReflectiveMemory, args.db))
    return ReflectiveMemory(args.db)


def run(args: argparse.Namespace) -> int:
    """Check the options, open the store and serve until the client or a signal stops it.

    Over stdio a server that cannot start (a bad option, a store that does not open) also
    answers the client's first request with the reason, so the MCP client shows it.

    Raises:
        ConfigError: A bad option, before the store is opened.
        ReflectiveMemoryError: The store cannot be opened.
    """
    try:
        policy = _policy(args)  # every option checked before the store is opened
        memory = _open_memory(args)
    except ReflectiveMemoryError as exc:
        if args.transport == "stdio":
            reason = " ".join(str(exc).splitlines()) or type(exc).__name__
            refuse_over_stdio(f"reflective-memory mcp cannot start: {reason}")
        raise
    try:
        if policy is None:
            server = build_server(memory, lambda ctx: args.user)
            logger.info("serving %s's memory over stdio", args.user)
            server.run("stdio")
            return 0
        import uvicorn

        shown = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{shown}:{args.port}"
        server = build_server(
            memory,
            token_user,
            verifier=TokenUsers(policy),
            host=args.host,
            url=url,
            max_body_bytes=args.max_body_bytes,
            idle_seconds=args.session_idle_seconds,
        )
        logging.getLogger("mcp.server.streamable_http").addFilter(_EndedStreamNoise())
        sys.stderr.write(f"reflective-memory MCP server: {url}/mcp\n")
        sys.stderr.flush()
        app = http_app(
            server,
            args.max_body_bytes,
            per_token=args.max_sessions_per_token,
            idle_seconds=args.session_idle_seconds,
            per_minute=args.max_requests_per_minute,
            read_seconds=args.body_read_seconds,
            max_pending=args.max_pending_bodies,
        )
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return 0
    finally:
        memory.close()
