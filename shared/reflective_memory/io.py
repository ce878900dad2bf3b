"""Conversation files: read them (our JSON schema, LongMemEval, LoCoMo, chat logs) and ingest them.

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
`questions`, `answer` and `evidence` are optional, and a top-level `"description"` string may
say what the file holds. Other keys are refused.

Every reader checks the whole file before returning (`load_conversations`): its size, its
nesting, and the type of every value it uses; a problem raises `InvalidFileError` naming the
file, the path inside it (`sessions[0].turns[3].text`) and what is wrong.

LongMemEval files (a list of questions, each with its own haystack) become one conversation per
question (user id = question id). LoCoMo files (a list of samples with `conversation.session_<n>`
turn lists of `{speaker, dia_id, text}` and `session_<n>_date_time`) become one conversation per
sample; `dia_id` is kept as the turn id and each speaker's name is the role.

Chat logs (`reflective_memory.chatlog`): JSON Lines of messages, OpenAI-style
`{"messages": [...]}` or bare message lists, LangChain `messages_to_dict` output and LlamaIndex
`ChatMessage` dumps, told apart by shape; messages name their session and user (on the message
or in its `additional_kwargs`, `response_metadata` or `metadata`) or get them from the file name,
cut into sessions at silences longer than `session_gap`, and `default_user`.

Every format stores `user`, `assistant` and their aliases (`human`, `ai`, `bot`, `model`, any
case: `validation.ROLE_ALIASES`) as `user` / `assistant`; other roles and speaker names as given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflective_memory.chatlog import ChatLog, is_chat_log, looks_like_jsonl
from reflective_memory.chatlog import read_chat_json as _read_chat_json
from reflective_memory.chatlog import read_chat_jsonl as _read_chat_jsonl
from reflective_memory.errors import InvalidFileError, InvalidInputError
from reflective_memory.jsonfile import MAX_FILE_BYTES, FileShape, read_json
from reflective_memory.sessions.config import SessionConfig
from reflective_memory.text import parse_timestamp
from reflective_memory.validation import canonical_role, check_id, check_role, check_storable

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
    "MAX_FILE_BYTES",
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


_TURN_KEYS = {"role", "text", "turn_id", "timestamp"}
_SESSION_KEYS = {"user_id", "session_id", "date", "turns"}
_QUESTION_KEYS = {"user_id", "question", "answer", "evidence"}
_ANSWER_TYPES = (str, int, float)


@dataclass(frozen=True)
class _Reader:
    """Checks of one file's values, shared by the three formats."""

    shape: FileShape
    max_text_chars: int

    def ident(self, value: Any, where: str) -> str:
        """An id (user, session, turn): a non-blank string of at most `MAX_ID_CHARS`."""
        try:
            return check_id(where, self.shape.expect(value, where, str))
        except InvalidFileError:
            raise
        except InvalidInputError as exc:
            raise self.shape.fail(where, str(exc).removeprefix(where + " ")) from None

    def role(self, value: Any, where: str) -> str:
        """A speaker label, as stored (`check_role`: `user` / `assistant` for their aliases)."""
        try:
            return check_role(self.shape.expect(value, where, str))
        except InvalidFileError:
            raise
        except InvalidInputError as exc:
            raise self.shape.fail(where, str(exc)) from None

    def text(self, value: Any, where: str, *, blank_ok: bool = False) -> str:
        """Turn or question text: at most `max_text_chars`, storable (valid Unicode, no NUL).

        The checks `add_turn` makes, here, so a file it would refuse half-way is refused
        whole before anything is stored.
        """
        self.shape.expect(value, where, str)
        if len(value) > self.max_text_chars:
            raise self.shape.fail(
                where, f"has {len(value):,} characters, more than {self.max_text_chars:,}"
            )
        if not blank_ok and not value.strip():
            raise self.shape.fail(where, "must not be empty")
        try:
            return check_storable(where, value)
        except InvalidInputError as exc:
            raise self.shape.fail(where, str(exc).removeprefix(where + " ")) from None

    def when(self, value: Any, where: str) -> Any:
        """A timestamp or date (None, a number or a string `parse_timestamp` reads)."""
        if value is None:
            return None
        self.shape.expect(value, where, str, int, float)
        try:
            parse_timestamp(value)
        except InvalidInputError as exc:
            raise self.shape.fail(where, str(exc)) from None
        return value

    def user(self, obj: dict[str, Any], where: str, default: str | None) -> str | None:
        """`obj`'s optional `user_id` (an id), else `default`."""
        user = self.shape.field(obj, "user_id", where, str, required=False)
        return default if user is None else self.ident(user, f"{where}.user_id")

    def strings(self, value: Any, where: str) -> list[str]:
        """A list of strings (or None: empty)."""
        if value is None:
            return []
        self.shape.expect(value, where, list)
        return [self.shape.expect(x, f"{where}[{i}]", str) for i, x in enumerate(value)]

    def answer(self, value: Any, where: str) -> str:
        """A reference answer (text or a number; None: empty)."""
        if value is None:
            return ""
        return str(self.shape.expect(value, where, *_ANSWER_TYPES))


