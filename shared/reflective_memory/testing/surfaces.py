"""The surface contract: one scripted conversation, driven through every way into the memory.

Every surface (the core API, each LangChain and LlamaIndex adapter, the MCP server, the CLI) is a
thin driver over the same session and turn bookkeeping in the core, so the same conversation
must leave the same stored turns, end sessions by the same rules and put the same kind of
evidence in front of the model. This module holds the conversation as plain data
(`CONVERSATION`), the `SurfaceDriver` protocol a surface's test implements, the core API's own
driver (`CoreDriver`, the reference), `run_surface` which drives a conversation through a
driver and records what it left, and the checks as two pytest mixins:

- `SurfaceContract`: stored turns (the same as the core's: count, order, roles, text), a time
  on every turn, a message's own time kept, sessions ended when the session id changes, and
  segment memories for every ended session. Needs a `surface_run` fixture (the surface's
  `SurfaceRun`) and a `core_run` fixture (`run_surface(CoreDriver(...))`, the expected values).
- `SurfaceEvidenceContract`: the evidence put in front of the model for `QUESTIONS` has date
  headers, memories numbered for citation from `[0]`, the newest home first, no small talk as
  the first memory, and fits the budget the surface was given. Needs an `evidence_run` fixture.
  Run it with a real embedder (the hashing embedder ranks by shared words only).
- `SurfaceTimeContract`: `DATED_CONVERSATION` (a replayed log dated with naive times, the
  answers without a time) leaves only timezone-aware times, each answer at its question's time,
  and a question asked at a given `now` ("two weeks ago") shows the turn said then first. Needs
  a `time_run` fixture (`run_surface(driver, DATED_CONVERSATION, asked_at=TIME_QUESTIONS)`).
- `SurfaceFeedbackContract`: a surface that takes feedback (a `FeedbackDriver`) teaches the
  memory's turn ranker: an answer citing a shown passage, sent back the surface's way, is one
  episode of the user's (and only the user's) ranker, whose changed weights rank the next
  question through the surface; an answer citing nothing, every shown passage or only numbers
  that name no passage teaches nothing, and cited numbers that name no passage are refused
  (`InvalidInputError`), as by `ReflectiveMemory.feedback`. Needs a `feedback_driver` fixture:
  a `FeedbackDriver` after `run_surface`, over a memory in which `teach_other_user` ran first
  (learning on, `rerank.scope` "user", the default).

A new surface is added by writing one driver and two small test classes::

    from reflective_memory.testing.surfaces import SurfaceContract, run_surface

    class TestMySurface(SurfaceContract):
        @pytest.fixture(scope="class")
        def surface_run(self):
            with MyDriver() as driver:
                return run_surface(driver)

        @pytest.fixture(scope="class")
        def core_run(self):
            with ReflectiveMemory(embedder=HashingEmbedder()) as memory:
                return run_surface(CoreDriver(memory))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pytest

from reflective_memory.errors import InvalidInputError
from reflective_memory.llm import count_tokens
from reflective_memory.memory_block import CITATION_INSTRUCTION, shown_memories
from reflective_memory.text import as_utc
from reflective_memory.types import Memory, RerankRecord, Retrieval, Turn

if TYPE_CHECKING:
    from reflective_memory.engine import ReflectiveMemory

__all__ = [
    "Message",
    "Exchange",
    "ScriptSession",
    "Conversation",
    "CONVERSATION",
    "USER_ID",
    "LYON_TURN",
    "OSLO_TURN",
    "WHERE_DO_I_LIVE",
    "WHAT_AM_I_ALLERGIC_TO",
    "QUESTIONS",
    "COOKING",
    "DATED_CONVERSATION",
    "TWO_WEEKS_AGO",
    "TIME_QUESTIONS",
    "BUDGET_TOKENS",
    "OTHER_USER",
    "OTHER_CONVERSATION",
    "OTHER_QUESTION",
    "Cites",
    "cite_first",
    "cite_nothing",
    "cite_every",
    "cite_beyond",
    "answer_citing",
    "Evidence",
    "Answered",
    "answered",
    "CoreView",
    "SurfaceDriver",
    "FeedbackDriver",
    "CoreDriver",
    "SurfaceRun",
    "run_surface",
    "teach_other_user",
    "SurfaceContract",
    "SurfaceEvidenceContract",
    "SurfaceTimeContract",
    "SurfaceFeedbackContract",
]

#: The user every surface talks to.
USER_ID = "lena"

#: Budget (`reflective_memory.llm.count_tokens`) given to every surface that takes one.
BUDGET_TOKENS = 300


# -- the conversation, as plain data ----------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One message as the application sees it.

    Attributes:
        role: `user` or `assistant`.
        text: What was said.
        timestamp: The message's own time, when the application knows it (a replayed or
            imported message); `None` for a message without one, stored at its
            conversation's time (`ReflectiveMemory.turn_time`: the previous turn's in a
            replayed session, the wall clock in a live one).
    """

    role: str
    text: str
    timestamp: datetime | None = None


@dataclass(frozen=True)
class Exchange:
    """A user message and the assistant's answer.

    Attributes:
        user: The user's message.
        assistant: The answer.
        small_talk: Both messages are small talk (thanks, greetings): never worth a memory slot.
        filler: Part of the long session only to make it long; evidence runs may leave it out.
    """

    user: Message
    assistant: Message
    small_talk: bool = False
    filler: bool = False


@dataclass(frozen=True)
class ScriptSession:
    """One session of the conversation: its id and its exchanges, in order."""

    session_id: str
    exchanges: tuple[Exchange, ...]


