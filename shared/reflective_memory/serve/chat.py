"""The chat behind the web app: store turns, retrieve, answer with citations, learn from marks.

One `ChatService` wraps a `ReflectiveMemory` and an answerer. Each message becomes an
`Exchange`: the user turn, the retrieval made for it, the answer and the citations. Exchanges
are kept in process memory (the last `max_exchanges`), because feedback needs the `Retrieval`.

Learning (RMM retrospective reflection): when an LLM answered and cited (or said `[NO_CITE]`),
its citations are sent to `ReflectiveMemory.feedback` at once. Offline extractive replies are
not fed back on their own (the answerer chose those memories from the ranking itself, so it
would only teach the reranker its own order); for them, and to correct an LLM, the user's
helpful / not-helpful marks are: each mark sends one episode whose cited set is the answer's
citations with every mark of that reply applied.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError, ReflectiveMemoryError
from reflective_memory.rmm.feedback import FeedbackResult
from reflective_memory.serve.answer import Answer
from reflective_memory.types import Hit, Memory, Retrieval
from reflective_memory.validation import check_id

__all__ = ["Answerer", "Exchange", "ChatService", "UnknownExchangeError", "MAX_MESSAGE_CHARS"]

logger = logging.getLogger(__name__)

#: Longest chat message accepted.
MAX_MESSAGE_CHARS = 8000


class UnknownExchangeError(ReflectiveMemoryError, KeyError):
    """The reply named is not (or no longer) held by this server for that user."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown reply"


class Answerer(Protocol):
    """What the chat needs to produce a reply."""

    source: str

    def answer(self, query: str, hits: list[Hit], context: str | None = None) -> Answer:
        """Answer `query` from `hits`, citing positions in `hits`."""
        ...


@dataclass
class Exchange:
    """One message, the retrieval made for it and the reply.

    Attributes:
        exchange_id: Id of the exchange (the retrieval's id).
        user_id: The user.
        session_id: The session the message was sent in.
        message: The user's message.
        retrieval: The memories retrieved for the message.
        answer: The reply and its citations.
        user_turn_id: Stored id of the message turn.
        assistant_turn_id: Stored id of the reply turn.
        created_at: When the reply was made.
        auto_feedback: What the LLM's own citations taught the reranker, if they were sent.
        marks: The user's helpful (True) / not helpful (False) mark per hit position.
        feedback: What each mark taught the reranker, in order.
    """

    exchange_id: str
    user_id: str
    session_id: str
    message: str
    retrieval: Retrieval
    answer: Answer
    user_turn_id: str
    assistant_turn_id: str
    created_at: datetime
    auto_feedback: FeedbackResult | None = None
    marks: dict[int, bool] = field(default_factory=dict)
    feedback: list[FeedbackResult] = field(default_factory=list)

    def judged_cited(self) -> list[int]:
        """The answer's citations with the user's marks applied."""
        cited = set(self.answer.cited)
        for pos, helpful in self.marks.items():
            (cited.add if helpful else cited.discard)(pos)
        return sorted(cited)


def new_session_id(now: datetime | None = None) -> str:
    """A fresh, readable chat session id (`chat-YYYYMMDD-HHMMSS-xxxx`)."""
    now = now if now is not None else datetime.now()
    return f"chat-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