def _ours(r: _Reader, data: dict[str, Any], default_user: str | None) -> list[Conversation]:
    shape = r.shape
    shape.only(data, "", {"format", "description", "sessions", "questions"})
    shape.field(data, "description", "", str, required=False)
    by_user: dict[str, Conversation] = {}
    sessions = shape.field(data, "sessions", "", list)
    for i, s in enumerate(sessions):
        at = f"sessions[{i}]"
        shape.expect(s, at, dict)
        shape.only(s, at, _SESSION_KEYS)
        user = r.user(s, at, default_user)
        if user is None:
            raise shape.fail(at, "has no user_id and no default user was given")
        sid = shape.field(s, "session_id", at, str, required=False)
        sid = f"session-{i}" if sid is None else r.ident(sid, f"{at}.session_id")
        date = r.when(s.get("date"), f"{at}.date")
        turns = []
        ids: set[str | None] = set()
        for j, t in enumerate(shape.field(s, "turns", at, list)):
            tat = f"{at}.turns[{j}]"
            shape.expect(t, tat, dict)
            shape.only(t, tat, _TURN_KEYS)
            turn_id = shape.field(t, "turn_id", tat, str, required=False)
            if turn_id is not None and turn_id in ids:
                raise shape.fail(f"{tat}.turn_id", f"repeats turn id {turn_id!r}")
            ids.add(turn_id)
            stamp = t.get("timestamp", date)
            turns.append(
                {
                    "role": r.role(shape.field(t, "role", tat, str), f"{tat}.role"),
                    "text": r.text(shape.field(t, "text", tat, str), f"{tat}.text"),
                    "turn_id": None if turn_id is None else r.ident(turn_id, f"{tat}.turn_id"),
                    "timestamp": r.when(stamp, f"{tat}.timestamp"),
                }
            )
        conv = by_user.setdefault(user, Conversation(user, []))
        conv.sessions.append(SessionData(sid, turns, date))
    questions = shape.field(data, "questions", "", list, required=False) or []
    for i, q in enumerate(questions):
        at = f"questions[{i}]"
        shape.expect(q, at, dict)
        shape.only(q, at, _QUESTION_KEYS)
        user = r.user(q, at, default_user)
        question = Question(
            r.text(shape.field(q, "question", at, str), f"{at}.question"),
            r.answer(q.get("answer"), f"{at}.answer"),
            r.strings(q.get("evidence"), f"{at}.evidence"),
        )
        if user in by_user:
            by_user[user].questions.append(question)
    return list(by_user.values())