@dataclass(frozen=True)
class Conversation:
    """One user's sessions, in order; the last one is still going on when questions are asked.

    Attributes:
        user_id: The user.
        sessions: The sessions, oldest first.
    """

    user_id: str
    sessions: tuple[ScriptSession, ...]

    def messages(self) -> Iterator[tuple[str, Message]]:
        """Every message with its session id, in the order it is said."""
        for session in self.sessions:
            for ex in session.exchanges:
                yield session.session_id, ex.user
                yield session.session_id, ex.assistant

    def small_talk(self) -> list[str]:
        """Texts of the small-talk messages."""
        return [
            m.text
            for s in self.sessions
            for ex in s.exchanges
            if ex.small_talk
            for m in (ex.user, ex.assistant)
        ]

    def shortened(self, filler: int) -> Conversation:
        """The same conversation with at most `filler` of each session's filler exchanges.

        Args:
            filler: How many filler exchanges each session keeps (its first ones).
        """

        def keep(exchanges: tuple[Exchange, ...]) -> tuple[Exchange, ...]:
            out, seen = [], 0
            for ex in exchanges:
                seen += ex.filler
                if not ex.filler or seen <= filler:
                    out.append(ex)
            return tuple(out)

        return replace(
            self, sessions=tuple(replace(s, exchanges=keep(s.exchanges)) for s in self.sessions)
        )


def _at(start: datetime, minutes: int) -> datetime:
    return start + timedelta(minutes=minutes)


def _timed_session(
    session_id: str, start: datetime, pairs: Sequence[tuple[str, str, bool]]
) -> ScriptSession:
    """A replayed session: every message carries its own time, one minute apart."""
    out = []
    for i, (user, assistant, small_talk) in enumerate(pairs):
        out.append(
            Exchange(
                Message("user", user, _at(start, 2 * i)),
                Message("assistant", assistant, _at(start, 2 * i + 1)),
                small_talk=small_talk,
            )
        )
    return ScriptSession(session_id, tuple(out))


def _live_session(
    session_id: str, pairs: Sequence[tuple[str, str, bool]], filler: int = 0
) -> ScriptSession:
    """A session said without times (the core gives each message its conversation's time)."""
    out = [Exchange(Message("user", u), Message("assistant", a), small_talk=s) for u, a, s in pairs]
    return ScriptSession(session_id, tuple(out[:1] + _bread_lessons(filler) + out[1:]))


#: (what was practised, what the teacher said) for the lessons of the long session.
_LESSONS = (
    ("feeding the starter with rye flour", "a starter fed at the same hour every day is calmer"),
    ("mixing flour and water for the autolyse", "forty minutes of rest makes the gluten relax"),
    ("adding salt after the autolyse", "salt added too early slows the yeast down"),
    ("stretch and fold sets in the bowl", "four sets half an hour apart are enough"),
    ("reading the bulk fermentation", "the dough should grow by about half, not double"),
    ("pre-shaping rounds on the bench", "a short bench rest makes the final shape easier"),
    ("shaping a batard with wet hands", "a tight skin on the dough gives a taller loaf"),
    ("shaping a boule with a bench scraper", "pulling the dough towards you builds tension"),
    ("proofing loaves in floured baskets", "rice flour keeps the dough from sticking"),
    ("cold retarding overnight in the fridge", "a long cold proof deepens the sour flavour"),
    ("the poke test before baking", "dough that springs back slowly is ready to bake"),
    ("scoring with a razor blade", "a shallow angled cut opens a nice ear"),
    ("baking in a preheated cast iron pot", "the lid traps steam for the first twenty minutes"),
    ("judging the crust colour", "a deep brown crust carries most of the flavour"),
    ("cooling loaves on a wire rack", "cutting warm bread makes the crumb gummy"),
    ("reading an open crumb", "big uneven holes mean a well fermented dough"),
    ("whole wheat dough hydration", "whole wheat flour drinks more water than white flour"),
    ("adding seeds and grains", "soaked seeds do not steal water from the dough"),
    ("making a sweet brioche dough", "butter goes in slowly once the gluten is strong"),
    ("braiding challah strands", "six strands look harder than they really are"),
    ("baking focaccia in a tray", "dimpling with oily fingers gives the crisp top"),
    ("rolling baguettes", "long even strokes keep the baguette the same width"),
    ("steaming the home oven", "a tray of boiling water on the bottom rack helps"),
    ("storing bread at home", "a linen bag keeps the crust crisp for a day or two"),
    ("freezing sliced loaves", "slices toast straight from the freezer"),
    ("reviving a sluggish starter", "warmer water and more frequent feeds wake it up"),
    ("planning a baking schedule", "working backwards from the bake time avoids late nights"),
    ("keeping a baking notebook", "writing down temperatures explains good and bad bakes"),
    ("the final exam loaf", "the jury looks at crust, crumb, taste and shape"),
)


def _bread_lessons(n: int) -> list[Exchange]:
    """`n` filler exchanges about a sourdough course (about 20 words a message)."""
    out = []
    for i in range(n):
        what, tip = _LESSONS[i % len(_LESSONS)]
        if i < len(_LESSONS):
            user = (
                f"Lesson {i + 1} of the course: today we practised {what}, "
                f"and the teacher said {tip}."
            )
            answer = f"{what.capitalize()} takes practice; I like the advice that {tip}."
        else:
            user = f"After lesson {i + 1} I practised {what} at home and noticed that {tip}."
            answer = f"Practising {what} at home is the best way to learn it."
        out.append(Exchange(Message("user", user), Message("assistant", answer), filler=True))
    return out


