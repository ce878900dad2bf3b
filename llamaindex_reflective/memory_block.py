"""`ReflectiveMemoryBlock`: long-term memory as a block of LlamaIndex's `Memory`.

`Memory.from_defaults(memory_blocks=[ReflectiveMemoryBlock(memory=..., user_id=...)])`:

* messages flushed from the short-term queue are stored as turns of the user's session (the
  block's `session_id`, else the `Memory`'s) and the session's memories are rebuilt, so they are
  retrievable at once; with a `ReflectiveDBChatStore` of the same memory and user as the
  `Memory`'s chat store, the flushed messages are its turns already and each is stored once
  (`chat_store.stored_turn`), whatever the system messages and concurrent `aput` calls;
* on every `get`, the latest messages are the query; the retrieved memories are numbered `[0]`,
  `[1]`, ... so an answer can cite them, and `feedback(answer)` hands the citations to the core;
* "two weeks ago" resolves against `Memory.get(now=...)`, else the newest message's own time
  (`additional_kwargs["timestamp"]`), else the block's `now`, else the user's newest turn;
* the messages the model already reads (the chat history given to `get`, e.g. the current
  message stored by `ReflectiveDBChatStore` in the same session) never come back as memories.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from ._compat import require_llama_index

require_llama_index()

from llama_index.core.base.llms.types import ChatMessage, MessageRole  # noqa: E402
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402
from llama_index.core.memory.memory import BaseMemoryBlock  # noqa: E402
from reflective_memory import FeedbackResult  # noqa: E402
from reflective_memory.errors import InvalidInputError, SessionChangedError  # noqa: E402
from reflective_memory.llm import count_tokens  # noqa: E402
from reflective_memory.memory_block import (  # noqa: E402
    CITATION_INSTRUCTION,
    memory_block,
    shown_memories,
)
from reflective_memory.rmm.citations import echoes_instructions  # noqa: E402
from reflective_memory.text import parse_timestamp  # noqa: E402
from reflective_memory.types import Hit, Retrieval  # noqa: E402

from .chat_store import (  # noqa: E402
    _role,
    message_text,
    message_time,
    speaker_role,
    stored_turn,
    without_marks,
)

__all__ = ["ReflectiveMemoryBlock", "format_hits", "CITATION_INSTRUCTION"]

logger = logging.getLogger(__name__)

#: Where each numbered memory of a block starts (memory text is quoted, so never there).
_ENTRY_START = re.compile(r"^\[\d+\] ", re.MULTILINE)


def format_hits(hits: list[Hit], instruction: str | None = CITATION_INSTRUCTION) -> str:
    """Number memories for citation, `[0]` first (`reflective_memory.memory_block`)."""
    return memory_block(hits, instruction)


class ReflectiveMemoryBlock(BaseMemoryBlock[str]):
    """A `Memory` block that stores flushed messages and recalls relevant long-term memories.

    Args:
        memory: The core `ReflectiveMemory`.
        user_id: Whose memories are stored and searched.
        session_id: Core session for flushed messages (default: the `Memory`'s session id).
        name: Block name (unique within a `Memory`).
        priority: `Memory` truncation priority (0 = never truncate; higher numbers are cut later).
        top_k: Turns retrieved per `get` (None: passages filling the budget).
        budget_tokens: Token budget of the block per `get`, its citation instruction and
            numbering included (None with `top_k` None: the core's
            `search.default_budget_tokens`, 500).
        query_messages: How many of the latest messages form the query.
        build_on_put: Rebuild the session's memories after each flush (else only when the
            session is ended).
        instruction: The citation instruction above the memories (None: no instruction).
        now: When questions are asked, for "two weeks ago" (any timestamp `add_turn` takes;
            None: the user's newest turn). Per call, `Memory.get(now=...)`, else the newest
            message's own time (`additional_kwargs["timestamp"]`), takes its place.

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> block = ReflectiveMemoryBlock(memory=ReflectiveMemory(embedder=HashingEmbedder()),
        ...                               user_id="ana", session_id="s1")
        >>> import asyncio
        >>> asyncio.run(block.aput([ChatMessage(role="user", content="My dog is Pixel.")]))
        >>> print(asyncio.run(block.aget([ChatMessage(role="user", content="dog name?")])))
        ... # doctest: +ELLIPSIS
        Below are numbered memories ...
        [0] [...]
            user: My dog is Pixel.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: Any = Field(exclude=True, description="The core ReflectiveMemory.")
    user_id: str = Field(description="Whose memories are stored and searched.")
    session_id: str | None = Field(
        default=None, description="Core session for flushed messages (default: the Memory's)."
    )
    name: str = Field(default="reflective_memory", description="Block name.")
    description: str | None = Field(
        default="Long-term memories of earlier conversations, numbered for citation.",
        description="What the block holds.",
    )
    priority: int = Field(default=1, ge=0, description="Truncation priority (0 = never).")
    top_k: int | None = Field(default=None, ge=1, description="Turns per get.")
    budget_tokens: int | None = Field(
        default=None, ge=1, description="Token budget per get (None: the core's default)."
    )
    query_messages: int = Field(default=1, ge=1, description="Latest messages used as query.")
    build_on_put: bool = Field(default=True, description="Rebuild memories after each flush.")
    instruction: str | None = Field(
        default=CITATION_INSTRUCTION, description="Citation instruction above the memories."
    )
    now: datetime | str | float | None = Field(
        default=None,
        description="When questions are asked, for 'two weeks ago' (None: the user's newest "
        "turn); a message's own time or `Memory.get(now=...)` takes its place per call.",
    )

    _last: Retrieval | None = PrivateAttr(default=None)
    _last_hits: list[Hit] = PrivateAttr(default_factory=list)

    def __init__(self, *, memory: Any, user_id: str, **kwargs: Any) -> None:
        if not callable(getattr(memory, "retrieve", None)):
            raise InvalidInputError("memory must be a ReflectiveMemory")
        if not isinstance(user_id, str) or not user_id.strip():
            raise InvalidInputError("user_id must be a non-empty str")
        kwargs["now"] = parse_timestamp(kwargs.get("now"))
        super().__init__(memory=memory, user_id=user_id, **kwargs)

    @property
    def last_retrieval(self) -> Retrieval | None:
        """The core `Retrieval` behind the last `get` (None before the first)."""
        return self._last

    # -- put ------------------------------------------------------------------------------
    def _session(self, messages: list[ChatMessage]) -> str:
        if self.session_id is not None:
            return self.session_id
        for m in messages:
            sid = m.additional_kwargs.get("session_id")
            if isinstance(sid, str) and sid.strip():
                return sid
        raise InvalidInputError(
            "ReflectiveMemoryBlock needs a session: set session_id=... or use it inside Memory"
        )

    def put(self, messages: list[ChatMessage]) -> None:
        """Store messages as turns and (by default) rebuild their session's memories.

        A message one of our chat stores of the same memory and user handed out (what `Memory`
        flushes to its blocks when its chat store is a `ReflectiveDBChatStore`) is a turn of
        that session already and is not stored again: decided by the chat store's own record
        (`chat_store.stored_turn`), so each message is stored once whatever the mix of system
        messages, flushes and concurrent `aput` calls. System messages are not memories.

        A rebuild that keeps meeting new turns (concurrent `aput` calls on one session) is
        left to the next flush or `end_session`: the messages are stored either way.
        """
        talk = [m for m in messages if _role(m) != MessageRole.SYSTEM.value]
        if not talk:
            return
        session = self._session(talk)
        new = [without_marks(m) for m in talk if not self._stored_in(m, session)]
        if new:
            self.memory.add_turns(
                [
                    {
                        "user_id": self.user_id,
                        "session_id": session,
                        "role": speaker_role(m),
                        "text": message_text(m),
                        "timestamp": message_time(m),
                    }
                    for m in new
                ]
            )
        if self.build_on_put:
            try:
                self.memory.end_session(self.user_id, session)
            except SessionChangedError:
                logger.info(
                    "session %r kept changing while built; built at the next flush", session
                )

    def _stored_in(self, message: ChatMessage, session: str) -> bool:
        """Whether `message` was read from a stored turn of `session` (`stored_turn`)."""
        found = stored_turn(message, self.memory, self.user_id)
        return found is not None and found[0] == session

    async def _aput(self, messages: list[ChatMessage]) -> None:
        await self.memory.arun(self.put, list(messages))

    # -- get ------------------------------------------------------------------------------
    def query_for(self, messages: list[ChatMessage] | None) -> str:
        """The query made from the latest messages ('' when there is no text)."""
        texts = [
            m.content
            for m in (messages or [])
            if isinstance(m.content, str)
            and m.content.strip()
            and _role(m) != MessageRole.SYSTEM.value
        ]
        return "\n".join(texts[-self.query_messages :])

    def shown_turns(self, messages: list[ChatMessage] | None, session_id: str | None) -> set[str]:
        """Ids of the stored turns the model reads anyway: the session's turns in `messages`.

        A turn of the block's session (else `session_id`, the `Memory`'s) whose role and text
        match one of the messages is part of the current exchange, not an earlier memory.
        """
        sid = self.session_id or session_id
        if not messages or not sid:
            return set()
        said = {(speaker_role(m), message_text(without_marks(m))) for m in messages}
        return {t.turn_id for t in self.memory.turns(self.user_id, sid) if (t.role, t.text) in said}

    def now_for(self, messages: list[ChatMessage] | None, now: Any = None) -> Any:
        """When the latest messages ask ("two weeks ago" resolves against it).

        `now` when given (`Memory.get(now=...)`), else the newest message's own time
        (`additional_kwargs["timestamp"]`), else the block's `now` (None: the core's default,
        the user's newest turn).
        """
        if now is not None:
            return now
        newest = [m for m in messages or [] if _role(m) != MessageRole.SYSTEM.value][-1:]
        said = message_time(newest[0]) if newest else None
        return self.now if said is None else said

    def get(
        self,
        messages: list[ChatMessage] | None = None,
        session_id: str | None = None,
        now: datetime | str | float | None = None,
    ) -> str:
        """Memories relevant to the latest messages, numbered for citation ('' if none).

        Args:
            messages: The chat history the model reads (its latest messages are the query).
            session_id: The `Memory`'s session, used when the block has none: its turns among
                `messages` are the current exchange and are never returned as memories.
            now: When the question is asked (see `now_for`).
        """
        query = self.query_for(messages)
        if not query:
            self._last, self._last_hits = None, []
            return ""
        retrieval, block = shown_memories(
            self.memory,
            self.user_id,
            query,
            k=self.top_k,
            budget_tokens=self.budget_tokens,
            instruction=self.instruction,
            exclude_turns=sorted(self.shown_turns(messages, session_id)),
            now=self.now_for(messages, now),
            message=True,
        )
        self._last, self._last_hits = retrieval, list(retrieval.hits)
        return block

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        session_id = block_kwargs.get("session_id")
        sid = session_id if isinstance(session_id, str) else None
        return await self.memory.arun(self.get, messages, sid, block_kwargs.get("now"))

    # -- truncation -----------------------------------------------------------------------
    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Drop the lowest-ranked memories until about `tokens_to_truncate` tokens are gone.

        Returns None when nothing is left. Citation numbers of the remaining memories do not
        change (the best ones stay).
        """
        if not content or tokens_to_truncate <= 0:
            return content or None
        starts = [m.start() for m in _ENTRY_START.finditer(content)]
        if not starts:
            return None
        head, entries = content[: starts[0]], []
        for a, b in zip(starts, [*starts[1:], len(content)], strict=True):
            entries.append(content[a:b])
        removed = 0
        while entries and removed < tokens_to_truncate:
            removed += count_tokens(entries.pop())
        if not entries:
            return None
        return (head + "".join(entries)).rstrip("\n")

    # -- feedback -------------------------------------------------------------------------
    def feedback(self, answer: str) -> FeedbackResult:
        """Send an answer's citations about the last `get` to the core (`memory.feedback`).

        Only the answer is read: an answer that echoes this block's instruction (or the
        library's prompts) back teaches nothing.

        Returns:
            The engine's `FeedbackResult` (its reranker for the user learns and is saved with the
            store); with `learned=False` and a `reason` when nothing was retrieved, the engine
            has reranking off, or the answer echoes the instructions.
        """
        last = self._last
        if last is None or not last.hits:
            return FeedbackResult("", self.user_id, reason="nothing was retrieved yet")
        if not self.memory.config.rerank.enabled:
            return FeedbackResult(
                last.retrieval_id, self.user_id, reason="learning is off (config.rerank.enabled)"
            )
        if echoes_instructions(answer, [self.instruction or ""]):
            reason = "the answer echoes the prompt's instructions"
            return FeedbackResult(last.retrieval_id, self.user_id, reason=reason)
        return self.memory.feedback(last, answer)
