"""Chat stores backed by the core's durable store.

* `ReflectiveChatStore(BaseChatStore)` for `ChatMemoryBuffer` and the chat engines;
* `ReflectiveDBChatStore(AsyncDBChatStore)` for the newer `Memory`
  (`Memory.from_defaults(chat_store=...)`), which needs an active/archived FIFO queue.

**Key format.** A store serves one user (`user_id=`); a key is that user's session id in the core
(`ChatMemoryBuffer.chat_store_key`, `Memory.session_id`). Each message is one core turn, committed
before the call returns; `role` is the message role and the text is its content. Messages the
text cannot carry whole (tool calls, extra kwargs, images) keep their full LlamaIndex form in the
turn's extra data, so they come back unchanged. A `timestamp` in a message's `additional_kwargs`
(datetime, Unix seconds or a date string) becomes the turn's time.

**Deleting.** Removing single messages (`delete_message`, `delete_last_message`, the replaced
tail in `set_messages`, `delete_oldest_messages`) deletes those turns from the core. Clearing a
whole history (`delete_messages`, e.g. `ChatMemoryBuffer.reset()` / `Memory.reset()`) first ends
the session, so what was said becomes long-term memory, then hides the turns from the chat
history; they stay in the core as the source of those memories. `forget(key)` erases the
session's turns and memories for good. `end_session(key)` builds memories at any time.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._compat import require_llama_index

require_llama_index()

from llama_index.core.base.llms.types import ChatMessage, TextBlock  # noqa: E402
from llama_index.core.bridge.pydantic import ConfigDict, Field  # noqa: E402
from llama_index.core.storage.chat_store.base import BaseChatStore  # noqa: E402
from llama_index.core.storage.chat_store.base_db import (  # noqa: E402
    AsyncDBChatStore,
    MessageStatus,
)
from reflective_memory.engine import ReflectiveMemory  # noqa: E402
from reflective_memory.errors import InvalidInputError, StoreCorruptedError  # noqa: E402
from reflective_memory.rmm.citations import strip_citations  # noqa: E402
from reflective_memory.types import Memory, Turn  # noqa: E402
from reflective_memory.validation import canonical_role, role_or  # noqa: E402
from reflective_memory.validation import message_time as time_of  # noqa: E402

__all__ = [
    "ReflectiveChatStore",
    "ReflectiveDBChatStore",
    "stored_turn",
    "message_text",
    "message_time",
    "speaker_role",
    "without_marks",
]

_MARK_PREFIX = "llamaindex_reflective:marks:"


def message_text(message: ChatMessage) -> str:
    """The text a message is stored (and remembered) as; never empty.

    Text content as is; a message without text (a tool call, an image) gets a short description.
    """
    text = message.content if isinstance(message.content, str) else ""
    if text.strip():
        return text
    calls = message.additional_kwargs.get("tool_calls")
    if calls:
        return f"[tool call] {json.dumps(calls, default=str)[:2000]}"
    kinds = sorted({type(b).__name__ for b in message.blocks if not isinstance(b, TextBlock)})
    if kinds:
        return f"[{', '.join(kinds)}]"
    return "[empty message]"


def message_time(message: ChatMessage) -> Any:
    """The message's own time (`additional_kwargs["timestamp"]`), else None.

    A datetime, Unix seconds or a date string, as `ReflectiveMemory.add_turn` takes; the core
    stores a message without one at its conversation's time (`ReflectiveMemory.turn_time`).
    """
    return time_of(message.additional_kwargs)


def _needs_extra(message: ChatMessage) -> bool:
    text_only = all(isinstance(b, TextBlock) for b in message.blocks)
    has_text = isinstance(message.content, str) and bool(message.content.strip())
    return bool(message.additional_kwargs) or not text_only or not has_text


def _role(message: ChatMessage) -> str:
    role = message.role
    return str(getattr(role, "value", role))


def speaker_role(message: ChatMessage) -> str:
    """The role a message is stored under: the speaker's name when it has a valid one.

    The name is read from `additional_kwargs["name"]` (LlamaIndex's field for it, e.g. from an
    OpenAI message), else `additional_kwargs["metadata"]["name"]`; a name the core refuses as a
    role (`validation.check_role`) falls back to the message role.
    """
    kwargs = message.additional_kwargs
    meta = kwargs.get("metadata")
    name = kwargs.get("name")
    if name is None and isinstance(meta, dict):
        name = meta.get("name")
    return role_or(name, _role(message))


def without_marks(message: ChatMessage) -> ChatMessage:
    """An assistant message without our citation marks (`[0]`, `[NO_CITE]`); others as they are.

    The assistant is any role the core stores as `assistant` (`validation.ROLE_ALIASES`).

    Only a text-only message is cleaned (its text blocks); the original is never changed.
    """
    if canonical_role(_role(message)) != "assistant" or not isinstance(message.content, str):
        return message  # "chatbot" / "model" replies are the assistant's too
    if not all(isinstance(b, TextBlock) for b in message.blocks):
        return message
    text = strip_citations(message.content)
    if text == message.content:
        return message
    clean = message.model_copy(deep=True)
    clean.content = text
    return clean


@dataclass(frozen=True)
class _Handed:
    """The turn a message object a store handed out stands for."""

    message: weakref.ref[ChatMessage]
    memory: weakref.ref[Any]
    user_id: str
    session_id: str
    turn_id: str


#: The stores' own record of the message objects they handed out: `id(message)` -> its turn.
#: An entry leaves with its message (a weak reference), so this holds only live messages.
_HANDED: dict[int, _Handed] = {}
_HANDED_LOCK = threading.RLock()  # a message may die (its callback) while it is held


def _forget_handed(key: int, ref: weakref.ref[ChatMessage]) -> None:
    with _HANDED_LOCK:
        if key in _HANDED and _HANDED[key].message is ref:
            del _HANDED[key]


def _hand_out(
    memory: Any, user_id: str, session_id: str, pairs: Sequence[tuple[Turn, ChatMessage]]
):
    """Record which turn each message object read from a store stands for."""
    with _HANDED_LOCK:
        for turn, message in pairs:
            key = id(message)
            ref = weakref.ref(message, lambda r, key=key: _forget_handed(key, r))
            _HANDED[key] = _Handed(ref, weakref.ref(memory), user_id, session_id, turn.turn_id)


def stored_turn(message: ChatMessage, memory: Any, user_id: str) -> tuple[str, str] | None:
    """`(session_id, turn_id)` of the stored turn `message` was read from, if it was.

    A message object one of our chat stores handed out (`get_messages`, what `Memory` flushes
    to its blocks) is a turn already stored in `memory` for `user_id`; a block given it must
    not store it again. Decided by the stores' own record of the objects they handed out, not
    by comparing texts, so system messages, repeated flushes and concurrent `aput` calls
    store each message once. None for any other message (a copy, one of another store).
    """
    with _HANDED_LOCK:
        found = _HANDED.get(id(message))
    if found is None or found.message() is not message or found.memory() is not memory:
        return None
    if found.user_id != user_id:
        return None
    return found.session_id, found.turn_id


class _Conversations:
    """Message-level operations on one user's core sessions (shared by both stores)."""

    def __init__(self, memory: Any, user_id: str) -> None:
        self.memory = memory
        self.user_id = user_id

    # marks: turns with seq <= cleared are hidden; cleared < seq <= archived are archived.
    def _mark_key(self, key: str) -> str:
        return _MARK_PREFIX + json.dumps([self.user_id, key])

    def marks(self, key: str) -> tuple[int, int]:
        """(cleared, archived) sequence marks of a key.

        Raises:
            StoreCorruptedError: The stored marks are not two non-negative integers (an edited
                or damaged value); nothing is shown rather than the wrong messages.
        """
        got = self.memory.store.get_value(self._mark_key(key))
        if not got:
            return 0, 0
        ok = (
            isinstance(got, list)
            and len(got) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in got)
        )
        if not ok:
            raise StoreCorruptedError(
                f"the chat store's marks of session {key!r} of user {self.user_id!r} are "
                f"damaged (expected two non-negative integers, got {str(got)[:60]}); "
                "delete the value or restore the store from a backup"
            )
        return got[0], got[1]

    def set_marks(self, key: str, cleared: int, archived: int) -> None:
        self.memory.store.set_value(self._mark_key(key), [cleared, max(archived, cleared)])

    def exists(self, key: str) -> bool:
        return self.memory.store.session(self.user_id, key) is not None

    def turns(self, key: str, status: MessageStatus | None) -> list[Turn]:
        """Visible turns of a key: `ACTIVE`, `ARCHIVED`, or both (`None`)."""
        if not self.exists(key):
            return []
        cleared, archived = self.marks(key)
        out = []
        for t in self.memory.turns(self.user_id, key):
            if t.seq <= cleared:
                continue
            is_archived = t.seq <= archived
            if status is None or (status == MessageStatus.ARCHIVED) == is_archived:
                out.append(t)
        return out

    def messages(self, key: str, turns: Sequence[Turn]) -> list[ChatMessage]:
        """The turns as messages; each object is recorded as its turn (`stored_turn`)."""
        extras = self.memory.store.turn_extra(self.user_id, key) if turns else {}
        out = []
        for t in turns:
            extra = extras.get(t.turn_id)
            if extra is not None:
                out.append(ChatMessage.model_validate(extra))
            else:
                out.append(ChatMessage(role=t.role, content=t.text))
        _hand_out(self.memory, self.user_id, key, list(zip(turns, out, strict=True)))
        return out

    def add(self, key: str, messages: Sequence[ChatMessage]) -> list[Turn]:
        if not messages:
            return []
        for m in messages:
            if not isinstance(m, ChatMessage):
                raise InvalidInputError(f"expected ChatMessage, got {type(m).__name__}")
        messages = [without_marks(m) for m in messages]
        stored = self.memory.add_turns(
            [
                {
                    "user_id": self.user_id,
                    "session_id": key,
                    "role": speaker_role(m),
                    "text": message_text(m),
                    "timestamp": message_time(m),
                }
                for m in messages
            ]
        )
        extras = {
            t.turn_id: m.model_dump(mode="json")
            for t, m in zip(stored, messages, strict=True)
            if _needs_extra(m)
        }
        self.memory.store.set_turn_extra(self.user_id, key, extras)
        return stored

    def delete(self, key: str, turns: Sequence[Turn]) -> list[ChatMessage]:
        if not turns:
            return []
        gone = self.messages(key, turns)
        self.memory.delete_turns(self.user_id, key, [t.turn_id for t in turns])
        return gone

    def replace(self, key: str, current: Sequence[Turn], messages: Sequence[ChatMessage]) -> None:
        """Make `current` read as `messages`: keep the common prefix, replace the rest."""
        old = self.messages(key, current)
        same = 0
        for a, b in zip(old, messages, strict=False):
            if a.model_dump(mode="json") != without_marks(b).model_dump(mode="json"):
                break
            same += 1
        self.delete(key, current[same:])
        self.add(key, list(messages[same:]))

    def clear(self, key: str, end_session: bool) -> None:
        """End the session (optionally) and hide every turn of the key from the chat history."""
        turns = self.turns(key, None)
        if not turns:
            return
        if end_session and key in self.memory.open_sessions(self.user_id):
            self.memory.end_session(self.user_id, key)
        last = max(t.seq for t in turns)
        self.set_marks(key, last, last)

    def keys(self) -> list[str]:
        return [s.session_id for s in self.memory.store.sessions(self.user_id) if s.n_turns > 0]


