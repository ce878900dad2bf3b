"""Small text utilities: timestamps, lexical tokens, small talk, memory text formatting."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
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
    "contentless",
    "short_words",
    "WordCounts",
    "words_of",
    "COMMON_SHARE",
    "COMMON_SESSIONS",
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


#: A word is common for a user (says nothing of its own in that user's turns) when at least
#: this share of the user's turns hold it. Fitted on REALTALK dev (shares 1% to 8%; 2% had the
#: best mean coverage over the budgets and `k=5`, and was chosen in 3 of 5 leave-one-chat-out
#: folds; BENCHMARKS.md, "Small talk in any language").
COMMON_SHARE = 0.02
#: ... and when it was said in at least this many sessions: the topic of a session or two is
#: said in many of its turns ("a lovely bar in Miami"), small talk in session after session.
#: On REALTALK's first 60 / 100 / 200 turns, 0 / 0 / 2 evidence turns pass for small talk with
#: 3 sessions, 0 / 2 / 3 with 2, 1 / 2 / 6 with 3 turns instead (BENCHMARKS.md). A new user's
#: turns are small talk only from their third session on.
COMMON_SESSIONS = 3
_SMALL_TALK_MAX_WORDS = 12
_SMALL_TALK_CHARS = 240  # holds more than 12 words of small talk (they are short)


def words_of(text: str) -> frozenset[str]:
    """The distinct case-folded words of a text (letters and digits; any script).

    Example:
        >>> sorted(words_of("Mon chat s'appelle Miso, MISO!"))
        ['appelle', 'chat', 'miso', 'mon', 's']
    """
    return frozenset(_WORD.findall(text.casefold()))


class WordCounts:
    """How many of a user's turns and sessions hold each word: what tells small talk.

    Small talk (thanks, greetings, acknowledgements) is what a person says again and again: a
    short turn of at most 12 words is *contentless* when every word of it is common for the
    user, i.e. held by at least `COMMON_SHARE` of the user's turns and said in at least
    `COMMON_SESSIONS` of the user's sessions. One rarer word (a name, a place, "peanuts")
    makes it content. No word list is used, so it works in any language: "Tusen takk!" is
    small talk for a user who often thanks in Norwegian. A turn made of no word at all ("?",
    an emoji) is small talk for everyone.

    Args:
        sessions: The user's turns, one iterable of texts per session.

    Example:
        >>> chat = [["Hi!", "Thanks!"], ["Hi!", "Got it, thanks."], ["Hi!", "Got it!"]]
        >>> counts = WordCounts([*chat, ["Thanks, got it!", "I'm allergic to peanuts."]])
        >>> counts.contentless("Got it, thanks!"), counts.contentless("I'm allergic to peanuts.")
        (True, False)
        >>> WordCounts([["Thanks!"] * 9]).contentless("Thanks!")  # one session cannot tell
        False
    """

    __slots__ = ("turns_holding", "sessions_holding", "turns", "_common")

    def __init__(self, sessions: Iterable[Iterable[str]] = ()) -> None:
        self.turns_holding: Counter[str] = Counter()
        self.sessions_holding: Counter[str] = Counter()
        self.turns = 0
        self._common: dict[str, bool] = {}  # `common` of the words asked, until counts change
        for texts in sessions:
            self.add(texts)

    def add(self, texts: Iterable[str], sign: int = 1) -> None:
        """Count the turns of one more session (`sign=-1`: one session fewer)."""
        self._common = {}
        said: set[str] = set()
        n = 0
        for text in texts:
            words = words_of(text)
            said.update(words)
            if sign > 0:
                self.turns_holding.update(words)
            else:
                self.turns_holding.subtract(words)
            n += 1
        if sign > 0:
            self.sessions_holding.update(said)
        else:
            self.sessions_holding.subtract(said)
        self.turns += n if sign > 0 else -n

    def copy(self) -> WordCounts:
        """An independent copy."""
        out = WordCounts()
        out.turns_holding = self.turns_holding.copy()
        out.sessions_holding = self.sessions_holding.copy()
        out.turns = self.turns
        return out

    def common(self, word: str) -> bool:
        """Whether `word` is common in the user's turns (see the class)."""
        return (
            self.turns_holding[word] >= COMMON_SHARE * self.turns
            and self.sessions_holding[word] >= COMMON_SESSIONS
        )

    def contentless(self, text: str) -> bool:
        """Whether a turn carries no content of its own for this user (see the class)."""
        words = short_words(text)
        return words is not None and self.all_common(words)

    def all_common(self, words: Iterable[str]) -> bool:
        """Whether every one of `words` (case-folded) is common for the user.

        `contentless` of a text whose `short_words` are known: a caller that keeps a turn's
        words decides again, as counts change, without reading its text.
        """
        least, most = COMMON_SHARE * self.turns, COMMON_SESSIONS
        turns, sessions = self.turns_holding.get, self.sessions_holding.get
        known = self._common
        for w in words:  # stops at the first uncommon word
            common = known.get(w)
            if common is None:
                common = known[w] = turns(w, 0) >= least and sessions(w, 0) >= most
            if not common:
                return False
        return True


def short_words(text: str) -> tuple[str, ...] | None:
    """The case-folded words of a text of at most 12 words; None for a longer text.

    Only such a text can be small talk (`WordCounts.contentless`). A long text is told in
    its opening: 13 words fit in 240 characters.

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


def contentless(text: str, counts: WordCounts) -> bool:
    """Whether a turn carries no content of its own: an acknowledgement, greeting or thanks.

    Such a turn never answers a question alone; a passage may still show it beside the turns
    it follows. What counts as small talk is learnt from the user's own turns (`WordCounts`),
    so it works in any language and needs no word list.

    Args:
        text: The turn.
        counts: The user's `WordCounts`.

    Example:
        >>> said = [["Hei!", "Tusen takk!"], ["Hei!", "Tusen takk."], ["Tusen takk, hei!"]]
        >>> counts = WordCounts([*said, ["Hei!", "Jeg bor i Oslo."]])
        >>> contentless("Tusen takk!", counts), contentless("Jeg bor i Oslo.", counts)
        (True, False)
        >>> contentless("🙂 !", WordCounts())
        True
    """
    return counts.contentless(text)
