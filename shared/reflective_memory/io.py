"""Conversation files: read them (our JSON schema, LongMemEval, LoCoMo) and ingest them.

What `reflective-memory ingest`, `demo` and `serve --demo` read, and what the benchmarks
(`reflective_bench`, beside the library in a source checkout) load their data with.

Our schema (`"format": "reflective-memory/v1"`)::

    {
      "format": "reflective-memory/v1",
      "sessions": [
        {"user_id": "maya", "session_id": "s1", "date": "2025-01-12T09:30:00",
         "turns": [{"role": "user", "text": "...", "turn_id": "s1-t1",
                    "timestamp": "2025-01-12T09:30:00"}]}
      ],
      "questions": [
        {"user_id": "maya", "question": "...", "answer": "...", "evidence": ["s1-t1"]}
      ]
    }

`user_id` may be left out (the `--user` given to the CLI is used); `date`, `timestamp`, `turn_id`,
`questions`, `answer` and `evidence` are optional.

LongMemEval files (a list of questions, each with its own haystack) become one conversation per
question (user id = question id). LoCoMo files (a list of samples with `conversation.session_<n>`
turn lists of `{speaker, dia_id, text}` and `session_<n>_date_time`) become one conversation per
sample; `dia_id` is kept as the turn id and each speaker's name is the role.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflective_memory.errors import InvalidInputError
from reflective_memory.text import parse_timestamp

if TYPE_CHECKING:
    from reflective_memory.engine import ReflectiveMemory

__all__ = [
    "ingest_conversations",
    "IngestReport",
    "Conversation",
    "SessionData",
    "Question",
    "load_conversations",
    "SCHEMA_ID",
]

SCHEMA_ID = "reflective-memory/v1"


@dataclass
class SessionData:
    """One session of a conversation file."""

    session_id: str
    turns: list[dict[str, Any]]
    date: str | None = None


@dataclass
class Question:
    """A question with its evidence.

    Attributes:
        question: The question text.
        answer: The reference answer, if any.
        evidence: Turn ids that hold the answer.
        evidence_sessions: Session ids that hold the answer.
        qtype: Question category, if known.
        date: When the question is asked, if known.
    """

    question: str
    answer: str = ""
    evidence: list[str] = field(default_factory=list)
    evidence_sessions: list[str] = field(default_factory=list)
    qtype: str = ""
    date: str | None = None


@dataclass
class Conversation:
    """One user's sessions plus questions about them."""

    user_id: str
    sessions: list[SessionData]
    questions: list[Question] = field(default_factory=list)

    @property
    def n_turns(self) -> int:
        """Total number of turns."""
        return sum(len(s.turns) for s in self.sessions)


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise InvalidInputError(f"no such file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise InvalidInputError(f"{path} is not a readable JSON file: {exc}") from exc


def _ours(data: dict[str, Any], default_user: str | None) -> list[Conversation]:
    by_user: dict[str, Conversation] = {}
    sessions = data.get("sessions")
    if not isinstance(sessions, list):
        raise InvalidInputError("a reflective-memory/v1 file needs a 'sessions' list")
    for i, s in enumerate(sessions):
        if not isinstance(s, dict) or not isinstance(s.get("turns"), list):
            raise InvalidInputError(f"sessions[{i}] needs a 'turns' list")
        user = s.get("user_id", default_user)
        if user is None:
            raise InvalidInputError(f"sessions[{i}] has no user_id and no default user was given")
        sid = str(s.get("session_id", f"session-{i}"))
        turns = []
        for j, t in enumerate(s["turns"]):
            if not isinstance(t, dict) or "text" not in t or "role" not in t:
                raise InvalidInputError(f"sessions[{i}].turns[{j}] needs 'role' and 'text'")
            turns.append(
                {
                    "role": t["role"],
                    "text": t["text"],
                    "turn_id": t.get("turn_id"),
                    "timestamp": t.get("timestamp", s.get("date")),
                }
            )
        conv = by_user.setdefault(user, Conversation(user, []))
        conv.sessions.append(SessionData(sid, turns, s.get("date")))
    for q in data.get("questions", []):
        user = q.get("user_id", default_user)
        if user in by_user:
            by_user[user].questions.append(
                Question(q["question"], str(q.get("answer", "")), list(q.get("evidence", [])))
            )
    return list(by_user.values())


def _longmemeval(items: list[dict[str, Any]]) -> list[Conversation]:
    out = []
    for item in items:
        sessions = []
        evidence = []
        seen: dict[str, int] = {}
        dates = item.get("haystack_dates") or [None] * len(item["haystack_sessions"])
        for sid, date, sess in zip(
            item["haystack_session_ids"], dates, item["haystack_sessions"], strict=True
        ):
            seen[sid] = seen.get(sid, 0) + 1
            if seen[sid] > 1:  # a few haystacks repeat a session id
                sid = f"{sid}#{seen[sid]}"
            turns = []
            for j, t in enumerate(sess):
                tid = f"{sid}:{j}"
                if not str(t.get("content") or "").strip():
                    continue  # a few haystack turns are empty; nothing to remember
                if t.get("has_answer"):
                    evidence.append(tid)
                turns.append(
                    {"role": t["role"], "text": t["content"], "turn_id": tid, "timestamp": date}
                )
            sessions.append(SessionData(sid, turns, date))
        q = Question(
            item["question"],
            str(item.get("answer", "")),
            evidence,
            list(item.get("answer_session_ids", [])),
            item.get("question_type", ""),
            item.get("question_date"),
        )
        out.append(Conversation(str(item["question_id"]), sessions, [q]))
    return out


_SESSION_KEY = re.compile(r"^session_(\d+)$")


def _locomo(items: list[dict[str, Any]]) -> list[Conversation]:
    out = []
    for n, sample in enumerate(items):
        conv = sample["conversation"]
        user = str(sample.get("sample_id", f"locomo-{n}"))
        numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
        sessions = []
        dia_to_session: dict[str, str] = {}
        for k in numbers:
            sid = f"session_{k}"
            date = conv.get(f"session_{k}_date_time")
            turns = []
            for t in conv[sid]:
                text = t.get("text", "")
                if t.get("blip_caption"):
                    text = f"{text} [shares a photo: {t['blip_caption']}]".strip()
                if not text.strip():
                    continue
                dia_to_session[t["dia_id"]] = sid
                turns.append(
                    {"role": t["speaker"], "text": text, "turn_id": t["dia_id"], "timestamp": date}
                )
            if turns:
                sessions.append(SessionData(sid, turns, date))
        questions = []
        for qa in sample.get("qa", []):
            ev = [e.strip() for e in qa.get("evidence", []) if isinstance(e, str)]
            ev = [e for e in ev if e in dia_to_session]
            questions.append(
                Question(
                    qa["question"],
                    str(qa.get("answer", qa.get("adversarial_answer", ""))),
                    ev,
                    sorted({dia_to_session[e] for e in ev}),
                    str(qa.get("category", "")),
                )
            )
        out.append(Conversation(user, sessions, questions))
    return out


def load_conversations(path: str | Path, default_user: str | None = None) -> list[Conversation]:
    """Read a conversation file in any supported format (`.json` or `.json.gz`).

    Args:
        path: The file.
        default_user: User id for our own schema's sessions that name none.

    Returns:
        The conversations in file order.

    Raises:
        InvalidInputError: The file is missing, unreadable or in no known format.
    """
    data = _read_json(Path(path))
    if isinstance(data, dict) and data.get("format") == SCHEMA_ID:
        return _ours(data, default_user)
    if isinstance(data, dict) and "haystack_sessions" in data:
        return _longmemeval([data])
    if isinstance(data, list) and data and isinstance(data[0], dict):
        if "haystack_sessions" in data[0]:
            return _longmemeval(data)
        if "conversation" in data[0]:
            return _locomo(data)
    raise InvalidInputError(
        f"{path}: unknown format; expected reflective-memory/v1, LongMemEval or LoCoMo JSON"
    )


@dataclass
class IngestReport:
    """What `ingest_conversations` did, per user id.

    Attributes:
        added: Turns stored.
        skipped: Turns already stored (same user, session, role, text and timestamp, or the
            same turn id), not added again.
    """

    added: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def users(self) -> list[str]:
        """Every user id the conversations named, in order."""
        return list(dict.fromkeys([*self.added, *self.skipped]))


def _same(role: Any, text: Any, timestamp: Any) -> tuple[Any, Any, str | None]:
    """What makes two turns the same turn: role, text and time (compared as ISO text)."""
    when = parse_timestamp(timestamp)
    return role, text, None if when is None else when.isoformat()


def _new_turns(mem: ReflectiveMemory, uid: str, session: SessionData) -> list[dict[str, Any]]:
    """The session's turns not stored yet (one read of the stored session; O(turns))."""
    stored = mem.turns(uid, session.session_id)
    if not stored:
        return list(session.turns)
    ids = {t.turn_id for t in stored}
    seen = Counter(_same(t.role, t.text, t.timestamp) for t in stored)
    new = []
    for t in session.turns:
        key = _same(t.get("role"), t.get("text"), t.get("timestamp"))
        if t.get("turn_id") in ids:
            continue
        if seen[key] > 0:
            seen[key] -= 1
            continue
        new.append(t)
    return new


def ingest_conversations(
    mem: ReflectiveMemory,
    conversations: Sequence[Conversation],
    *,
    user: str | None = None,
    progress: bool = True,
) -> IngestReport:
    """Add every session of `conversations` to `mem` and end each session.

    Turns already stored are skipped, so ingesting a file twice adds nothing: a turn whose id
    the session holds, or (without an id) one with the same role, text and timestamp as a
    stored turn of the session (counted, so a turn said twice is stored twice).

    Args:
        mem: Target memory.
        conversations: Loaded conversations.
        user: Store under this user id; with several conversations each goes to
            `<user>/<conversation user id>`.
        progress: Show a progress bar over sessions.

    Returns:
        Turns added and skipped per user id.
    """
    from tqdm import tqdm

    report = IngestReport()
    todo = []
    for conv in conversations:
        if user is None:
            uid = conv.user_id
        elif len(conversations) == 1:
            uid = user
        else:
            uid = f"{user}/{conv.user_id}"
        todo += [(uid, s) for s in conv.sessions]
    for uid, session in tqdm(todo, desc="ingest sessions", unit="session", disable=not progress):
        if not session.turns:
            continue
        new = _new_turns(mem, uid, session)
        skipped = len(session.turns) - len(new)
        report.added[uid] = report.added.get(uid, 0) + len(new)
        report.skipped[uid] = report.skipped.get(uid, 0) + skipped
        if not new:
            continue
        mem.add_turns([{**t, "user_id": uid, "session_id": session.session_id} for t in new])
        mem.end_session(uid, session.session_id)
    return report
