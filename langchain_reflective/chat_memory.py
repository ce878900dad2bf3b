"""`ReflectiveChatMemory`: long-term memory for classic LangChain chains (`BaseMemory`)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal

from langchain_classic.base_memory import BaseMemory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import ConfigDict, Field, PrivateAttr
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError, UnknownSessionError
from reflective_memory.memory_block import shown_memories
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Memory, Retrieval
from reflective_memory.validation import MESSAGE_TIME_KEY, message_time

from ._common import (
    CITATION_INSTRUCTION,
    SessionTracker,
    send_feedback,
    stored_text,
)

__all__ = ["ReflectiveChatMemory"]

logger = logging.getLogger(__name__)


class ReflectiveChatMemory(BaseMemory):
    """Drop-in memory for classic chains such as `ConversationChain`.

    Before each call, `load_memory_variables` retrieves the user's memories for the input and
    returns them numbered for citation (`[0]`, `[1]`, ...), followed by the latest turns of the
    current session. After the call, `save_context` records the user turn and the answer in the
    core store and sends the answer's citations back as feedback to the engine's reranker for the
    user (`memory.feedback`; skipped when `config.rerank.enabled` is off). A session ends (and
    becomes memories) on `end_session()` or when it has been idle longer than
    `idle_timeout_seconds`.

    A chain input `timestamp` is the user's message's own time (a replayed conversation): it is
    stored with the message and is the retrieval's `now`; an output `timestamp` is the
    answer's. Without them a message is stored at its conversation's time
    (`ReflectiveMemory.turn_time`), and `now` (else the newest turn) resolves "two weeks ago".

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
        >>> chat = ReflectiveChatMemory(memory=mem, user_id="ana", session_id="s1")
        >>> chat.save_context({"input": "I adopted a cat named Miso."}, {"output": "Lovely!"})
        >>> _ = chat.end_session()
        >>> "Miso" in chat.load_memory_variables({"input": "my cat's name?"})["history"]
        True
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: ReflectiveMemory = Field(description="The core memory store.")
    user_id: str = Field(description="The user this memory serves.")
    session_id: str | None = Field(
        default=None,
        description="The current session id (None: a random one). Updated when a session ends.",
    )
    k: int | None = Field(
        default=None,
        description="Turns retrieved per input (None: passages filling the budget).",
    )
    budget_tokens: int | None = Field(
        default=None,
        description="Token budget for the retrieved memories (core token rule; None with k "
        "None: the core's `search.default_budget_tokens`, 500).",
    )
    memory_key: str = Field(default="history", description="Prompt variable filled by memory.")
    input_key: str | None = Field(
        default=None,
        description="Chain input holding the user's message (None: the only non-memory input).",
    )
    output_key: str | None = Field(
        default=None, description="Chain output holding the answer (None: the only output)."
    )
    return_messages: bool = Field(
        default=False,
        description="Return a list of messages (for MessagesPlaceholder) instead of a string.",
    )
    citation_instruction: str | None = Field(
        default=CITATION_INSTRUCTION,
        description="Text above the numbered memories asking the model to cite them "
        "(None: no instruction).",
    )
    recent_turns: int = Field(
        default=6,
        ge=0,
        description="Latest turns of the current session shown verbatim after the memories.",
    )
    idle_timeout_seconds: float | None = Field(
        default=None,
        description="End the session when its last turn is older than this at the next input.",
    )
    now: datetime | str | float | None = Field(
        default=None,
        description="When questions are asked, for 'two weeks ago' (any timestamp add_turn "
        "takes; None: the user's newest turn). An input's own `timestamp` takes its place.",
    )
    clear_scope: Literal["session", "user"] = Field(
        default="session",
        description="What `clear()` deletes: the current session, or every turn and memory "
        "of the user.",
    )

    _tracker: SessionTracker = PrivateAttr()
    _last: Retrieval | None = PrivateAttr(default=None)

    def __init__(self, **kwargs: Any) -> None:
        """Check `now` first (`InvalidInputError` naming it), then the pydantic fields."""
        kwargs["now"] = parse_timestamp(kwargs.get("now"))
        super().__init__(**kwargs)

    def model_post_init(self, context: Any, /) -> None:
        """Start tracking the session."""
        self._tracker = SessionTracker(
            self.memory, self.user_id, self.session_id, self.idle_timeout_seconds
        )
        self.session_id = self._tracker.session_id

    @property
    def memory_variables(self) -> list[str]:
        """The single prompt variable this memory fills."""
        return [self.memory_key]

    @property
    def last_retrieval(self) -> Retrieval | None:
        """The retrieval made for the latest input (hits, scores, diagnostics)."""
        return self._last

    def _input(self, inputs: dict[str, Any]) -> str:
        key = self.input_key
        if key is None:
            keys = [k for k in inputs if k not in (self.memory_key, "stop", MESSAGE_TIME_KEY)]
            if len(keys) != 1:
                raise InvalidInputError(
                    f"cannot tell which input is the user's message among {sorted(keys)}; "
                    "set input_key"
                )
            key = keys[0]
        if key not in inputs:
            raise InvalidInputError(f"input {key!r} is missing from the chain inputs")
        return str(inputs[key])

    def _output(self, outputs: dict[str, Any]) -> str:
        key = self.output_key
        if key is None:
            keys = [k for k in outputs if k != MESSAGE_TIME_KEY]
            if len(keys) != 1:
                raise InvalidInputError(
                    f"cannot tell which output is the answer among {sorted(keys)}; set output_key"
                )
            key = keys[0]
        if key not in outputs:
            raise InvalidInputError(f"output {key!r} is missing from the chain outputs")
        value = outputs[key]
        return str(value.text) if isinstance(value, BaseMessage) else str(value)

    def _sync_session(self, timestamp: Any = None) -> str:
        sid = self._tracker.current(timestamp)
        self.session_id = sid
        return sid

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Retrieve memories for the input and format them (numbered) with the recent turns."""
        query = self._input(inputs)
        said = message_time(inputs)
        sid = self._sync_session(said)
        recent = []
        if self.recent_turns:
            recent = self.memory.turns(self.user_id, sid)[-self.recent_turns :]
        retrieval: Retrieval | None = None
        block = ""
        if query.strip():  # the recent turns are shown below: they are not memories
            retrieval, block = shown_memories(
                self.memory,
                self.user_id,
                query,
                k=self.k,
                budget_tokens=self.budget_tokens,
                instruction=self.citation_instruction,
                exclude_turns=[t.turn_id for t in recent],
                now=self.now if said is None else said,
                message=True,
            )
        self._last = retrieval
        if self.return_messages:
            messages: list[BaseMessage] = [SystemMessage(content=block)] if block else []
            for t in recent:
                cls = HumanMessage if t.role == "user" else AIMessage
                messages.append(cls(content=t.text))
            return {self.memory_key: messages}
        parts = [block] if block else []
        if recent:
            names = {"user": "Human", "assistant": "AI"}
            lines = [f"{names.get(t.role, t.role)}: {t.text}" for t in recent]
            parts.append("Earlier in this session:\n" + "\n".join(lines))
        return {self.memory_key: "\n\n".join(parts)}

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Record the user's message and the answer; send citation feedback if possible."""
        question = self._input(inputs)
        answer = self._output(outputs)
        said = message_time(inputs)
        sid = self._sync_session(said)
        turns = [  # without their own time, the core gives them their conversation's
            {"user_id": self.user_id, "session_id": sid, "role": r, "text": t, "timestamp": ts}
            for r, t, ts in (
                ("user", question, said),
                ("assistant", stored_text(answer, True), message_time(outputs)),
            )
            if t.strip()
        ]
        if turns:
            self.memory.add_turns(turns)
        last, self._last = self._last, None
        if last is not None and last.query == question:
            send_feedback(self.memory, last, answer)  # the answer as written, marks included

    def end_session(self, next_session_id: str | None = None) -> list[Memory]:
        """End the current session now (its turns become memories) and start the next one.

        Args:
            next_session_id: Id of the next session (`None`: a random one).

        Returns:
            The memories built from the ended session.
        """
        built = self._tracker.end(next_session_id)
        self.session_id = self._tracker.session_id
        return built

    def clear(self) -> None:
        """Forget the current session (or, with `clear_scope="user"`, everything of the user)."""
        self._last = None
        if self.clear_scope == "user":
            self.memory.delete_user(self.user_id)
            return
        try:
            self.memory.delete_session(self.user_id, self._tracker.session_id)
        except UnknownSessionError:
            pass
