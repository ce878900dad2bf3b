"""Helpers shared by the LangChain adapters: memory formatting, citations, sessions.

Nothing here imports LangChain; the adapters convert LangChain types and call into these and
into `reflective_memory.ReflectiveMemory`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from reflective_memory.errors import InvalidInputError, UnknownMemoryError, UnknownSessionError
from reflective_memory.kept_retrievals import RetrievalCache
from reflective_memory.memory_block import CITATION_INSTRUCTION, memory_block
from reflective_memory.rmm.citations import strip_citations
from reflective_memory.types import Hit, Memory, Retrieval
from reflective_memory.validation import role_or

__all__ = [
    "CITATION_INSTRUCTION",
    "format_memories",
    "send_feedback",
    "iso",
    "new_session_id",
    "SessionTracker",
    "RetrievalCache",
    "ROLE_OF_TYPE",
    "speaker_role",
    "stored_text",
]

logger = logging.getLogger(__name__)

#: LangChain message `type` -> role stored in the core.
ROLE_OF_TYPE = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def speaker_role(name: Any, role: str) -> str:
    """The role a message is stored under: its speaker `name` when that is a valid label.

    A name the core refuses as a role (`validation.check_role`: empty, too long, brackets,
    colons, control characters) falls back to `role`.
    """
    return role_or(name, role)


def stored_text(text: str, from_assistant: bool) -> str:
    """The text a message is stored as: an assistant's answer loses our citation marks."""
    return strip_citations(text) if from_assistant else text


def iso(value: datetime | None) -> str | None:
    """ISO-8601 text of a datetime, `None` stays `None`."""
    return None if value is None else value.isoformat()


def new_session_id() -> str:
    """A fresh random session id."""
    return uuid.uuid4().hex


def format_memories(
    memories: Sequence[Hit | Memory], instruction: str | None = CITATION_INSTRUCTION
) -> str:
    """Number memories for citation, `[0]` first (`reflective_memory.memory_block`).

    Example:
        >>> from reflective_memory.types import Memory
        >>> from datetime import datetime
        >>> t = datetime(2024, 1, 1)
        >>> m = Memory("m1", "u", "s", "turn", "user: I like tea", "k", ("s:0",), t, t)
        >>> block = format_memories([m], instruction=None)
        >>> "[0]" in block and "user: I like tea" in block
        True
    """
    return memory_block(memories, instruction)


def send_feedback(memory: Any, retrieval: Retrieval | None, answer: str) -> Any | None:
    """Forward an answer's citations to the memory's turn ranker (`memory.feedback`).

    Sent when the retrieval showed at least one memory and the engine reranks
    (`config.rerank.enabled`). Feedback never breaks the conversation: failures are logged and
    `None` is
    returned.

    Returns:
        The engine's `FeedbackResult`, or `None` when nothing was sent or learning failed.
    """
    if retrieval is None or not retrieval.hits or not memory.config.rerank.enabled:
        return None
    try:
        return memory.feedback(retrieval, answer)
    except UnknownMemoryError as exc:  # it showed what was erased since: refused, nothing learned
        logger.warning("citation feedback not taken for user %s: %s", retrieval.user_id, exc)
        return None
    except Exception:  # feedback is best effort; the exchange is already stored
        logger.exception("citation feedback failed for user %s", retrieval.user_id)
        return None


class SessionTracker:
    """The current session of one user in one adapter, with idle-timeout rollover.

    Args:
        memory: The core `ReflectiveMemory`.
        user_id: The user.
        session_id: The starting session (`None`: a fresh random id).
        idle_timeout_seconds: End the session when its last turn is older than this when the
            next exchange starts (`None`: only explicit ends).
    """

    def __init__(
        self,
        memory: Any,
        user_id: str,
        session_id: str | None = None,
        idle_timeout_seconds: float | None = None,
    ) -> None:
        if idle_timeout_seconds is not None and not idle_timeout_seconds > 0:
            raise InvalidInputError("idle_timeout_seconds must be None or > 0")
        self.memory = memory
        self.user_id = user_id
        self.session_id = new_session_id() if session_id is None else session_id
        self.idle_timeout_seconds = idle_timeout_seconds

    def current(self, timestamp: Any = None) -> str:
        """The session to record into now, ending the current one first if it went idle.

        Args:
            timestamp: The incoming message's own time, if it has one. Without it, the time
                the core would store the message at (`ReflectiveMemory.turn_time`: the wall
                clock in a live chat, the conversation's time in a replayed one), so a
                replayed conversation never ends on idle because it is stored today.
        """
        if self.idle_timeout_seconds is None:
            return self.session_id
        turns = self.memory.turns(self.user_id, self.session_id)
        last = turns[-1].timestamp if turns else None
        if last is not None and self.session_id in self.memory.open_sessions(self.user_id):
            now = self.memory.turn_time(self.user_id, self.session_id, timestamp)
            if (now - last).total_seconds() > self.idle_timeout_seconds:
                logger.info(
                    "session %s of user %s idle for more than %.0f s: ending it",
                    self.session_id,
                    self.user_id,
                    self.idle_timeout_seconds,
                )
                self.end()
        return self.session_id

    def end(self, next_session_id: str | None = None) -> list[Memory]:
        """End the current session (build its memories) and move on to a new one.

        Args:
            next_session_id: Id of the session that follows (`None`: a fresh random id).

        Returns:
            The memories built; `[]` when the session had no turns.
        """
        built: list[Memory] = []
        try:
            built = self.memory.end_session(self.user_id, self.session_id)
        except UnknownSessionError:
            built = []
        self.session_id = new_session_id() if next_session_id is None else next_session_id
        return built
