"""Framing user text inside prompts so that it cannot forge the prompt's structure.

Prompts show conversations as structured lines (`[Exchange 3]:`, `[4] user: ...`,
`Turn 2 | user: ...`) and ask for answers between markers (`<segmentation>`). A turn whose text
contains such a line or marker must not be read as one. Three rules, applied to every piece of
user text a prompt embeds:

* `frame_lines`: continuation lines of a text are indented, so every structural line of a
  prompt starts at column 0 and no user line does;
* `defuse`: given marker patterns inside the text (`[Exchange N]`, `</segmentation>`) are
  rewritten to a visibly different form (`(Exchange N)`, `&lt;/segmentation&gt;`);
* `speaker_label`: a role shown as `role:` is one short printable line without brackets,
  colons or bars (new turns are validated at `add_turn`; this also cleans stored ones).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["frame_lines", "defuse", "speaker_label", "TAG_RE", "INDENT"]

#: Prefix of every continuation line of framed text.
INDENT = "    "
#: Any opening or closing angle-bracket tag, e.g. `<segmentation>` or `</ segmentation >`.
TAG_RE = re.compile(r"<\s*(/?)\s*([A-Za-z_][\w-]*)\s*>")
_LABEL_BAD = re.compile(r"[\[\]{}<>:|\\]|[^\S ]|[\x00-\x1f\x7f-\x9f]")


def frame_lines(text: str, indent: str = INDENT) -> str:
    r"""Indent every line after the first (all Unicode line breaks count), so none starts a line.

    Example:
        >>> frame_lines("a\n[Exchange 0]:\nb")
        'a\n    [Exchange 0]:\n    b'
    """
    lines = text.splitlines() or [""]
    return ("\n" + indent).join(lines)


def defuse(text: str, markers: Iterable[re.Pattern[str]] = (), tags: Iterable[str] = ()) -> str:
    """Rewrite structural markers inside user text.

    Args:
        text: The user text.
        markers: Patterns whose matches get their square brackets turned into parentheses.
        tags: Tag names (case-insensitive) whose `<tag>` / `</tag>` become `&lt;tag&gt;`.

    Returns:
        The text with each marker made inert.
    """
    for pat in markers:
        text = pat.sub(lambda m: m.group(0).replace("[", "(").replace("]", ")"), text)
    names = {t.lower() for t in tags}
    if names:

        def _tag(m: re.Match[str]) -> str:
            if m.group(2).lower() not in names:
                return m.group(0)
            return f"&lt;{m.group(1)}{m.group(2)}&gt;"

        text = TAG_RE.sub(_tag, text)
    return text


def speaker_label(role: str, limit: int = 64) -> str:
    r"""A role as one safe label: forbidden characters dropped, spaces collapsed, length cut.

    Example:
        >>> speaker_label("user\n[3] assistant")
        'user 3 assistant'
    """
    cleaned = _LABEL_BAD.sub(" ", str(role))
    cleaned = " ".join(cleaned.split())[:limit].strip()
    return cleaned or "speaker"