#: The home the user had first, said in the first session.
LYON_TURN = "I live in Lyon, in a small flat near the old town."
#: The move, said sessions later: the answer to "Where do I live now?".
OSLO_TURN = "I moved from Lyon to Oslo last month for a job at the university hospital."

#: A question about a fact that changed: the newer statement must come first.
WHERE_DO_I_LIVE = "Where do I live now?"
#: A content question the small talk must never answer first.
WHAT_AM_I_ALLERGIC_TO = "What am I allergic to?"
#: The questions of the evidence checks, asked in order in the last (current) session.
QUESTIONS = (WHAT_AM_I_ALLERGIC_TO, WHERE_DO_I_LIVE)

#: The scripted conversation: four sessions of one user. The first is replayed with its own
#: times; the second is long (60 exchanges, enough for LlamaIndex `Memory(token_limit=4000)` to
#: flush to its memory blocks); the third tells of a move; the fourth is still going on. Small
#: talk in French, English and Norwegian ends the first three.
CONVERSATION = Conversation(
    USER_ID,
    (
        _timed_session(
            "first-chat",
            datetime(2025, 1, 12, 9, 0, tzinfo=timezone.utc),
            (
                (LYON_TURN, "Hello! Lyon is a lovely city to live in.", False),
                (
                    "I work as a nurse, mostly night shifts on the children's ward.",
                    "Night shifts are demanding; I hope you get enough rest between them.",
                    False,
                ),
                (
                    "I'm allergic to peanuts, so I always read the labels when I buy snacks.",
                    "Good habit. I will keep your peanut allergy in mind when I suggest food.",
                    False,
                ),
                ("Merci beaucoup !", "Avec plaisir !", True),
            ),
        ),
        _live_session(
            "bread-course",
            (
                (
                    "I signed up for a sourdough baking course that meets every evening "
                    "this month.",
                    "How exciting! Tell me how the lessons go.",
                    False,
                ),
                ("Thanks!", "You're welcome!", True),
            ),
            filler=58,
        ),
        _live_session(
            "moving-day",
            (
                (OSLO_TURN, "What a big change! How are you finding Oslo so far?", False),
                (
                    "The winter days are short, but I love walking along the fjord after work.",
                    "The fjord must be beautiful, even in the dark months.",
                    False,
                ),
                ("Tusen takk!", "Bare hyggelig!", True),
            ),
        ),
        _live_session(
            "weekend-plans",
            (
                (
                    "Could you suggest a short hike for Saturday morning?",
                    "A loop through the forest north of the city takes about two hours.",
                    False,
                ),
            ),
        ),
    ),
)


#: What the user cooked, one session a date (naive times, as logs and benchmarks give them):
#: (the user's message time, what the user said, the assistant's answer, said without a time).
COOKING = (
    (datetime(2025, 3, 2, 19, 0), "I cooked a mushroom risotto for my parents.", "Lovely!"),
    (datetime(2025, 4, 6, 19, 0), "I cooked a lentil curry with lots of ginger.", "Yum."),
    (datetime(2025, 4, 20, 19, 0), "I cooked pumpkin soup and baked bread.", "So cosy."),
    (datetime(2025, 5, 4, 19, 0), "I cooked a fish stew for the neighbours.", "How kind."),
)

#: A replayed log dated with naive times: each user message carries its own time (no time
#: zone: UTC), the assistant's answers none (as an agent stores a model's replies).
DATED_CONVERSATION = Conversation(
    USER_ID,
    tuple(
        ScriptSession(
            f"cooking-{when:%Y-%m-%d}",
            (Exchange(Message("user", said, when), Message("assistant", answer)),),
        )
        for when, said, answer in COOKING
    ),
)

#: A question about a time relative to when it is asked.
TWO_WEEKS_AGO = "What did I cook two weeks ago?"
#: (question, when it is asked, what it must show first): asked on 20 April 2025 (naive: UTC),
#: "two weeks ago" is the lentil curry of 6 April; asked at the user's newest turn (4 May) it
#: would be the pumpkin soup, so only a surface that passes `now` shows the curry first.
TIME_QUESTIONS = ((TWO_WEEKS_AGO, datetime(2025, 4, 20, 12, 0), COOKING[1][1]),)

# -- feedback ---------------------------------------------------------------------------------
#: A second user of the memory: feedback on `USER_ID`'s questions must leave theirs alone.
OTHER_USER = "mika"
#: What the other user said: three sessions, so that a question shows several passages.
OTHER_CONVERSATION = Conversation(
    OTHER_USER,
    (
        _live_session("balcony", (("I grow tomatoes and basil on my balcony.", "Lovely!", False),)),
        _live_session("commute", (("I cycle to work along the river.", "Healthy!", False),)),
        _live_session("family", (("My sister lives in Bergen near the harbour.", "Nice.", False),)),
    ),
)
#: The question the other user's answer cites the first passage of (`teach_other_user`).
OTHER_QUESTION = "Where does my sister live?"

#: Which shown passages an answer cites, given how many the surface showed: positions from 0
#: (none: the answer says `[NO_CITE]`). A driver writes the answer its surface's way.
Cites = Callable[[int], Sequence[int]]


def cite_first(shown: int) -> tuple[int, ...]:
    """The first passage shown."""
    return (0,)


def cite_nothing(shown: int) -> tuple[int, ...]:
    """No passage: the answer says `[NO_CITE]`."""
    return ()


