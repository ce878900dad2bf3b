"""Small text utilities: timestamps, lexical tokens, small talk, memory text formatting."""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from reflective_memory.errors import InvalidInputError

__all__ = [
    "parse_timestamp",
    "as_utc",
    "lexical_tokens",
    "stem",
    "format_date",
    "STOPWORDS",
    "short_words",
    "words_of",
    "one_line",
]

_FORMATS = (
    "%Y/%m/%d (%a) %H:%M",  # LongMemEval: 2023/05/21 (Sun) 11:54
    "%Y/%m/%d %H:%M",
    "%Y/%m/%d",
    "%I:%M %p on %d %B, %Y",  # LoCoMo: 1:56 pm on 8 May, 2023
    "%I:%M %p on %d %b, %Y",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
    "%d %B %Y",
    "%B %d, %Y",
)


def as_utc(value: datetime) -> datetime:
    """A time as timezone-aware: a naive time is read as UTC, an aware one is kept as it is.

    Example:
        >>> as_utc(datetime(2025, 3, 1, 9, 30)).isoformat()
        '2025-03-01T09:30:00+00:00'
    """
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def parse_timestamp(value: Any) -> datetime | None:
    """Turn a timestamp given in any common form into a timezone-aware `datetime`.

    Accepts `None`, a `datetime`, a Unix time in seconds, an ISO-8601 string, LongMemEval's
    `2023/05/21 (Sun) 11:54` and LoCoMo's `1:56 pm on 8 May, 2023`. A time without a time
    zone (a naive `datetime`, a string without offset) is read as UTC; a time with one keeps
    its offset. Every time the library stores passes here, so no naive time is ever stored.

    Args:
        value: The timestamp.

    Returns:
        The parsed time (timezone-aware), or `None` for `None`.

    Raises:
        InvalidInputError: The value is of another type or a string in no known format.

    Example:
        >>> parse_timestamp("2023/05/21 (Sun) 11:54").isoformat()
        '2023-05-21T11:54:00+00:00'
        >>> parse_timestamp("2025-03-01T09:30:00+02:00").isoformat()
        '2025-03-01T09:30:00+02:00'
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return as_utc(value)
    if isinstance(value, bool):
        raise InvalidInputError("timestamp must be a datetime, a number or a string, not bool")
    if isinstance(value, (int, float)):
        try:
            return datetime.fromtimestamp(float(value), tz=timezone.utc)
        except (OverflowError, OSError, ValueError) as exc:
            raise InvalidInputError(f"timestamp {value!r} is out of range") from exc
    if isinstance(value, str):
        text = value.strip()
        try:
            return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
        except ValueError:
            pass
        for fmt in _FORMATS:
            try:
                return as_utc(datetime.strptime(text, fmt))
            except ValueError:
                continue
        raise InvalidInputError(f"timestamp {value!r} is in no known format (use ISO-8601)")
    raise InvalidInputError(
        f"timestamp must be a datetime, a number or a string, got {type(value).__name__}"
    )


def format_date(ts: datetime | None) -> str:
    """Render a session date for a memory's text, e.g. `2023-05-21 (Sun) 11:54`."""
    if ts is None:
        return ""
    return ts.strftime("%Y-%m-%d (%a) %H:%M")


STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t don ll ve re m d also okay ok oh um uh yeah yes hi hello thanks thank""".split()
)

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def one_line(text: str) -> str:
    r"""`text` on one line for storing, without control characters.

    Whitespace runs become one space; control characters are dropped (a NUL, which no store
    keeps, or an escape an LLM wrote).

    Example:
        >>> one_line("a\x00b\n  c\x01")
        'ab c'
    """
    kept = "".join(ch for ch in text if ch.isspace() or unicodedata.category(ch) != "Cc")
    return " ".join(kept.split())


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """Strip one common English suffix (memoised: chat vocabularies are small)."""
    for suffix in ("ingly", "edly", "ing", "ies", "ed", "es", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def lexical_tokens(text: str) -> list[str]:
    """Tokens for BM25: lower-cased words without stopwords, lightly stemmed.

    Example:
        >>> lexical_tokens("I moved to Berlin and I'm loving it")
        ['mov', 'berlin', 'lov']
    """
    return [stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


_SMALL_TALK_MAX_WORDS = 12
_SMALL_TALK_CHARS = 240  # holds more than 12 words of small talk (they are short)


def words_of(text: str) -> frozenset[str]:
    """The distinct case-folded words of a text (letters and digits; any script).

    Example:
        >>> sorted(words_of("Mon chat s'appelle Miso, MISO!"))
        ['appelle', 'chat', 'miso', 'mon', 's']
    """
    return frozenset(_WORD.findall(text.casefold()))


def short_words(text: str) -> tuple[str, ...] | None:
    """The case-folded words of a text of at most 12 words; None for a longer text.

    Only a text of few words may be too short to stand alone (`retrieval.redundancy`). A long
    text is told in its opening: 13 words fit in 240 characters.

    Example:
        >>> short_words("Got it, THANKS!"), short_words("one two three " * 5)
        (('got', 'it', 'thanks'), None)
    """
    head = text[:_SMALL_TALK_CHARS]
    words: list[str] = []
    for m in _WORD.finditer(head.casefold()):  # a word cut at the end is still a word
        words.append(m.group())
        if len(words) > _SMALL_TALK_MAX_WORDS:
            return None
    if len(head) < len(text):  # few words in a long opening: read the whole text
        words = _WORD.findall(text.casefold())
        if len(words) > _SMALL_TALK_MAX_WORDS:
            return None
    return tuple(words)
