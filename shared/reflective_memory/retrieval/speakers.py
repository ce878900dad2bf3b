"""Who said a turn: its role, or the `Name: ` label a chat app wrote into its text.

Apps that keep `user` / `assistant` roles often write the person into the text
(`Emi: see you at 8`, `elise: see you`). The label names the speaker a question can name; it
says who spoke, not what was said, so the turn's dense vector is made from the rest.
"""

from __future__ import annotations

import re

from reflective_memory.types import Turn
from reflective_memory.validation import ROLE_ALIASES

__all__ = ["CHAT_ROLES", "speaker_of", "utterance"]

#: Roles a chat app stores turns under (`user`, `assistant` and their aliases, which stores
#: written by older versions may hold); a `Name: ` at the start of such a turn names its speaker.
CHAT_ROLES = frozenset(ROLE_ALIASES)
#: A label: one to three words of letters (any case; a word may hold digits, `'`, `.`, `-`).
_LABEL = re.compile(r"([^\W\d_][\w'.-]*(?: [^\W\d_][\w'.-]*){0,2}): (?=\S)")


def _label(turn: Turn) -> re.Match[str] | None:
    if turn.role.strip().casefold() not in CHAT_ROLES:
        return None
    return _LABEL.match(turn.text)


def speaker_of(turn: Turn) -> str:
    """Who said a turn: its role, or the `Name: ` its text opens with under a chat role.

    Example:
        >>> speaker_of(Turn("u", "s", "user", "Emi: see you at 8", "s:0", 0))
        'Emi'
        >>> speaker_of(Turn("u", "s", "assistant", "elise: see you", "s:1", 1))
        'elise'
        >>> speaker_of(Turn("u", "s", "Kate", "Note: bring cake", "s:2", 2))
        'Kate'
    """
    m = _label(turn)
    return turn.role if m is None else m.group(1)


def utterance(turn: Turn) -> str:
    """What a turn says, without the `Name: ` label of a chat-role turn (its dense text).

    Example:
        >>> utterance(Turn("u", "s", "user", "Emi: see you at 8", "s:0", 0))
        'see you at 8'
        >>> utterance(Turn("u", "s", "Kate", "Note: bring cake", "s:1", 1))
        'Note: bring cake'
    """
    m = _label(turn)
    return turn.text if m is None else turn.text[m.end() :]