def _longmemeval(r: _Reader, items: list[Any]) -> list[Conversation]:
    shape = r.shape
    out = []
    for n, item in enumerate(items):
        at = f"[{n}]"
        shape.expect(item, at, dict)
        haystack = shape.field(item, "haystack_sessions", at, list)
        ids = r.strings(
            shape.field(item, "haystack_session_ids", at, list), f"{at}.haystack_session_ids"
        )
        dates = shape.field(item, "haystack_dates", at, list, required=False)
        dates = [None] * len(haystack) if dates is None else dates
        for key, values in (("haystack_session_ids", ids), ("haystack_dates", dates)):
            if len(values) != len(haystack):
                raise shape.fail(
                    f"{at}.{key}",
                    f"has {len(values)} entries for {len(haystack)} haystack_sessions",
                )
        sessions = []
        evidence = []
        seen: dict[str, int] = {}
        for k, (sid, date, sess) in enumerate(zip(ids, dates, haystack, strict=True)):
            sat = f"{at}.haystack_sessions[{k}]"
            sid = r.ident(sid, f"{at}.haystack_session_ids[{k}]")
            date = r.when(date, f"{at}.haystack_dates[{k}]")
            seen[sid] = seen.get(sid, 0) + 1
            if seen[sid] > 1:  # a few haystacks repeat a session id
                sid = f"{sid}#{seen[sid]}"
            turns = []
            for j, t in enumerate(shape.expect(sess, sat, list)):
                tat = f"{sat}[{j}]"
                shape.expect(t, tat, dict)
                role = r.role(shape.field(t, "role", tat, str), f"{tat}.role")
                text = r.text(shape.field(t, "content", tat, str), f"{tat}.content", blank_ok=True)
                has_answer = shape.field(t, "has_answer", tat, bool, required=False)
                if not text.strip():
                    continue  # a few haystack turns are empty; nothing to remember
                tid = f"{sid}:{j}"
                if has_answer:
                    evidence.append(tid)
                turns.append({"role": role, "text": text, "turn_id": tid, "timestamp": date})
            sessions.append(SessionData(sid, turns, date))
        q = Question(
            r.text(shape.field(item, "question", at, str), f"{at}.question"),
            r.answer(item.get("answer"), f"{at}.answer"),
            evidence,
            r.strings(item.get("answer_session_ids"), f"{at}.answer_session_ids"),
            shape.field(item, "question_type", at, str, required=False) or "",
            shape.field(item, "question_date", at, str, required=False),
        )
        uid = r.ident(shape.field(item, "question_id", at, str), f"{at}.question_id")
        out.append(Conversation(uid, sessions, [q]))
    return out


_SESSION_KEY = re.compile(r"^session_(\d+)$")


def _locomo(r: _Reader, items: list[Any]) -> list[Conversation]:
    shape = r.shape
    out = []
    for n, sample in enumerate(items):
        at = f"[{n}]"
        shape.expect(sample, at, dict)
        conv = shape.field(sample, "conversation", at, dict)
        user = shape.field(sample, "sample_id", at, str, required=False)
        user = f"locomo-{n}" if user is None else r.ident(user, f"{at}.sample_id")
        numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
        sessions = []
        dia_to_session: dict[str, str] = {}
        for k in numbers:
            sid = f"session_{k}"
            cat = f"{at}.conversation"
            date = r.when(
                shape.field(conv, f"{sid}_date_time", cat, str, required=False),
                f"{cat}.{sid}_date_time",
            )
            turns = []
            for j, t in enumerate(shape.field(conv, sid, cat, list)):
                tat = f"{cat}.{sid}[{j}]"
                shape.expect(t, tat, dict)
                text = r.text(shape.field(t, "text", tat, str), f"{tat}.text", blank_ok=True)
                caption = shape.field(t, "blip_caption", tat, str, required=False)
                if caption:
                    text = f"{text} [shares a photo: {caption}]".strip()
                    text = r.text(text, f"{tat}.blip_caption", blank_ok=True)
                role = r.role(shape.field(t, "speaker", tat, str), f"{tat}.speaker")
                dia_id = r.ident(shape.field(t, "dia_id", tat, str), f"{tat}.dia_id")
                if not text.strip():
                    continue
                if dia_id in dia_to_session:
                    raise shape.fail(f"{tat}.dia_id", f"repeats dia_id {dia_id!r}")
                dia_to_session[dia_id] = sid
                turns.append({"role": role, "text": text, "turn_id": dia_id, "timestamp": date})
            if turns:
                sessions.append(SessionData(sid, turns, date))
        questions = []
        for i, qa in enumerate(shape.field(sample, "qa", at, list, required=False) or []):
            qat = f"{at}.qa[{i}]"
            shape.expect(qa, qat, dict)
            evidence = shape.field(qa, "evidence", qat, list, required=False) or []
            ev = [e.strip() for e in evidence if isinstance(e, str)]  # LoCoMo has a few odd ones
            ev = [e for e in ev if e in dia_to_session]
            answer = qa.get("answer", qa.get("adversarial_answer"))
            category = shape.field(qa, "category", qat, int, str, required=False)
            questions.append(
                Question(
                    r.text(shape.field(qa, "question", qat, str), f"{qat}.question"),
                    r.answer(answer, f"{qat}.answer"),
                    ev,
                    sorted({dia_to_session[e] for e in ev}),
                    "" if category is None else str(category),
                )
            )
        out.append(Conversation(user, sessions, questions))
    return out


