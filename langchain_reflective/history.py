"""`ReflectiveChatMessageHistory`: a session's messages kept durably in the core store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
)
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import UnknownSessionError
from reflective_memory.types import Memory, Turn
from reflective_memory.validation import message_time

from ._common import ROLE_OF_TYPE, speaker_role, stored_text

__all__ = ["ReflectiveChatMessageHistory", "message_to_role", "turn_to_message"]

logger = logging.getLogger(__name__)

#: Turn extra data naming the message type of a turn stored under its speaker's name.
_TYPE_KEY = "langchain_type"


def message_to_role(message: BaseMessage) -> str:
    """The role stored for a message: its valid speaker `name`, else its type's role.

    The type's role is `user`, `assistant`, `system`, `tool` or a `ChatMessage`'s role.
    """
    if isinstance(message, ChatMessage):
        return message.role
    return speaker_role(message.name, ROLE_OF_TYPE.get(message.type, message.type))


def turn_to_message(turn: Turn, message_type: str | None = None) -> BaseMessage:
    """Rebuild a LangChain message from a stored turn (unknown roles become `ChatMessage`).

    Args:
        turn: The stored turn.
        message_type: The LangChain type the turn was stored from when its role is a speaker
            name (`human` / `ai`): the message gets that type back with the role as `name`.
    """
    if message_type == "human":
        return HumanMessage(content=turn.text, id=turn.turn_id, name=turn.role)
    if message_type == "ai":
        return AIMessage(content=turn.text, id=turn.turn_id, name=turn.role)
    if turn.role == "user":
        return HumanMessage(content=turn.text, id=turn.turn_id)
    if turn.role == "assistant":
        return AIMessage(content=turn.text, id=turn.turn_id)
    if turn.role == "system":
        return SystemMessage(content=turn.text, id=turn.turn_id)
    return ChatMessage(role=turn.role, content=turn.text, id=turn.turn_id)


class ReflectiveChatMessageHistory(BaseChatMessageHistory):
    """Messages of one user's session, stored as turns of a `ReflectiveMemory`.

    Every message is committed to the core's SQLite store as soon as it is added, so a history
    survives restarts when the memory has a `path`. `end_session()` turns the session into
    long-term memories. Messages without text (e.g. an AI message carrying only tool calls) are
    not stored.

    Use with `RunnableWithMessageHistory` through `factory`:

        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> get_history = ReflectiveChatMessageHistory.factory(memory=mem, user_id="ana")
        >>> h = get_history("s1")
        >>> h.add_user_message("hi")
        >>> [m.type for m in get_history("s1").messages]
        ['human']

    Args:
        memory: The core memory store.
        user_id: The user.
        session_id: The session.
    """

    def __init__(self, *, memory: ReflectiveMemory, user_id: str, session_id: str) -> None:
        super().__init__()
        self.memory = memory
        self.user_id = user_id
        self.session_id = session_id

    @classmethod
    def factory(
        cls, *, memory: ReflectiveMemory, user_id: str
    ) -> Callable[[str], ReflectiveChatMessageHistory]:
        """A `get_session_history(session_id)` callable for `RunnableWithMessageHistory`."""

        def get_session_history(session_id: str) -> ReflectiveChatMessageHistory:
            return cls(memory=memory, user_id=user_id, session_id=session_id)

        return get_session_history

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, oldest first."""
        turns = self.memory.turns(self.user_id, self.session_id)
        extras = self.memory.store.turn_extra(self.user_id, self.session_id) if turns else {}
        return [turn_to_message(t, extras.get(t.turn_id, {}).get(_TYPE_KEY)) for t in turns]

    async def aget_messages(self) -> list[BaseMessage]:
        """Async twin of `messages`."""
        return await self.memory.arun(lambda: self.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store messages as turns of the session, in one transaction.

        A message's `name` (when a valid speaker label) is its stored role; an AI message's
        citation marks (`[0]`, `[NO_CITE]`) are not stored.
        """
        turns, types = [], []
        for m in messages:
            text = stored_text(str(m.text), m.type == "ai")
            if not text.strip():
                logger.debug("not storing a %s message without text", m.type)
                continue
            role = message_to_role(m)
            turns.append(
                {
                    "user_id": self.user_id,
                    "session_id": self.session_id,
                    "role": role,
                    "text": text,
                    "timestamp": message_time(m.additional_kwargs),
                }
            )
            named = m.type in ("human", "ai") and role != ROLE_OF_TYPE[m.type]
            types.append(m.type if named else None)
        if not turns:
            return
        stored = self.memory.add_turns(turns)
        extras = {t.turn_id: {_TYPE_KEY: k} for t, k in zip(stored, types, strict=True) if k}
        if extras:
            self.memory.store.set_turn_extra(self.user_id, self.session_id, extras)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async twin of `add_messages`."""
        await self.memory.arun(self.add_messages, messages)

    def clear(self) -> None:
        """Delete the session's messages and the memories built from them."""
        try:
            self.memory.delete_session(self.user_id, self.session_id)
        except UnknownSessionError:
            pass

    async def aclear(self) -> None:
        """Async twin of `clear`."""
        await self.memory.arun(self.clear)

    def end_session(self) -> list[Memory]:
        """Close the session: turn its messages into long-term memories (`[]` if empty)."""
        try:
            return self.memory.end_session(self.user_id, self.session_id)
        except UnknownSessionError:
            return []

    async def aend_session(self) -> list[Memory]:
        """Async twin of `end_session`."""
        return await self.memory.arun(self.end_session)