def cite_every(shown: int) -> tuple[int, ...]:
    """Every passage shown."""
    return tuple(range(shown))


def cite_beyond(shown: int) -> tuple[int, ...]:
    """A number that names no passage shown."""
    return (shown + 2,)


def answer_citing(positions: Sequence[int], base: int = 0) -> str:
    """An answer citing `positions` as `[i, j]` (numbered from `base`), or `[NO_CITE]`.

    Example:
        >>> answer_citing([0, 2]), answer_citing([0], base=1), answer_citing([])
        ('You live in Oslo now [0, 2].', 'You live in Oslo now [1].', '[NO_CITE]')
    """
    if not positions:
        return "[NO_CITE]"
    return f"You live in Oslo now [{', '.join(str(p + base) for p in positions)}]."


# -- drivers -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """What a surface puts in front of the model for one question.

    Attributes:
        text: The memory block the surface injects (instruction, numbering, dates and the
            memories), as the model reads it.
        budget: The token budget the surface was given for it (`None`: the surface takes none).
    """

    text: str
    budget: int | None


@dataclass(frozen=True)
class Answered:
    """A question asked through a surface, and the answer sent back for it.

    Attributes:
        shown: How many passages (or texts) the surface showed for the question.
        scores: What the surface ordered them by, as it reports them, best first.
        record: The ranking's record feedback learns from, where the driver can read it (an
            in-process surface); None for a surface that shows only `scores` (a server). A
            driver gives None only if asking adds nothing to the memory, so that two answers
            to one question differ in nothing but the weights that ranked them.
    """

    shown: int
    scores: tuple[float, ...]
    record: RerankRecord | None


def answered(retrieval: Retrieval | None) -> Answered:
    """What a surface that showed `retrieval`'s hits showed (none for None)."""
    if retrieval is None:
        return Answered(0, (), None)
    return Answered(len(retrieval.hits), tuple(h.score for h in retrieval.hits), retrieval.rerank)


@runtime_checkable
class CoreView(Protocol):
    """Read access to the core's records (a `ReflectiveMemory` is one)."""

    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns of a user, in order."""
        ...

    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the user's sessions not yet turned into memories."""
        ...

    def memories(self, user_id: str) -> list[Memory]:
        """The user's memories."""
        ...


@runtime_checkable
class SurfaceDriver(Protocol):
    """Drives one surface the way its users do; `run_surface` calls it.

    Attributes:
        name: The surface, for messages.
        carries_message_time: The surface has a place for a message's own time (LangChain
            message metadata, LlamaIndex `additional_kwargs`, an MCP argument, a file field);
            a surface without one stamps every message with the time it received it.
    """

    name: str
    carries_message_time: bool

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """Say one exchange of a session through the surface (its own time where it can)."""
        ...

    def switch_session(self, previous: str, new: str) -> None:
        """Move on from `previous` to `new` the way the surface's users do.

        Where the surface's documented use ends a conversation (an `end_session` call, the MCP
        tool), do that; where it only starts a new one (a new LlamaIndex `Memory`, a new
        history for a new id), do only that.
        """
        ...

    def finish(self) -> None:
        """The conversation is over for now (e.g. the CLI ingests its file here)."""
        ...

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """Ask `question` in the current session and return what the model is shown.

        Args:
            question: The question.
            now: When it is asked, given the way the surface takes a per-call time (a
                message's own time, a `now` argument); None: the surface's default.
        """
        ...

    def core(self) -> CoreView:
        """The core records the surface wrote (valid until `close`)."""
        ...

    def close(self) -> None:
        """Release everything the driver opened."""
        ...


@runtime_checkable
class FeedbackDriver(SurfaceDriver, Protocol):
    """A surface that takes feedback; `SurfaceFeedbackContract` drives it.

    Attributes:
        takes_numbers: Besides an answer's text the surface takes the cited numbers (the
            core's `feedback(cited=...)`, MCP's `cited`, the LlamaIndex postprocessor's).
    """

    takes_numbers: bool

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """Ask `question`, then send back an answer citing `cites(shown)` the surface's way.

        Args:
            question: The question, asked in the current session.
            cites: Which shown passages the answer cites.
            numbers: Send the cited numbers instead of an answer's text (`takes_numbers`).

        Raises:
            InvalidInputError: The surface refused the feedback (with the library's message).
        """
        ...

    def ranker(self, user_id: str) -> Mapping[str, Any]:
        """A user's turn ranker as the surface's memory holds it (`ranker_weights`)."""
        ...


def _block(
    memory: ReflectiveMemory,
    user_id: str,
    question: str,
    budget_tokens: int,
    now: datetime | None = None,
) -> tuple[Retrieval, str]:
    """The retrieval and the numbered block every surface shows its model for a question."""
    return shown_memories(
        memory,
        user_id,
        question,
        k=None,
        budget_tokens=budget_tokens,
        instruction=CITATION_INSTRUCTION,
        exclude_turns=(),
        now=now,
    )


