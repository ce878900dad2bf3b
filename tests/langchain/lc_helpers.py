"""Fixtures data and fakes shared by the LangChain adapter tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import BaseMessage
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)

ANA_SESSIONS = {
    "s1": [
        ("user", "I adopted a grey cat named Miso last week."),
        ("assistant", "Congratulations on adopting Miso!"),
        ("user", "Miso loves sleeping on the radiator."),
        ("assistant", "Cats do love warm spots."),
    ],
    "s2": [
        ("user", "I am training for the Lyon half marathon in April."),
        ("assistant", "Good luck with the half marathon training."),
        ("user", "My long run this Sunday is 18 kilometres."),
    ],
    "s3": [
        ("user", "I switched jobs, I now work as a nurse at the city hospital."),
        ("assistant", "A big change, how do you like nursing?"),
    ],
}
BOB_SESSIONS = {"b1": [("user", "My cat is called Tiger and my bike is red.")]}


def populate(mem: ReflectiveMemory) -> ReflectiveMemory:
    for user, sessions in (("ana", ANA_SESSIONS), ("bob", BOB_SESSIONS)):
        for n, (sid, turns) in enumerate(sessions.items()):
            start = T0 + timedelta(days=n)
            mem.add_turns(
                [
                    {
                        "user_id": user,
                        "session_id": sid,
                        "role": role,
                        "text": text,
                        "timestamp": start + timedelta(minutes=i),
                    }
                    for i, (role, text) in enumerate(turns)
                ]
            )
            mem.end_session(user, sid)
    return mem


def new_memory(**kw: Any) -> ReflectiveMemory:
    return ReflectiveMemory(
        embedder=HashingEmbedder(), config=MemoryConfig(units={"granularities": ("turn",)}), **kw
    )


class FeedbackMemory(ReflectiveMemory):
    """A core with the `feedback` method the RMM work adds; records what it receives."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.feedback_calls: list[tuple[Any, Any]] = []

    def feedback(self, retrieval: Any, answer: str | None = None, *, cited: Any = None) -> dict:
        self.feedback_calls.append((retrieval, answer))
        return {"ok": True}


class RecordingChatModel(GenericFakeChatModel):
    """Fake chat model that keeps the messages it was called with and can bind tools."""

    seen: list[list[BaseMessage]] = []

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def bind_tools(self, tools, **kwargs):  # type: ignore[no-untyped-def]
        return self


def recording_model(*replies: Any) -> RecordingChatModel:
    return RecordingChatModel(messages=iter(list(replies)), seen=[])
