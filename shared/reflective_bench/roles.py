"""How `bench retrieval` stores a conversation's speakers: `--roles names` or `--roles ua`.

* `names` (the default): every turn is stored under the speaker name the data gives (LoCoMo and
  REALTALK: `Emi`, `elise`; LongMemEval: `user`, `assistant`), as the README's examples do.
* `ua`: stored as a chat app would: the user side as role `user`, every other speaker as role
  `assistant`, and each turn's text prefixed with its speaker's name (`Emi: Hey! How are
  you?`), so the names stay in the text. A conversation whose roles are already only `user` and
  `assistant` (LongMemEval) is stored as it is.

Which speaker is the user side, for a conversation of named speakers: the `speaker_a` the file
declares for it (LoCoMo's schema, which REALTALK is converted to; the data README uses "the
speaker_a side as `user`"), else the speaker of the conversation's first turn. In the five
REALTALK dev chats the two agree (speaker_a opens every chat). Turn ids, sessions, dates and
questions are kept, so evidence is scored the same way under both.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from reflective_memory.errors import ConfigError
from reflective_memory.io import Conversation, SessionData

__all__ = [
    "ROLES",
    "CHAT_ROLES",
    "declared_user_sides",
    "user_side",
    "user_roles",
    "as_chat",
    "store_roles",
]

#: Values of `--roles`.
ROLES = ("names", "ua")
#: The roles of a chat app's history.
CHAT_ROLES = frozenset({"user", "assistant"})


def declared_user_sides(path: str | Path) -> dict[str, str]:
    """The `speaker_a` of every sample of a LoCoMo-shaped file, by the conversation's user id.

    Args:
        path: A conversation file (`.json` or `.json.gz`) that `load_conversations` has read.

    Returns:
        `{sample_id: speaker_a}` (the user id `reflective_memory.io` gives a sample without
        `sample_id` is `locomo-<n>`); empty for any other format.
    """
    p = Path(path)
    opener: Any = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return {}
    out: dict[str, str] = {}
    for n, sample in enumerate(data):
        conv = sample.get("conversation") if isinstance(sample, dict) else None
        if isinstance(conv, dict) and isinstance(conv.get("speaker_a"), str):
            out[str(sample.get("sample_id", f"locomo-{n}"))] = conv["speaker_a"]
    return out


def _roles(conv: Conversation) -> set[str]:
    return {str(t["role"]) for s in conv.sessions for t in s.turns}


def user_side(conv: Conversation, declared: dict[str, str] | None = None) -> str | None:
    """The speaker stored as `user` under `--roles ua`.

    Args:
        conv: A conversation.
        declared: `declared_user_sides` of its file (`None`: none declared).

    Returns:
        `None` when the conversation's roles are already only `user` / `assistant`; else the
        declared `speaker_a` if it speaks in the conversation, else the first turn's speaker.
    """
    roles = _roles(conv)
    if roles <= CHAT_ROLES:
        return None
    name = (declared or {}).get(conv.user_id)
    if name is not None and name in roles:
        return name
    return next(str(t["role"]) for s in conv.sessions for t in s.turns)


def user_roles(conversations: list[Conversation], path: str | Path) -> dict[str, str]:
    """The role each conversation's user side is stored under, by user id.

    Args:
        conversations: As they will be stored (after `store_roles`).
        path: Their file (read again only when a conversation has named speakers, for
            `speaker_a`).

    Returns:
        `user` for a user / assistant conversation, else its `user_side` speaker name.
    """
    if all(_roles(c) <= CHAT_ROLES for c in conversations):
        return {c.user_id: "user" for c in conversations}
    declared = declared_user_sides(path)
    return {c.user_id: user_side(c, declared) or "user" for c in conversations}


def as_chat(conv: Conversation, user: str | None) -> Conversation:
    """`conv` with `user`'s turns as role `user`, the others as `assistant`, texts `Name: text`.

    Args:
        conv: A conversation of named speakers.
        user: Its user side (`user_side`); `None` returns `conv` itself.
    """
    if user is None:
        return conv
    sessions = [
        SessionData(
            s.session_id,
            [
                {
                    **t,
                    "role": "user" if t["role"] == user else "assistant",
                    "text": f"{t['role']}: {t['text']}",
                }
                for t in s.turns
            ],
            s.date,
        )
        for s in conv.sessions
    ]
    return replace(conv, sessions=sessions)


def store_roles(
    conversations: list[Conversation], roles: str, path: str | Path
) -> tuple[list[Conversation], dict[str, str]]:
    """Apply `--roles` to loaded conversations.

    Args:
        conversations: As `load_conversations(path)` returned them.
        roles: `names` (returned as they are) or `ua`.
        path: Their file (read again only for `ua` with named speakers, for `speaker_a`).

    Returns:
        The conversations to store and the user side of every converted one, by user id.

    Raises:
        ConfigError: Unknown `roles`.
    """
    if roles not in ROLES:
        raise ConfigError(f"roles must be one of {ROLES}, not {roles!r}")
    if roles == "names" or all(_roles(c) <= CHAT_ROLES for c in conversations):
        return conversations, {}
    declared = declared_user_sides(path)
    sides = {c.user_id: user_side(c, declared) for c in conversations}
    out = [as_chat(c, sides[c.user_id]) for c in conversations]
    return out, {uid: name for uid, name in sides.items() if name is not None}