class CoreDriver:
    """The core API as an application uses it: `add_turn`, `end_session`, `retrieve`.

    The reference of the contract: every other surface is compared with what this one stores.
    A message's own time is passed; one without is stamped by the core when it is stored. A
    new session begins without an explicit end: the core ends the previous one
    (`sessions.end_on_new_session`). The evidence is the block every surface shows its model
    (`reflective_memory.memory_block.shown_memories`).

    Args:
        memory: The core memory to write to (closed by `close`).
        user_id: The user.
        budget_tokens: The budget of each retrieval.
    """

    name = "core API"
    carries_message_time = True
    takes_numbers = True

    def __init__(
        self, memory: ReflectiveMemory, user_id: str = USER_ID, budget_tokens: int = BUDGET_TOKENS
    ) -> None:
        self.memory = memory
        self.user_id = user_id
        self.budget_tokens = budget_tokens

    def exchange(self, session_id: str, user: Message, assistant: Message) -> None:
        """Add both messages as turns, at their own times (else the core stamps them)."""
        for m in (user, assistant):
            self.memory.add_turn(self.user_id, session_id, m.role, m.text, timestamp=m.timestamp)

    def switch_session(self, previous: str, new: str) -> None:
        """Nothing: the next session's first turn ends the previous one."""

    def finish(self) -> None:
        """Nothing to do: every turn is stored as it is said."""

    def evidence(self, question: str, now: datetime | None = None) -> Evidence:
        """The block every surface shows its model (`memory_block.shown_memories`)."""
        _, text = _block(self.memory, self.user_id, question, self.budget_tokens, now)
        return Evidence(text, self.budget_tokens)

    def answer(self, question: str, cites: Cites, *, numbers: bool = False) -> Answered:
        """`feedback` on the block's retrieval: an answer citing `[i]`, or `cited=`."""
        shown, _ = _block(self.memory, self.user_id, question, self.budget_tokens)
        positions = list(cites(len(shown.hits)))
        if numbers:
            self.memory.feedback(shown, cited=positions)
        else:
            self.memory.feedback(shown, answer_citing(positions))
        return answered(shown)

    def ranker(self, user_id: str) -> Mapping[str, Any]:
        """`ranker_weights(user_id)` of the memory."""
        return self.memory.ranker_weights(user_id)

    def core(self) -> CoreView:
        """The memory itself."""
        return self.memory

    def close(self) -> None:
        """Close the memory."""
        self.memory.close()

    def __enter__(self) -> CoreDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- running a conversation through a surface --------------------------------------------------
@dataclass
class SurfaceRun:
    """What a conversation driven through a surface left in the core, and what the model saw.

    Attributes:
        name: The surface.
        conversation: The conversation driven.
        carries_message_time: The surface has a place for a message's own time.
        turns: The user's stored turns after the conversation, in order.
        open_sessions: The user's sessions still open after the conversation.
        segments: Number of segment memories per session id.
        evidence: What the model was shown, per question.
        evidence_at: What the model was shown, per (question, when it was asked).
    """

    name: str
    conversation: Conversation
    carries_message_time: bool
    turns: list[Turn]
    open_sessions: list[str]
    segments: dict[str, int]
    evidence: dict[str, Evidence] = field(default_factory=dict)
    evidence_at: dict[tuple[str, datetime], Evidence] = field(default_factory=dict)

    @property
    def current_session(self) -> str:
        """The session still going on when the conversation stops."""
        return self.conversation.sessions[-1].session_id

    @property
    def ended_sessions(self) -> list[str]:
        """The sessions the conversation moved on from."""
        return [s.session_id for s in self.conversation.sessions[:-1]]


def run_surface(
    driver: SurfaceDriver,
    conversation: Conversation = CONVERSATION,
    questions: Sequence[str] = (),
    asked_at: Sequence[tuple[str, datetime, str]] = (),
) -> SurfaceRun:
    """Drive `conversation` through `driver`, record what it stored, then ask `questions`.

    The records are read right after the conversation, before any question (a surface may
    record a question as a turn of the current session).

    Args:
        driver: The surface's driver (not closed here).
        conversation: The conversation.
        questions: Questions asked in the last session after the conversation.
        asked_at: (question, when it is asked, the expected first text) asked after
            `questions` (see `TIME_QUESTIONS`).

    Returns:
        The `SurfaceRun`.
    """
    previous: str | None = None
    for session in conversation.sessions:
        if previous is not None:
            driver.switch_session(previous, session.session_id)
        for ex in session.exchanges:
            driver.exchange(session.session_id, ex.user, ex.assistant)
        previous = session.session_id
    driver.finish()
    core = driver.core()
    user = conversation.user_id
    segments: dict[str, int] = {}
    for m in core.memories(user):
        if m.granularity == "segment":
            segments[m.session_id] = segments.get(m.session_id, 0) + 1
    run = SurfaceRun(
        name=driver.name,
        conversation=conversation,
        carries_message_time=driver.carries_message_time,
        turns=list(core.turns(user)),
        open_sessions=sorted(core.open_sessions(user)),
        segments=segments,
    )
    for q in questions:
        run.evidence[q] = driver.evidence(q)
    for q, now, _ in asked_at:
        run.evidence_at[(q, now)] = driver.evidence(q, now)
    return run


def teach_other_user(memory: ReflectiveMemory) -> None:
    """Store `OTHER_CONVERSATION` and give it one feedback episode (its own offsets move).

    Raises:
        AssertionError: The episode taught nothing (fewer than two passages shown).
    """
    for session_id, m in OTHER_CONVERSATION.messages():
        memory.add_turn(OTHER_USER, session_id, m.role, m.text)
    shown, _ = _block(memory, OTHER_USER, OTHER_QUESTION, BUDGET_TOKENS)
    taught = memory.feedback(shown, answer_citing([0]))
    assert taught.learned, f"the other user learned nothing: {taught.reason}"


# -- checks -------------------------------------------------------------------------------------
def _said(turns: Sequence[Turn]) -> list[tuple[str, str, str]]:
    return [(t.session_id, t.role, t.text) for t in turns]