class ChatService:
    """Chat over a `ReflectiveMemory`.

    Args:
        memory: The store.
        answerer: `OfflineAnswerer`, `LLMAnswerer` or anything with `answer` and `source`.
        k: Memories retrieved per message.
        context_turns: Recent turns of the current session shown to an LLM.
        max_exchanges: Exchanges kept for display and feedback (oldest dropped first).
        auto_feedback: Send an LLM's citations to `feedback` when it replies.
    """

    def __init__(
        self,
        memory: ReflectiveMemory,
        answerer: Answerer,
        *,
        k: int = 5,
        context_turns: int = 6,
        max_exchanges: int = 500,
        auto_feedback: bool = True,
    ) -> None:
        if k < 1 or context_turns < 0 or max_exchanges < 1:
            raise InvalidInputError("k >= 1, context_turns >= 0 and max_exchanges >= 1 required")
        self.memory = memory
        self.answerer = answerer
        self.k = k
        self.context_turns = context_turns
        self.max_exchanges = max_exchanges
        self.auto_feedback = auto_feedback
        self._exchanges: OrderedDict[str, Exchange] = OrderedDict()
        self._lock = threading.RLock()
        self._user_locks: dict[str, threading.Lock] = {}

    def _user_lock(self, user_id: str) -> threading.Lock:
        with self._lock:
            return self._user_locks.setdefault(user_id, threading.Lock())

    @staticmethod
    def check_message(message: Any) -> str:
        """The message, checked: a non-empty str of at most `MAX_MESSAGE_CHARS` characters."""
        if not isinstance(message, str) or not message.strip():
            raise InvalidInputError("the message must not be empty")
        if len(message) > MAX_MESSAGE_CHARS:
            raise InvalidInputError(
                f"the message has {len(message)} characters; at most {MAX_MESSAGE_CHARS} allowed"
            )
        return message.strip()

    def _context(self, user_id: str, session_id: str) -> str | None:
        if self.context_turns == 0:
            return None
        turns = self.memory.turns(user_id, session_id)[-self.context_turns :]
        return "\n".join(f"{t.role}: {t.text}" for t in turns) or None

    def send(self, user_id: str, session_id: str, message: str) -> Exchange:
        """Retrieve memories for the message, store it, answer, store the answer.

        Raises:
            InvalidInputError: Bad user id, session id or message (nothing is stored).
        """
        check_id("user_id", user_id)
        check_id("session_id", session_id)
        message = self.check_message(message)
        with self._user_lock(user_id):
            context = self._context(user_id, session_id)
            said = datetime.now(timezone.utc)  # a live chat: the message is said now
            # Recall first: the new message is searchable once stored and would find itself.
            retrieval = self.memory.retrieve(user_id, message, k=self.k, now=said)
            user_turn = self.memory.add_turn(user_id, session_id, "user", message, timestamp=said)
            answer = self.answerer.answer(message, list(retrieval.hits), context)
            reply_turn = self.memory.add_turn(
                user_id, session_id, "assistant", answer.text, timestamp=datetime.now(timezone.utc)
            )
        ex = Exchange(
            exchange_id=retrieval.retrieval_id or secrets.token_hex(16),
            user_id=user_id,
            session_id=session_id,
            message=message,
            retrieval=retrieval,
            answer=answer,
            user_turn_id=user_turn.turn_id,
            assistant_turn_id=reply_turn.turn_id,
            created_at=datetime.now(),
        )
        if (
            self.auto_feedback
            and answer.source == "llm"
            and answer.fallback_reason is None
            and retrieval.hits
            and (answer.cited or answer.no_cite)
        ):
            try:
                ex.auto_feedback = self.memory.feedback(retrieval, cited=list(answer.cited))
            except ReflectiveMemoryError as exc:
                logger.warning("citation feedback failed: %s", exc)
        with self._lock:
            self._exchanges[ex.exchange_id] = ex
            while len(self._exchanges) > self.max_exchanges:
                self._exchanges.popitem(last=False)
        return ex

    def exchange(self, user_id: str, exchange_id: str) -> Exchange:
        """An exchange of `user_id` by id.

        Raises:
            UnknownExchangeError: No such exchange for that user (or it was dropped).
        """
        with self._lock:
            ex = self._exchanges.get(exchange_id)
        if ex is None or ex.user_id != user_id:
            raise UnknownExchangeError(
                f"user {user_id!r} has no reply {exchange_id!r} on this server (replies are kept "
                "in memory while the server runs)"
            )
        return ex

    def exchanges(self, user_id: str, session_id: str | None = None) -> list[Exchange]:
        """Exchanges held for a user (optionally one session), oldest first."""
        with self._lock:
            return [
                e
                for e in self._exchanges.values()
                if e.user_id == user_id and (session_id is None or e.session_id == session_id)
            ]

    def mark(self, user_id: str, exchange_id: str, position: Any, helpful: Any) -> FeedbackResult:
        """Record a helpful / not-helpful mark on a hit and train the reranker with it.

        Raises:
            UnknownExchangeError: No such exchange for that user.
            InvalidInputError: `position` is no hit of the exchange or `helpful` is no bool.
        """
        ex = self.exchange(user_id, exchange_id)
        n = len(ex.retrieval.hits)
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < n:
            raise InvalidInputError(f"hit must be a position from 0 to {n - 1}, got {position!r}")
        if not isinstance(helpful, bool):
            raise InvalidInputError(f"helpful must be true or false, got {helpful!r}")
        with self._lock:
            ex.marks[position] = helpful
            cited = ex.judged_cited()
        result = self.memory.feedback(ex.retrieval, cited=cited)
        with self._lock:
            ex.feedback.append(result)
        return result

    def end_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Turn a session into memories (`ReflectiveMemory.end_session`)."""
        with self._user_lock(user_id):
            return self.memory.end_session(user_id, session_id)

    def start_session(self, user_id: str) -> tuple[str, list[str]]:
        """End the user's open sessions and return a fresh session id and the ended ids."""
        check_id("user_id", user_id)
        ended = []
        with self._user_lock(user_id):
            for sid in self.memory.open_sessions(user_id):
                self.memory.end_session(user_id, sid)
                ended.append(sid)
        return new_session_id(), ended

    def forget(self, user_id: str, session_id: str | None = None) -> None:
        """Drop held exchanges of a deleted user (or session)."""
        with self._lock:
            for key in [
                k
                for k, e in self._exchanges.items()
                if e.user_id == user_id and (session_id is None or e.session_id == session_id)
            ]:
                del self._exchanges[key]

    def forget_memory(self, user_id: str, memory_id: str) -> None:
        """Drop held exchanges that show a deleted memory, so its text is shown nowhere."""
        with self._lock:
            for key in [
                k
                for k, e in self._exchanges.items()
                if e.user_id == user_id and any(h.memory.id == memory_id for h in e.retrieval.hits)
            ]:
                del self._exchanges[key]