_MEMORY_FIELD = "The core ReflectiveMemory that stores the turns."


def _check(memory: Any, user_id: Any) -> None:
    """Construction checks common to both stores (before anything is stored)."""
    if not isinstance(memory, ReflectiveMemory):
        raise InvalidInputError("memory must be a ReflectiveMemory")
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id must be a non-empty str")


# Session operations both stores offer, shared as plain functions (no common base class).
def _end_session(self: Any, key: str) -> list[Memory]:
    """Build long-term memories from the key's session now; returns them."""
    return self.memory.end_session(self.user_id, key)  # type: ignore[no-any-return]


async def _aend_session(self: Any, key: str) -> list[Memory]:
    """Async twin of `end_session`."""
    return await self.memory.aend_session(self.user_id, key)


def _forget(self: Any, key: str) -> int:
    """Erase the key's turns and memories from the core; return turns deleted (0 if none)."""
    if not _Conversations(self.memory, self.user_id).exists(key):
        return 0
    return self.memory.delete_session(self.user_id, key)  # type: ignore[no-any-return]


async def _aforget(self: Any, key: str) -> int:
    """Async twin of `forget`."""
    return await self.memory.arun(self.forget, key)


#: A store's conversations, read through the core.
_CONVERSATIONS = property(lambda self: _Conversations(self.memory, self.user_id))