def _first_difference(got: Sequence[object], want: Sequence[object]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"first difference at turn {i}: stored {a!r}, the core stored {b!r}"
    return "one is a prefix of the other"


class SurfaceContract:
    """What a surface stores; subclasses provide `surface_run` and `core_run` fixtures."""

    def test_stores_the_same_turns_as_the_core(
        self, surface_run: SurfaceRun, core_run: SurfaceRun
    ) -> None:
        """The same conversation leaves the same turns: count, order, sessions, roles, text."""
        got, want = _said(surface_run.turns), _said(core_run.turns)
        assert len(got) == len(want), (
            f"{surface_run.name} stored {len(got)} turns, the core {len(want)}; "
            + _first_difference(got, want)
        )
        assert got == want, f"{surface_run.name}: {_first_difference(got, want)}"

    def test_every_turn_has_a_timestamp(self, surface_run: SurfaceRun) -> None:
        """Every stored turn carries a time: its own, else its conversation's."""
        assert surface_run.turns, f"{surface_run.name} stored no turns"
        untimed = [t for t in surface_run.turns if t.timestamp is None]
        assert not untimed, (
            f"{surface_run.name}: {len(untimed)} of {len(surface_run.turns)} turns have no "
            f"timestamp, e.g. {untimed[0].turn_id} {untimed[0].text[:40]!r}"
        )

    def test_a_message_keeps_its_own_time(self, surface_run: SurfaceRun) -> None:
        """A message that carries its own time is stored with that time (every copy of it)."""
        if not surface_run.carries_message_time:
            pytest.skip(f"{surface_run.name} has no place for a message's own time")
        timed = [(sid, m) for sid, m in surface_run.conversation.messages() if m.timestamp]
        assert timed, "the conversation has no message with its own time"
        for sid, m in timed:
            assert m.timestamp is not None
            stored = [t for t in surface_run.turns if t.text == m.text and t.role == m.role]
            assert stored, f"{surface_run.name} stored no turn for {m.text!r}"
            for t in stored:
                got = None if t.timestamp is None else as_utc(t.timestamp)
                assert got == as_utc(m.timestamp), (
                    f"{surface_run.name}: {m.text[:40]!r} of {sid} said at "
                    f"{m.timestamp.isoformat()} is stored at {got and got.isoformat()}"
                )

    def test_sessions_end_when_the_session_changes(self, surface_run: SurfaceRun) -> None:
        """No session is left open but the current one once the surface moved on."""
        left = [s for s in surface_run.open_sessions if s != surface_run.current_session]
        assert not left, (
            f"{surface_run.name} left {left} open after moving on to "
            f"{surface_run.current_session!r}"
        )

    def test_ended_sessions_have_segments(self, surface_run: SurfaceRun) -> None:
        """Every session the surface moved on from became segment memories."""
        missing = [s for s in surface_run.ended_sessions if not surface_run.segments.get(s)]
        assert not missing, f"{surface_run.name}: no segment memories for sessions {missing}"


#: The date header a passage starts with (`reflective_memory.text.format_date`).
_DATE_HEADER = re.compile(r"\d{4}-\d{2}-\d{2} \([A-Z][a-z]{2}\) \d{2}:\d{2}")
#: A numbered memory: `[i]` opening a line, after marks or the word "memory" (`=== Memory [0]`),
#: never an instruction's example (`cite it like [0]`) or a memory's closing line.
_ENTRY = re.compile(r"^\W*(?:memory\s*)?\[(\d+)\]", re.M | re.I)


def _numbers(text: str) -> list[int]:
    """The numbers of the memories in a block, in the order they are shown."""
    return [int(m.group(1)) for m in _ENTRY.finditer(text)]


def _entries(text: str) -> list[str]:
    """The numbered memories of a block (the whole block when nothing is numbered)."""
    starts = [m.start() for m in _ENTRY.finditer(text)]
    if not starts:
        return [text] if text.strip() else []
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def _shown(text: str, conversation: Conversation) -> list[tuple[int, str]]:
    """(position, text) of every message of the conversation found in `text`, in order."""
    found = {}
    for _, m in conversation.messages():
        at = text.find(m.text)
        if at >= 0:
            found[m.text] = at
    return sorted((at, t) for t, at in found.items())


class SurfaceEvidenceContract:
    """What a surface shows the model; subclasses provide an `evidence_run` fixture."""

    @staticmethod
    def _each(run: SurfaceRun) -> list[tuple[str, Evidence]]:
        assert run.evidence, f"{run.name}: no question was asked"
        return list(run.evidence.items())

    def test_evidence_has_date_headers(self, evidence_run: SurfaceRun) -> None:
        """Every memory shown carries its session's date."""
        for q, ev in self._each(evidence_run):
            entries = _entries(ev.text)
            assert entries, f"{evidence_run.name} showed nothing for {q!r}"
            undated = [e for e in entries if not _DATE_HEADER.search(e)]
            assert not undated, (
                f"{evidence_run.name}, {q!r}: {len(undated)} of {len(entries)} memories have no "
                f"date header, e.g. {undated[0][:120]!r}"
            )

    def test_memories_are_numbered_from_zero(self, evidence_run: SurfaceRun) -> None:
        """Memories are numbered for citation `[0]`, `[1]`, ... in the order shown."""
        for q, ev in self._each(evidence_run):
            numbers = _numbers(ev.text)
            assert numbers, f"{evidence_run.name}, {q!r}: no [i] citation numbers shown"
            assert numbers == list(range(len(numbers))), (
                f"{evidence_run.name}, {q!r}: memories numbered {numbers[:6]}, not from [0] up"
            )

    def test_the_newest_home_comes_first(self, evidence_run: SurfaceRun) -> None:
        """For "Where do I live now?" the move to Oslo is shown before the Lyon turn."""
        ev = evidence_run.evidence.get(WHERE_DO_I_LIVE)
        assert ev is not None, f"{evidence_run.name}: {WHERE_DO_I_LIVE!r} was not asked"
        oslo, lyon = ev.text.find(OSLO_TURN), ev.text.find(LYON_TURN)
        assert oslo >= 0, f"{evidence_run.name} did not show the move to Oslo: {ev.text[:300]!r}"
        assert lyon < 0 or oslo < lyon, (
            f"{evidence_run.name} shows the Lyon turn before the move to Oslo"
        )

    def test_small_talk_is_never_the_first_memory(self, evidence_run: SurfaceRun) -> None:
        """The first message shown for a content question is not small talk."""
        small_talk = set(evidence_run.conversation.small_talk())
        for q, ev in self._each(evidence_run):
            shown = _shown(ev.text, evidence_run.conversation)
            assert shown, f"{evidence_run.name} showed no message for {q!r}"
            first = shown[0][1]
            assert first not in small_talk, (
                f"{evidence_run.name}, {q!r}: the first memory shown is small talk {first!r}"
            )

    def test_the_memory_block_fits_its_budget(self, evidence_run: SurfaceRun) -> None:
        """The injected block, counted by `count_tokens`, is within the surface's budget."""
        for q, ev in self._each(evidence_run):
            if ev.budget is None:
                pytest.skip(f"{evidence_run.name} takes no budget")
            used = count_tokens(ev.text)
            assert used <= ev.budget, (
                f"{evidence_run.name}, {q!r}: the memory block is {used} tokens, "
                f"the budget {ev.budget}"
            )


class SurfaceTimeContract:
    """One time model on every surface; subclasses provide a `time_run` fixture.

    `time_run` is `run_surface(driver, DATED_CONVERSATION, asked_at=TIME_QUESTIONS)` (with
    `asked_at=()` for a surface that takes no question).
    """

    def test_every_stored_time_is_aware(self, time_run: SurfaceRun) -> None:
        """Naive message times are stored as UTC, so the stored times sort together."""
        assert time_run.turns, f"{time_run.name} stored no turns"
        naive = [t for t in time_run.turns if t.timestamp is None or t.timestamp.tzinfo is None]
        assert not naive, (
            f"{time_run.name}: {len(naive)} of {len(time_run.turns)} turns have no aware time, "
            f"e.g. {naive[0].text[:40]!r} at {naive[0].timestamp!r}"
        )
        sorted(t.timestamp for t in time_run.turns)  # type: ignore[type-var]

    def test_an_answer_without_a_time_takes_its_questions(self, time_run: SurfaceRun) -> None:
        """A replayed conversation stays in its time: an undated answer is not stored today."""
        if not time_run.carries_message_time:
            pytest.skip(f"{time_run.name} has no place for a message's own time")
        stored = {(t.role, t.text): t.timestamp for t in time_run.turns}
        for sid, session in [(s.session_id, s) for s in time_run.conversation.sessions]:
            for ex in session.exchanges:
                asked = ex.user.timestamp
                assert asked is not None
                got = stored.get((ex.assistant.role, ex.assistant.text))
                assert got == as_utc(asked), (
                    f"{time_run.name}: the answer {ex.assistant.text!r} of {sid} (asked "
                    f"{asked.isoformat()}) is stored at {got and got.isoformat()}"
                )

    def test_a_question_asked_at_now_reads_time_from_it(self, time_run: SurfaceRun) -> None:
        """A relative time ("two weeks ago") resolves against the `now` it is asked at."""
        if not time_run.evidence_at:
            pytest.skip(f"{time_run.name} was asked nothing")
        said = [m.text for _, m in time_run.conversation.messages() if m.role == "user"]
        for q, now, first in TIME_QUESTIONS:
            ev = time_run.evidence_at.get((q, now))
            assert ev is not None, f"{time_run.name}: {q!r} was not asked at {now}"
            shown = [t for _, t in _shown(ev.text, time_run.conversation) if t in said]
            assert shown and shown[0] == first, (
                f"{time_run.name}, {q!r} asked {now:%Y-%m-%d}: the user's turns shown are "
                f"{shown}, not {first!r} first"
            )


def _weights(ranker: Mapping[str, Any], part: str = "weights") -> np.ndarray:
    """A part of the ranker (`weights`: those that rank) in the ranker's feature order."""
    return np.array([ranker[part][name] for name in ranker["features"]], dtype=np.float64)


def _taught(ranker: Mapping[str, Any]) -> np.ndarray:
    """What citations taught the user's ranker, served or not: prior + shared + own offsets."""
    return _weights(ranker, "prior") + _weights(ranker, "shared") + _weights(ranker, "user")


def _served(ranker: Mapping[str, Any]) -> np.ndarray:
    """The weights that must rank the user's turns, by what the ranker says its gates allow."""
    w = _weights(ranker, "prior")
    if ranker["shared_gate"]["serves"]:
        w = w + _weights(ranker, "shared")
    if ranker["user_gate"]["serves"]:
        w = w + _weights(ranker, "user")
    return w


def _episodes(driver: FeedbackDriver, user_id: str = USER_ID) -> tuple[int, np.ndarray]:
    """A user's own episode count and what citations taught the user's ranker."""
    got = driver.ranker(user_id)
    return int(got["user_episodes"]), _taught(got)


#: How close a record's scores are to its rows times the weights that made them (the rows are
#: rounded to 5 decimals).
_SCORE_TOLERANCE = 1e-3


class SurfaceFeedbackContract:
    """What a surface's feedback teaches; subclasses provide a `feedback_driver` fixture.

    The fixture is a `FeedbackDriver` after `run_surface`, over a memory in which
    `teach_other_user` ran first. Every test measures what it changes, so the tests may share
    one driver.
    """

    def _teaches_nothing(self, driver: FeedbackDriver, cites: Cites, what: str) -> Answered:
        episodes, weights = _episodes(driver)
        got = driver.answer(WHERE_DO_I_LIVE, cites)
        after, now = _episodes(driver)
        assert after == episodes, f"{driver.name}: an answer citing {what} taught an episode"
        assert np.array_equal(now, weights), f"{driver.name}: citing {what} moved the weights"
        return got

    def test_an_answer_citing_a_passage_is_one_episode_of_its_user(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """The user's turn ranker learns exactly one episode, and its weights move."""
        episodes, weights = _episodes(feedback_driver)
        got = feedback_driver.answer(WHERE_DO_I_LIVE, cite_first)
        assert got.shown >= 2, f"{feedback_driver.name} showed {got.shown} passages"
        after, now = _episodes(feedback_driver)
        assert after == episodes + 1, (
            f"{feedback_driver.name}: {after - episodes} episodes learned from one answer"
        )
        assert not np.allclose(now, weights), f"{feedback_driver.name}: the weights did not move"

    def test_the_next_question_is_ranked_with_what_the_gate_serves(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """The next ranking through the surface is scored with the weights the memory serves.

        What citations teach ranks once it has ranked later citations better than what it
        replaces (the gate of `reflective_memory.rmm.turn_learning`; the core's tests show it
        opening); until then the prior (and the shared offsets, if they serve) rank.
        """
        feedback_driver.answer(WHERE_DO_I_LIVE, cite_first)
        ranker = feedback_driver.ranker(USER_ID)
        served, taught = _served(ranker), _taught(ranker)
        assert np.allclose(_weights(ranker), served), (
            f"{feedback_driver.name}: the weights shown are not the ones the gates serve"
        )
        again = feedback_driver.answer(WHERE_DO_I_LIVE, cite_nothing)  # teaches nothing
        if again.record is None:
            return
        rows = np.asarray(again.record.features, dtype=np.float64)
        scores = np.asarray(again.record.prior, dtype=np.float64)
        name = feedback_driver.name
        assert np.allclose(rows @ served, scores, atol=_SCORE_TOLERANCE), (
            f"{name}: the next ranking was not scored with the weights the memory serves"
        )
        if not np.allclose(served, taught):  # taught, not yet proven: it must not rank
            assert not np.allclose(rows @ taught, scores, atol=_SCORE_TOLERANCE), (
                f"{name}: weights the gate holds back ranked the next question"
            )

    def test_another_users_ranker_does_not_move(self, feedback_driver: FeedbackDriver) -> None:
        """Only the user's own offsets learn: the other user's stay as they were."""
        before = feedback_driver.ranker(OTHER_USER)
        assert before["user_episodes"] >= 1, "the other user was not taught (teach_other_user)"
        feedback_driver.answer(WHERE_DO_I_LIVE, cite_first)
        after = feedback_driver.ranker(OTHER_USER)
        assert after["user_episodes"] == before["user_episodes"], (
            f"{feedback_driver.name}: the other user learned an episode"
        )
        assert after["user"] == before["user"], (
            f"{feedback_driver.name}: the other user's own offsets moved"
        )

    def test_an_answer_citing_nothing_teaches_nothing(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """`[NO_CITE]`: every passage was shown for nothing, but nothing tells them apart."""
        self._teaches_nothing(feedback_driver, cite_nothing, "nothing")

    def test_an_answer_citing_every_passage_teaches_nothing(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """Every shown passage cited: nothing to tell apart."""
        got = self._teaches_nothing(feedback_driver, cite_every, "every passage")
        assert got.shown >= 2, f"{feedback_driver.name} showed {got.shown} passages"

    def test_an_answer_citing_only_numbers_beyond_the_passages_teaches_nothing(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """Citations in an answer that name no passage are ignored, as by the core."""
        self._teaches_nothing(feedback_driver, cite_beyond, "no shown passage")

    def test_cited_numbers_teach_as_an_answer_does(self, feedback_driver: FeedbackDriver) -> None:
        """A surface that takes the cited numbers learns one episode from them."""
        if not feedback_driver.takes_numbers:
            pytest.skip(f"{feedback_driver.name} takes an answer's text only")
        episodes, _ = _episodes(feedback_driver)
        feedback_driver.answer(WHERE_DO_I_LIVE, cite_first, numbers=True)
        assert _episodes(feedback_driver)[0] == episodes + 1

    def test_cited_numbers_beyond_the_passages_are_refused(
        self, feedback_driver: FeedbackDriver
    ) -> None:
        """A cited number that names no passage is a typed error, and nothing is learned."""
        if not feedback_driver.takes_numbers:
            pytest.skip(f"{feedback_driver.name} takes an answer's text only")
        episodes, weights = _episodes(feedback_driver)
        with pytest.raises(InvalidInputError, match="is not a hit"):
            feedback_driver.answer(WHERE_DO_I_LIVE, cite_beyond, numbers=True)
        after, now = _episodes(feedback_driver)
        assert after == episodes and np.array_equal(now, weights)