def _chat_conversations(r: _Reader, log: ChatLog, default_user: str | None) -> list[Conversation]:
    """A chat log's sessions as conversations, one per user (`default_user` where none)."""
    if not log.sessions:
        raise r.shape.fail("", "holds no message with text")
    by_user: dict[str, Conversation] = {}
    for (user, sid), turns in log.sessions.items():
        uid = default_user if user is None else user
        if uid is None:
            raise r.shape.fail(
                "", "its messages name no user_id and no default user was given (--user)"
            )
        conv = by_user.setdefault(uid, Conversation(uid, []))
        conv.sessions.append(SessionData(sid, turns))
    return list(by_user.values())


def load_conversations(
    path: str | Path,
    default_user: str | None = None,
    *,
    max_bytes: int = MAX_FILE_BYTES,
    max_text_chars: int = SessionConfig.max_text_chars,
    session_gap: float | None = SessionConfig.idle_seconds,
) -> list[Conversation]:
    """Read a conversation file in any supported format (`.json`, `.jsonl`, optionally `.gz`).

    The whole file is checked before anything is returned: its size (at most `max_bytes` on
    disk and after decompression, checked before reading), its nesting (`MAX_DEPTH`), and the
    shape and types of every value the format defines (our schema also refuses unknown keys;
    LongMemEval, LoCoMo and chat-log files may carry keys this reader does not use). JSON
    Lines are read line by line (`reflective_memory.chatlog`).

    Args:
        path: The file.
        default_user: User id for our own schema's sessions and chat-log messages that name
            none.
        max_bytes: Largest file accepted (default `MAX_FILE_BYTES`, 256 MiB).
        max_text_chars: Longest turn or question text accepted (default: the engine's
            `sessions.max_text_chars`).
        session_gap: Chat logs: seconds of silence after which messages without a session id
            start a new session (default `SessionConfig.idle_seconds`, 1800: a live session
            ends after that long idle too); the silence is measured between messages that have
            a time, so a log without times stays one session. `None`: one session per file
            (per line for `{"messages": [...]}` lines).

    Returns:
        The conversations in file order.

    Raises:
        InvalidFileError: The file is missing, too large, unreadable, in no known format, or
            a value in it has the wrong type or shape (the message names the file, the path
            inside it and the problem). It is an `InvalidInputError`.
    """
    path = Path(path)
    if session_gap is not None and (
        isinstance(session_gap, bool)
        or not isinstance(session_gap, (int, float))
        or not session_gap > 0
    ):
        raise InvalidInputError(
            f"session_gap must be a positive number of seconds, got {session_gap!r}"
        )
    r = _Reader(FileShape(path), max_text_chars)
    if path.is_file() and looks_like_jsonl(path, max_bytes):
        return _chat_conversations(
            r, _read_chat_jsonl(r, path, max_bytes, session_gap), default_user
        )
    data = read_json(path, max_bytes=max_bytes)
    if isinstance(data, dict) and data.get("format") == SCHEMA_ID:
        return _ours(r, data, default_user)
    if isinstance(data, dict) and "haystack_sessions" in data:
        return _longmemeval(r, [data])
    if isinstance(data, list) and data and isinstance(data[0], dict):
        if "haystack_sessions" in data[0]:
            return _longmemeval(r, data)
        if "conversation" in data[0]:
            return _locomo(r, data)
    if is_chat_log(data):
        return _chat_conversations(r, _read_chat_json(r, data, session_gap), default_user)
    raise r.shape.fail(
        "",
        "unknown format; expected reflective-memory/v1, LongMemEval or LoCoMo JSON, or a chat "
        'log (JSON Lines of messages, a list of role/content messages, {"messages": [...]}, '
        "LangChain or LlamaIndex message dumps)",
    )