class ReflectiveChatStore(BaseChatStore):
    """A LlamaIndex `BaseChatStore` whose messages are turns in the core's store.

    Use it with `ChatMemoryBuffer.from_defaults(chat_store=..., chat_store_key=session_id)`.
    See the module docstring for the key format and what deleting does.

    Args:
        memory: The core `ReflectiveMemory`.
        user_id: The user every key belongs to.
        end_session_on_clear: `delete_messages(key)` ends the session (builds memories) first.

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> store = ReflectiveChatStore(memory=ReflectiveMemory(embedder=HashingEmbedder()),
        ...                             user_id="ana")
        >>> store.add_message("s1", ChatMessage(role="user", content="hi"))
        >>> [m.content for m in store.get_messages("s1")], store.get_keys()
        (['hi'], ['s1'])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: Any = Field(exclude=True, description=_MEMORY_FIELD)
    user_id: str = Field(description="The user every key (session id) belongs to.")
    end_session_on_clear: bool = Field(
        default=True, description="delete_messages ends the session (builds memories) first."
    )

    end_session = _end_session
    aend_session = _aend_session
    forget = _forget
    aforget = _aforget
    _conv = _CONVERSATIONS

    def __init__(self, *, memory: Any, user_id: str, **kwargs: Any) -> None:
        _check(memory, user_id)
        super().__init__(memory=memory, user_id=user_id, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """Name used in LlamaIndex serialisation."""
        return "ReflectiveChatStore"

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Make the key's history read as `messages` (unchanged leading messages are kept)."""
        conv = self._conv
        conv.replace(key, conv.turns(key, MessageStatus.ACTIVE), messages)

    def get_messages(self, key: str) -> list[ChatMessage]:
        """The key's chat history, oldest first (`[]` for an unknown key)."""
        conv = self._conv
        return conv.messages(key, conv.turns(key, MessageStatus.ACTIVE))

    def add_message(self, key: str, message: ChatMessage) -> None:
        """Append a message (committed before this returns)."""
        self._conv.add(key, [message])

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        """Clear the key's history (ending the session first); return it, or None if unknown."""
        conv = self._conv
        if not conv.exists(key):
            return None
        gone = conv.messages(key, conv.turns(key, MessageStatus.ACTIVE))
        conv.clear(key, self.end_session_on_clear)
        return gone

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Delete the `idx`-th message of the history; return it (None if out of range)."""
        conv = self._conv
        turns = conv.turns(key, MessageStatus.ACTIVE)
        if not -len(turns) <= idx < len(turns):
            return None
        return conv.delete(key, [turns[idx]])[0]

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Delete the newest message; return it (None if the history is empty)."""
        return self.delete_message(key, -1)

    def get_keys(self) -> list[str]:
        """The user's session ids that have turns."""
        return self._conv.keys()

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Async twin of `set_messages`."""
        await self.memory.arun(self.set_messages, key, messages)

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        """Async twin of `get_messages`."""
        return await self.memory.arun(self.get_messages, key)

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        """Async twin of `add_message` (LlamaIndex's name for it)."""
        await self.memory.arun(self.add_message, key, message)

    async def aadd_message(self, key: str, message: ChatMessage) -> None:
        """Alias of `async_add_message`."""
        await self.async_add_message(key, message)

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        """Async twin of `delete_messages`."""
        return await self.memory.arun(self.delete_messages, key)

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Async twin of `delete_message`."""
        return await self.memory.arun(self.delete_message, key, idx)

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        """Async twin of `delete_last_message`."""
        return await self.memory.arun(self.delete_last_message, key)

    async def aget_keys(self) -> list[str]:
        """Async twin of `get_keys`."""
        return await self.memory.arun(self.get_keys)


class ReflectiveDBChatStore(AsyncDBChatStore):
    """The chat store of LlamaIndex's `Memory`, backed by the core's store.

    Use it as `Memory.from_defaults(session_id=..., chat_store=ReflectiveDBChatStore(...))`.
    Active messages are the short-term FIFO queue; archived ones were flushed from it (to the
    memory blocks) and stay readable with `status=ARCHIVED`. `delete_message(key, idx)` takes the
    index in the key's active messages. See the module docstring for keys and deletion.

    Args:
        memory: The core `ReflectiveMemory`.
        user_id: The user every key belongs to.
        end_session_on_clear: Clearing a key (`delete_messages` with `status=None`) ends the
            session (builds memories) first.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: Any = Field(exclude=True, description=_MEMORY_FIELD)
    user_id: str = Field(description="The user every key (session id) belongs to.")
    end_session_on_clear: bool = Field(
        default=True, description="Clearing a key ends the session (builds memories) first."
    )

    end_session = _end_session
    aend_session = _aend_session
    forget = _forget
    aforget = _aforget
    _conv = _CONVERSATIONS

    def __init__(self, *, memory: Any, user_id: str, **kwargs: Any) -> None:
        _check(memory, user_id)
        super().__init__(memory=memory, user_id=user_id, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """Name used in LlamaIndex serialisation."""
        return "ReflectiveDBChatStore"

    # sync bodies, run in a worker thread by the async API
    def _get(
        self, key: str, status: MessageStatus | None, limit: int | None, offset: int | None
    ) -> list[ChatMessage]:
        conv = self._conv
        turns = conv.turns(key, status)
        start = 0 if offset is None else offset
        turns = turns[start:] if limit is None else turns[start : start + limit]
        return conv.messages(key, turns)

    def _add(self, key: str, messages: list[ChatMessage], status: MessageStatus) -> None:
        conv = self._conv
        if status == MessageStatus.ARCHIVED:
            if conv.turns(key, MessageStatus.ACTIVE):
                raise InvalidInputError(
                    "archived messages can only be added while the key has no active messages"
                )
            stored = conv.add(key, messages)
            if stored:
                cleared, _ = conv.marks(key)
                conv.set_marks(key, cleared, max(t.seq for t in stored))
            return
        conv.add(key, messages)

    def _set(self, key: str, messages: list[ChatMessage], status: MessageStatus) -> None:
        conv = self._conv
        if status == MessageStatus.ARCHIVED:
            self._delete_all(key, None)
            self._add(key, messages, status)
            return
        archived = conv.turns(key, MessageStatus.ARCHIVED)
        if archived:
            top = max(t.seq for t in archived)
            conv.set_marks(key, top, top)
        conv.replace(key, conv.turns(key, MessageStatus.ACTIVE), messages)

    def _delete_all(self, key: str, status: MessageStatus | None) -> None:
        conv = self._conv
        if status is None:
            conv.clear(key, self.end_session_on_clear)
        elif status == MessageStatus.ARCHIVED:
            archived = conv.turns(key, MessageStatus.ARCHIVED)
            if archived:
                top = max(t.seq for t in archived)
                conv.set_marks(key, top, top)
        else:
            conv.delete(key, conv.turns(key, MessageStatus.ACTIVE))

    def _delete_one(self, key: str, idx: int) -> ChatMessage | None:
        conv = self._conv
        turns = conv.turns(key, MessageStatus.ACTIVE)
        if not -len(turns) <= idx < len(turns):
            return None
        return conv.delete(key, [turns[idx]])[0]

    def _oldest(self, key: str, n: int, archive: bool) -> list[ChatMessage]:
        if n < 0:
            raise InvalidInputError("n must be >= 0")
        conv = self._conv
        turns = conv.turns(key, MessageStatus.ACTIVE)[:n]
        if not turns:
            return []
        if not archive:
            return conv.delete(key, turns)
        cleared, _ = conv.marks(key)
        conv.set_marks(key, cleared, max(t.seq for t in turns))
        return conv.messages(key, turns)

    async def get_messages(
        self,
        key: str,
        status: MessageStatus | None = MessageStatus.ACTIVE,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[ChatMessage]:
        """Messages of a key with the given status (`None`: both), oldest first."""
        return await self.memory.arun(self._get, key, status, limit, offset)

    async def count_messages(
        self, key: str, status: MessageStatus | None = MessageStatus.ACTIVE
    ) -> int:
        """Number of messages of a key with the given status."""
        return len(await self.memory.arun(self._conv.turns, key, status))

    async def add_message(
        self, key: str, message: ChatMessage, status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Append one message (committed before this returns)."""
        await self.memory.arun(self._add, key, [message], status)

    async def add_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Append messages in one transaction."""
        await self.memory.arun(self._add, key, list(messages), status)

    async def set_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Replace the key's messages (unchanged leading active messages are kept)."""
        await self.memory.arun(self._set, key, list(messages), status)

    async def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Delete the `idx`-th active message; return it (None if out of range)."""
        return await self.memory.arun(self._delete_one, key, idx)

    async def delete_messages(self, key: str, status: MessageStatus | None = None) -> None:
        """Clear a key (`None`), hide its archived messages, or delete its active ones."""
        await self.memory.arun(self._delete_all, key, status)

    async def delete_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Delete the oldest `n` active messages and return them."""
        return await self.memory.arun(self._oldest, key, n, False)

    async def archive_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Archive the oldest `n` active messages and return them."""
        return await self.memory.arun(self._oldest, key, n, True)

    async def get_keys(self) -> list[str]:
        """The user's session ids that have turns."""
        return await self.memory.arun(self._conv.keys)
