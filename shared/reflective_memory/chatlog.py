"""Chat logs as people have them: message lists and JSON Lines, read into conversations.

`reflective_memory.io.load_conversations` hands a file here when its shape is a chat log rather
than one of the conversation formats (reflective-memory/v1, LongMemEval, LoCoMo). Accepted, told
apart by shape (not by name):

* **JSON Lines** (`.jsonl`, `.ndjson`, or any file whose first line is a whole JSON value and
  more lines follow): one message object per line, or one `{"messages": [...]}` conversation
  per line (the OpenAI fine-tuning layout). Read line by line, never as one document.
* **A message list**: a JSON list of messages, or `{"messages": [...]}` (OpenAI style, optional
  `session_id` / `user_id`), or a list of such objects.

A message is any of:

* OpenAI style: `{"role": "user", "content": "...", "name": "Claire"}`; `content` may be a
  list of parts (`{"type": "text", "text": "..."}`, the Responses API's `input_text` /
  `output_text`, or the Assistants API's `{"type": "text", "text": {"value": "..."}}`; other
  parts, images for instance, are left out).
* LangChain, as `messages_to_dict` writes it: `{"type": "human", "data": {"content": "...",
  "additional_kwargs": {...}, "response_metadata": {...}, "id": ...}}`, or a message's
  `model_dump()` (`type` and `content` at the top). Types `human`, `ai`, `system`, `tool`,
  `function` become roles `user`, `assistant`, `system`, `tool`, `tool`; a `chat` message keeps
  its `role`. (`data.id` is the message's own id, not its session's.)
* LlamaIndex `ChatMessage.model_dump()`: `{"role": ..., "blocks": [{"block_type": "text",
  "text": ...}], "additional_kwargs": {...}}` (or `content` instead of `blocks`).

Roles: `user`, `assistant` and their aliases in any case (`human`, `ai`, `bot`, `model`, ...:
`validation.ROLE_ALIASES`) are stored as `user` / `assistant`; `system` and `tool` messages are
kept as such; any other role or speaker `name` is stored as given (when it is a valid label,
as every adapter does).

What a message says about itself (`MESSAGE_FIELDS`) is looked up on the message (LangChain's
`data`), then in its `additional_kwargs` (LangChain, LlamaIndex), `response_metadata`
(LangChain) and `metadata` (OpenAI), the first found winning: its session (`session_id`,
`conversation_id`, `thread_id`; text or an integer), its user (`user_id`) and its time
(`timestamp`, `time`, `created_at`, `date` on the message, `timestamp` in those mappings: ISO
text or Unix seconds). A `{"messages": [...]}` object may name the session and user of its
messages at its top or in its `metadata`.

Sessions: messages without a session id go to one session named after the file (`claire.jsonl`
-> `claire`) and start a new one (`claire-2`, ...) after `session_gap` seconds of silence
(default `SessionConfig.idle_seconds`, 1800 s: the idle time after which a live session ends;
`None`: never). The silence is measured between consecutive messages that have a time; a
message without one stays in the current session, so a log without any times is one session.
Messages without a user go to `default_user`. A message whose text is empty (an assistant
message holding only tool calls) is left out: there is nothing to remember.

A malformed file raises `InvalidFileError` naming the file, the line (JSON Lines) or position
(`[3].content`) and the problem, before anything is returned.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import Any, Protocol

from reflective_memory.errors import InvalidFileError
from reflective_memory.jsonfile import MAX_DEPTH, FileShape, bounded_lines, json_depth
from reflective_memory.text import parse_timestamp
from reflective_memory.validation import MESSAGE_TIME_KEY, role_or

__all__ = [
    "ChatLog",
    "Message",
    "message",
    "LANGCHAIN_ROLES",
    "MESSAGE_FIELDS",
    "MessageFields",
    "looks_like_jsonl",
    "is_chat_log",
    "read_chat_json",
    "read_chat_jsonl",
]

#: LangChain message `type` -> stored role.
LANGCHAIN_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}


@dataclass(frozen=True)
class MessageFields:
    """Where chat-log messages keep what they say about themselves (one place, documented).

    Attributes:
        nested: Mappings inside a message searched after the message itself, in order:
            LangChain and LlamaIndex `additional_kwargs`, LangChain `response_metadata`, OpenAI
            `metadata`.
        session: Keys of a message's session id.
        user: Keys of a message's user id.
        time: Keys of a message's time on the message itself.
        nested_time: Keys of its time inside the nested mappings (where the adapters write it).
    """

    nested: tuple[str, ...] = ("additional_kwargs", "response_metadata", "metadata")
    session: tuple[str, ...] = ("session_id", "conversation_id", "thread_id")
    user: tuple[str, ...] = ("user_id",)
    time: tuple[str, ...] = ("timestamp", "time", "created_at", "date")
    nested_time: tuple[str, ...] = (MESSAGE_TIME_KEY,)


#: The keys read from every chat-log message (see `MessageFields`).
MESSAGE_FIELDS = MessageFields()
#: Content part types whose text is kept (OpenAI chat, Responses API; LlamaIndex blocks).
_TEXT_PARTS = ("text", "input_text", "output_text")
_JSONL_SUFFIXES = {".jsonl", ".ndjson"}
#: Longest first line read to tell JSON Lines by shape (a longer one needs a `.jsonl` name).
_PEEK_CHARS = 16 * 2**20


class _Checks(Protocol):
    """The value checks of `reflective_memory.io` (its `_Reader`), shared with this module."""

    @property
    def shape(self) -> FileShape: ...

    def ident(self, value: Any, where: str) -> str: ...
    def role(self, value: Any, where: str) -> str: ...
    def text(self, value: Any, where: str, *, blank_ok: bool = False) -> str: ...
    def when(self, value: Any, where: str) -> Any: ...


@dataclass
class Message:
    """One message of a chat log, checked.

    Attributes:
        role: Stored role (the speaker's name when given and valid).
        text: What was said.
        timestamp: Its time as given (ISO text or Unix seconds), or None.
        session_id: Its session, if the log names one.
        user_id: Its user, if the log names one.
    """

    role: str
    text: str
    timestamp: Any = None
    session_id: str | None = None
    user_id: str | None = None


@dataclass
class ChatLog:
    """Messages grouped by user and session, in first-seen order (`io` makes conversations).

    Attributes:
        sessions: `(user_id or None, session_id) -> turns` (dicts of role, text, timestamp).
    """

    sessions: dict[tuple[str | None, str], list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, user: str | None, session: str, msg: Message) -> None:
        """Append `msg` to its session."""
        turn = {"role": msg.role, "text": msg.text, "turn_id": None, "timestamp": msg.timestamp}
        self.sessions.setdefault((user, session), []).append(turn)


def _is_message(obj: Any) -> bool:
    """Whether `obj` has the shape of one message of any supported layout."""
    if not isinstance(obj, dict):
        return False
    if "role" in obj and ("content" in obj or "blocks" in obj):
        return True
    return isinstance(obj.get("type"), str) and ("data" in obj or "content" in obj)


def is_chat_log(data: Any) -> bool:
    """Whether a parsed JSON document is a chat log (a message list or `{"messages": [...]}`)."""
    if isinstance(data, dict):
        return "messages" in data or _is_message(data)
    if isinstance(data, list) and data:
        first = data[0]
        return _is_message(first) or (isinstance(first, dict) and "messages" in first)
    return False


def looks_like_jsonl(path: Path, max_chars: int = _PEEK_CHARS) -> bool:
    """Whether `path` holds JSON Lines: by its suffix, or by its shape.

    By shape: a first line that is a whole JSON object, followed by more lines (a
    pretty-printed document's first line does not parse alone). At most `max_chars` of a
    line are read to tell.
    """
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if Path(name).suffix.lower() in _JSONL_SUFFIXES:
        return True
    peek = min(max_chars, _PEEK_CHARS)
    try:
        with _open_text(path) as fh:
            first = fh.readline(peek)
            while first and not first.strip():
                first = fh.readline(peek)
            if not first.lstrip().startswith("{"):
                return False
            json.loads(first)
            following = fh.readline(peek)
            while following and not following.strip():
                following = fh.readline(peek)
            return bool(following)
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError):
        return False  # the JSON reader reports what is wrong with the file


def _open_text(path: Path) -> io.TextIOBase:
    raw: Any = gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)


def _part_text(r: _Checks, part: dict[str, Any], where: str) -> str | None:
    """The text of one content part (None: a part that holds no text, e.g. an image)."""
    kind = part.get("type", part.get("block_type"))
    if kind not in _TEXT_PARTS:
        return None
    text = r.shape.field(part, "text", where, str, dict)
    if isinstance(text, dict):  # the Assistants API: {"value": "...", "annotations": [...]}
        text = r.shape.field(text, "value", f"{where}.text", str)
    return text


def _text_of(r: _Checks, content: Any, where: str) -> str:
    """A message's text from a string or a list of parts (text parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return r.text(content, where, blank_ok=True)
    r.shape.expect(content, where, str, list)
    parts = []
    for i, part in enumerate(content):
        pat = f"{where}[{i}]"
        if isinstance(part, str):
            parts.append(part)
            continue
        r.shape.expect(part, pat, dict)
        text = _part_text(r, part, pat)
        if text is not None:
            parts.append(text)
    return r.text("\n".join(p for p in parts if p.strip()), where, blank_ok=True)


#: Where a message keeps its fields: `(path, mapping)` pairs, searched in order.
_Places = list[tuple[str, dict[str, Any]]]


def _nested(r: _Checks, body: dict[str, Any], at: str) -> _Places:
    """The mappings inside a message that may name its session, user or time, in order."""
    out = []
    for key in MESSAGE_FIELDS.nested:
        value = body.get(key)
        if value is not None:
            path = f"{at}.{key}" if at else key
            out.append((path, r.shape.expect(value, path, dict)))
    return out


def _lookup(places: _Places, keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """`(path, value)` of the first of `keys` set in the first place that sets one."""
    for at, obj in places:
        for key in keys:
            if obj.get(key) is not None:
                return (f"{at}.{key}" if at else key), obj[key]
    return None


def _ident(r: _Checks, found: tuple[str, Any] | None) -> str | None:
    """A session or user id found in a message: text, or an integer (a database's row id)."""
    if found is None:
        return None
    where, value = found
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return r.ident(value, where)


def message(r: _Checks, obj: Any, where: str) -> Message | None:
    """One message checked (None when it says nothing).

    Raises:
        InvalidFileError: `obj` is no message of a supported layout, or a value is wrong.
    """
    shape = r.shape
    shape.expect(obj, where, dict)
    if not _is_message(obj):
        raise shape.fail(
            where,
            "is not a message: expected role and content (OpenAI), role and blocks "
            "(LlamaIndex) or type and data (LangChain messages_to_dict); got keys "
            f"{', '.join(sorted(map(str, obj))[:6]) or 'none'}",
        )
    body, at = obj, where
    if "role" not in obj:  # LangChain
        kind = shape.field(obj, "type", where, str)
        if "data" in obj:
            body, at = shape.field(obj, "data", where, dict), f"{where}.data"
        if kind == "chat":
            role = r.role(shape.field(body, "role", at, str), f"{at}.role")
        elif kind in LANGCHAIN_ROLES:
            role = LANGCHAIN_ROLES[kind]
        else:
            raise shape.fail(
                f"{where}.type",
                f"unknown LangChain message type {kind!r} (known: "
                f"{', '.join([*LANGCHAIN_ROLES, 'chat'])})",
            )
        text = _text_of(r, body.get("content"), f"{at}.content")
    else:
        role = r.role(shape.field(obj, "role", where, str), f"{where}.role")
        if "blocks" in obj and obj.get("content") is None:
            text = _text_of(r, shape.field(obj, "blocks", where, list), f"{where}.blocks")
        else:
            text = _text_of(r, obj.get("content"), f"{where}.content")
    name = body.get("name")
    if name is not None:
        shape.expect(name, f"{at}.name", str)
    own: _Places = [(where, obj)] if body is obj else [(where, obj), (at, body)]
    places = own + _nested(r, body, at)
    found = _lookup(own, MESSAGE_FIELDS.time) or _lookup(places, MESSAGE_FIELDS.nested_time)
    stamp = None if found is None else r.when(found[1], found[0])
    session = _ident(r, _lookup(places, MESSAGE_FIELDS.session))
    user = _ident(r, _lookup(places, MESSAGE_FIELDS.user))
    if not text.strip():
        return None
    return Message(role_or(name, role), text, stamp, session, user)


class _Sessions:
    """Names the session of each message that names none: `base`, cut at long silences.

    Per user, a message more than `session_gap` seconds after the previous message with a time
    starts the next session (`base-2`, `base-3`, ...); a message without a time stays in the
    current one. Naive times are read as UTC.
    """

    def __init__(self, base: str, session_gap: float | None) -> None:
        self.base, self.gap = base, session_gap
        self.count: dict[str | None, int] = {}
        self.last: dict[str | None, float] = {}

    def of(self, msg: Message) -> str:
        """The session of `msg` (its own when it names one)."""
        if msg.session_id is not None:
            return msg.session_id
        user = msg.user_id
        n = self.count.setdefault(user, 1)
        when = None if self.gap is None else parse_timestamp(msg.timestamp)
        if self.gap is not None and when is not None:
            t = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
            if user in self.last and t - self.last[user] > self.gap:
                n = self.count[user] = n + 1
            self.last[user] = t
        return self.base if n == 1 else f"{self.base}-{n}"


def _base(path: Path) -> str:
    """The session id of a file's messages that name none: its name without suffixes."""
    return Path(path.name.removesuffix(".gz")).stem.strip() or "chat"


def _conversation(
    r: _Checks,
    log: ChatLog,
    obj: dict[str, Any],
    where: str,
    sid: str,
    session_gap: float | None,
) -> None:
    """Add one `{"messages": [...]}` object (its own session id and user, if it names them).

    Its messages that name no session go to the object's session if it names one, else to
    `sid`, cut at long silences (`_Sessions`).
    """
    places = [(where, obj), *_nested(r, obj, where)]
    named = _ident(r, _lookup(places, MESSAGE_FIELDS.session))
    user = _ident(r, _lookup(places, MESSAGE_FIELDS.user))
    sessions = _Sessions(sid if named is None else named, None if named else session_gap)
    for i, item in enumerate(r.shape.field(obj, "messages", where, list)):
        msg = message(r, item, f"{where}.messages[{i}]" if where else f"messages[{i}]")
        if msg is not None:
            msg.user_id = msg.user_id or user
            log.add(msg.user_id, sessions.of(msg), msg)


def read_chat_json(r: _Checks, data: Any, session_gap: float | None) -> ChatLog:
    """A parsed JSON chat log (see the module docstring) as sessions."""
    log = ChatLog()
    base = _base(r.shape.path)
    if isinstance(data, dict) and "messages" in data:
        _conversation(r, log, data, "", base, session_gap)
        return log
    items = data if isinstance(data, list) else [data]
    if isinstance(data, list) and isinstance(data[0], dict) and "messages" in data[0]:
        for n, obj in enumerate(items):
            r.shape.expect(obj, f"[{n}]", dict)
            _conversation(r, log, obj, f"[{n}]", f"{base}-{n + 1}", session_gap)
        return log
    sessions = _Sessions(base, session_gap)
    for n, obj in enumerate(items):
        where = f"[{n}]" if isinstance(data, list) else ""
        msg = message(r, obj, where or "top level")
        if msg is not None:
            log.add(msg.user_id, sessions.of(msg), msg)
    return log


def _lines(path: Path, max_bytes: int) -> Iterator[tuple[int, str]]:
    """`(line number, line)` of a text file, streamed, within `max_bytes` (decompressed too).

    Each line is read with a limit (`jsonfile.bounded_lines`), so a `.gz` that inflates to one
    huge line costs the limit, not the line.
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise InvalidFileError(
            path, "", f"is {size:,} bytes, more than the maximum of {max_bytes:,}"
        )
    too_large = f"the file holds more than {max_bytes:,} characters"
    try:
        with _open_text(path) as fh:
            yield from bounded_lines(
                fh, path, max_total=max_bytes, too_large=too_large, unit="characters"
            )
    except UnicodeDecodeError as exc:
        raise InvalidFileError(path, "", f"is not UTF-8 text ({exc.reason})") from None
    except (OSError, EOFError) as exc:
        raise InvalidFileError(path, "", f"cannot be read ({exc})") from None


def read_chat_jsonl(r: _Checks, path: Path, max_bytes: int, session_gap: float | None) -> ChatLog:
    """A JSON Lines chat log (one message or one `{"messages": [...]}` per line) as sessions."""
    log = ChatLog()
    base = _base(path)
    sessions = _Sessions(base, session_gap)
    for n, line in _lines(path, max_bytes):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise r.shape.fail(
                where, f"is not valid JSON: {exc.msg} (column {exc.colno})"
            ) from None
        except (RecursionError, ValueError) as exc:
            raise r.shape.fail(where, f"is not readable JSON ({exc})") from None
        if json_depth(obj) > MAX_DEPTH:
            raise r.shape.fail(where, f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(obj, dict) and "messages" in obj:
            _conversation(r, log, obj, where, f"{base}-{n}", session_gap)
            continue
        msg = message(r, obj, where)
        if msg is not None:
            log.add(msg.user_id, sessions.of(msg), msg)
    if not log.sessions:
        raise r.shape.fail("", "holds no message with text")
    return log