@dataclass
class IngestReport:
    """What `ingest_conversations` did, per user id.

    Attributes:
        added: Turns stored.
        skipped: Turns already stored (same user, session, role, text and timestamp — or no
            timestamp in the file — or the same turn id), not added again.
    """

    added: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def users(self) -> list[str]:
        """Every user id the conversations named, in order."""
        return list(dict.fromkeys([*self.added, *self.skipped]))


def _when(timestamp: Any) -> str | None:
    """A turn's time as ISO text (None without one), so equal times compare equal."""
    when = parse_timestamp(timestamp)
    return None if when is None else when.isoformat()


def _new_turns(mem: ReflectiveMemory, uid: str, session: SessionData) -> list[dict[str, Any]]:
    """The session's turns not stored yet (one read of the stored session; O(turns)).

    A file turn is stored already when the session holds its id, or a turn of the same role,
    text and time; a file turn without a time (stamped when it was first stored) matches on
    role and text. Each stored turn matches one file turn, so a turn said twice counts twice.
    Roles compare as stored (`canonical_role`): an older version stored aliases as given.
    """
    stored = mem.turns(uid, session.session_id)
    if not stored:
        return list(session.turns)
    ids = {kept.turn_id for kept in stored}
    unmatched: dict[tuple[Any, Any], list[str | None]] = {}
    for kept in stored:
        key = (canonical_role(kept.role), kept.text)
        unmatched.setdefault(key, []).append(_when(kept.timestamp))
    new = []
    for t in session.turns:
        if t.get("turn_id") in ids:
            continue
        role = t.get("role")
        role = canonical_role(role) if isinstance(role, str) else role
        times = unmatched.get((role, t.get("text")), [])
        when = _when(t.get("timestamp"))
        if when is None and times:
            times.pop()
        elif when is not None and when in times:
            times.remove(when)
        else:
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

    Every turn is checked as `add_turns` checks it before anything is written, so a bad turn
    stores nothing. Turns already stored are skipped, so ingesting a file twice adds nothing: a
    turn whose id the session holds, or (without an id) one with the same role, text and
    timestamp as a stored turn of the session, or the same role and text when the file gives
    no time (counted, so a turn said twice is stored twice). A turn without a time takes its
    conversation's time (`ReflectiveMemory.turn_time`); a time without a zone is UTC.

    Args:
        mem: Target memory.
        conversations: Loaded conversations.
        user: Store under this user id; with several conversations each goes to
            `<user>/<conversation user id>`.
        progress: Show a progress bar over sessions.

    Returns:
        Turns added and skipped per user id.

    Raises:
        InvalidInputError: A user id or a turn is not valid (naming the user, session and
            turn); nothing has been written.
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
        check_id("user id", uid)  # before anything is written
        todo += [(uid, s) for s in conv.sessions]
    for uid, session in todo:  # every turn as `add_turns` checks it, before anything is written
        for i, t in enumerate(session.turns):
            try:
                mem.sessions.check_turns([{**t, "user_id": uid, "session_id": session.session_id}])
            except InvalidInputError as exc:
                raise InvalidInputError(
                    f"user {uid!r}, session {session.session_id!r}, turn {i}: {exc}"
                ) from None
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
