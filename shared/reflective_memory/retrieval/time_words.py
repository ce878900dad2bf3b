"""Time words beyond English, read from `dateparser`'s locale data: "now", and named dates.

English questions are read by this package's own rules (`retrieval.cues`,
`retrieval.timeframe`); the other languages of `PassageConfig.languages` through the locale
data `dateparser` ships (CLDR's names of months, weekdays and units, its relative phrases such
as "i fjor" or "la semana pasada", and its phrase for "now"), with number words from
`num2words` where a locale's data has none ("hace dos semanas"):

- `now_spans`: where a question says "now" in one of the languages: its locale's phrase for
  zero seconds ago ("jetzt", "maintenant", "ahora", "nå");
- `dates_named`: the dates a question names in one of them ("vor zwei Wochen", "i fjor",
  "en mars"), each with its period (day, week, month or year) and whether it is a calendar
  unit ("letzte Woche", "i fjor", "im März") or a span back from now ("vor zwei Wochen").

A language's *time phrases* are its locale's full month and weekday names, its words for day,
week, month and year (of two letters or more: a lone letter is an abbreviation), and its
relative phrases of those units; "now" phrases are kept apart. A unit or relative phrase
made only of words that English's locale data also holds ("an") is left out, and a language
is read only when the question holds more words of its locale data than of English's: "im
August" is German, "What did August say about Mars?" stays English. dateparser parses a
question only when it holds one of its languages' time phrases, and only the stretches of up
to `MAX_WORDS` words around one: a date must hold such a phrase, so "die" (an abbreviation of
"Dienstag") or "to" (Norwegian for two) alone is no date.

Importing this module loads neither dateparser nor num2words: dateparser's locale data is read
at the first question asked with a language other than English (about 50 ms, once per list of
languages), num2words at the first date parsed in a language.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from reflective_memory.errors import ConfigError
from reflective_memory.settings import check_names
from reflective_memory.validation import json_strings

__all__ = [
    "ENGLISH",
    "MAX_WORDS",
    "PERIODS",
    "NamedDate",
    "check_languages",
    "dates_named",
    "known_languages",
    "now_spans",
]

#: The language read by this package's own rules, not through dateparser.
ENGLISH = "en"
#: Longest stretch of words parsed as one date ("il y a deux semaines").
MAX_WORDS = 5
#: The periods a named date may have; dateparser's units of the same names.
PERIODS = ("day", "week", "month", "year")
#: Largest number written in words that is read as digits before a unit.
_MAX_NUMBER_WORD = 31
_WORD = re.compile(r"[^\W_]+")
_SPAN = re.compile(r"\S+")
#: Punctuation around a stretch of words that is no part of a date.
_EDGE = " \t\n?!.,;:¿¡\"'«»()[]{}"
#: How dateparser translates a span back from now or ahead of it ("2 week ago", "in 3 day").
_RELATIVE = re.compile(r"\b\d+ (?:day|week|month|year)s? ago\b|\bin \d+ (?:day|week|month|year)")
#: A relative phrase of a period ("1 year ago": "i fjor"), as dateparser's locale data keys it.
_RELATIVE_KEY = re.compile(r"^(?:in )?\d+ (?:day|week|month|year)(?: ago)?$")
_NOW_KEY = "0 second ago"


@dataclass(frozen=True)
class NamedDate:
    """A date a question names in one of the configured languages.

    Attributes:
        phrase: The words that name it (number words written as digits).
        day: A day of the period, in the time zone of the `now` it was resolved against.
        period: `day`, `week`, `month` or `year`.
        calendar: The period is the calendar unit holding `day` ("letzte Woche", "im März");
            False: a span back from now, `day` being `now` less the span ("vor zwei Wochen").
        language: The language code it was read in.
    """

    phrase: str
    day: date
    period: str
    calendar: bool
    language: str


@cache
def known_languages() -> frozenset[str]:
    """The language codes dateparser has locale data for, and `en`.

    Read from the names of dateparser's data files, without importing it (the settings are
    checked at construction, which must stay light).

    Raises:
        ConfigError: dateparser is not installed.
    """
    spec = importlib.util.find_spec("dateparser")
    if spec is None or spec.origin is None:
        raise ConfigError("passages.languages needs dateparser: pip install dateparser")
    folder = Path(spec.origin).parent / "data" / "date_translation_data"
    return frozenset(p.stem for p in folder.glob("*.py") if p.stem != "__init__") | {ENGLISH}


def check_languages(name: str, value: Any) -> tuple[str, ...]:
    """`value` as a tuple of distinct language codes dateparser knows (`en` always).

    Raises:
        ConfigError: Not a sequence of distinct codes, or a code dateparser has no data for
            (named in the message).
    """
    codes = check_names(name, value)
    unknown = [c for c in codes if c not in known_languages()]
    if unknown:
        raise ConfigError(
            f"{name}: unknown language code(s) {unknown}: use codes dateparser has locale "
            "data for, such as 'de', 'fr', 'es', 'nb' (Norwegian Bokmål), 'pt-BR'"
        )
    return codes


def _tokens(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


@dataclass(frozen=True)
class _Phrase:
    words: tuple[str, ...]
    language: str
    kind: str  # "now", "relative" (a relative phrase: a calendar unit), "name"


@dataclass(frozen=True)
class _Hit:
    start: int  # character offsets in the text
    end: int
    phrase: _Phrase


def _locale(code: str) -> Any:
    from dateparser.languages.loader import default_loader

    return default_loader.get_locale(code)


@cache
def _words(code: str) -> frozenset[str]:
    """Every word of a language's locale data (names, units, relative phrases, skip words)."""
    return frozenset(w for s in json_strings(_locale(code).info) for w in _tokens(s))


def _phrases(code: str) -> list[_Phrase]:
    """A language's "now" and time phrases (see the module), from its locale data."""
    from dateparser.languages.dictionary import KNOWN_WORD_TOKENS

    info = _locale(code).info
    english = _words(ENGLISH)
    names = KNOWN_WORD_TOKENS[: KNOWN_WORD_TOKENS.index("century")]  # weekdays and months
    found: list[tuple[str, str, bool]] = []  # (phrase, kind, kept though English has it)
    for key in names:
        forms = [f for f in info.get(key, ()) if isinstance(f, str)]
        longest = max((len(f) for f in forms), default=0)
        found += [(f, "name", True) for f in forms if len(f) == longest]
    for key in PERIODS:
        found += [
            (f, "name", False) for f in info.get(key, ()) if isinstance(f, str) and len(f) > 1
        ]
    for key, forms in info.get("relative-type", {}).items():
        kind = "now" if key == _NOW_KEY else "relative" if _RELATIVE_KEY.match(key) else None
        if kind is not None:
            found += [(f, kind, False) for f in forms]
    out: dict[tuple[str, ...], _Phrase] = {}
    for form, kind, shared in found:
        words = tuple(_tokens(form))
        if words and (shared or not english.issuperset(words)) and words not in out:
            out[words] = _Phrase(words, code, kind)
    return list(out.values())


@lru_cache(maxsize=16)
def _vocabulary(languages: tuple[str, ...]) -> dict[str, tuple[_Phrase, ...]]:
    """The phrases of `languages` (English aside), by their first word."""
    first: dict[str, list[_Phrase]] = {}
    for code in languages:
        if code != ENGLISH:
            for phrase in _phrases(code):
                first.setdefault(phrase.words[0], []).append(phrase)
    return {w: tuple(sorted(ps, key=lambda p: -len(p.words))) for w, ps in first.items()}


@lru_cache(maxsize=512)
def _hits(text: str, languages: tuple[str, ...]) -> tuple[_Hit, ...]:
    """The phrases of `languages` in `text`, longest first where several start at a word."""
    if all(code == ENGLISH for code in languages):
        return ()
    vocabulary = _vocabulary(languages)
    if vocabulary.keys().isdisjoint(_WORD.findall(text.lower())):
        return ()  # most questions: no word starts a phrase
    spans = [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]
    words = [w for *_, w in spans]
    out = []
    for i, word in enumerate(words):
        for phrase in vocabulary.get(word, ()):
            n = len(phrase.words)
            if n == 1 or tuple(words[i : i + n]) == phrase.words:
                out.append(_Hit(spans[i][0], spans[i + n - 1][1], phrase))
    return tuple(out)


@lru_cache(maxsize=512)
def _read_in(text: str, languages: tuple[str, ...]) -> tuple[str, ...]:
    """The languages (English aside) whose time phrases `text` holds, the likeliest first.

    A language is likelier the more of the text's words its locale data holds (ties: the
    order of `languages`); one whose data holds no more of them than English's does (when
    English is among `languages`) is not read: "What did I read about Mars?" stays English.
    """
    hit = {h.phrase.language for h in _hits(text, languages)}
    if not hit:
        return ()
    found = [code for code in languages if code in hit]
    words = set(_tokens(text))
    floor = len(words & _words(ENGLISH)) if ENGLISH in languages else 0
    score = {code: len(words & _words(code)) for code in found}
    ranked = sorted(found, key=lambda code: -score[code])  # stable: ties keep their order
    return tuple(code for code in ranked if score[code] > floor)


def now_spans(text: str, languages: Sequence[str]) -> list[tuple[int, int]]:
    """Where `text` says "now" in one of `languages` (English aside), as character spans.

    Example:
        >>> now_spans("Hvor bor jeg nå?", ("en", "nb"))
        [(13, 15)]
        >>> now_spans("Where do I live now?", ("en", "nb"))
        []
    """
    codes = tuple(languages)
    read = _read_in(text, codes)
    spans = sorted(
        {
            (h.start, h.end)
            for h in _hits(text, codes)
            if h.phrase.kind == "now" and h.phrase.language in read
        }
    )
    out: list[tuple[int, int]] = []
    for start, end in spans:  # one span per place ("nu" is Dutch, Swedish and Danish)
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


@lru_cache(maxsize=64)
def _number_words(code: str) -> tuple[re.Pattern[str], dict[str, str]] | None:
    """A pattern finding a number word before a unit word of `code`, and each word's digits.

    The words are num2words' (1 to `_MAX_NUMBER_WORD`) for the language, where it has it;
    dateparser's own data reads the rest (and some languages' number words).
    """
    from num2words import CONVERTER_CLASSES, num2words

    lang = code if code in CONVERTER_CLASSES else code.split("-")[0]
    if lang not in CONVERTER_CLASSES:
        return None
    digits: dict[str, str] = {}
    for n in range(1, _MAX_NUMBER_WORD + 1):
        word = num2words(n, lang=lang).strip().lower()
        if _WORD.fullmatch(word):
            digits.setdefault(word, str(n))
    info = _locale(code).info
    units = {f.lower() for key in PERIODS for f in info.get(key, ()) if isinstance(f, str)}
    if not digits or not units:
        return None
    alternation = "|".join(re.escape(w) for w in sorted(digits, key=len, reverse=True))
    after = "|".join(re.escape(u) for u in sorted(units, key=len, reverse=True))
    pattern = re.compile(rf"(?<!\w)({alternation})(?=\s+(?:{after})(?!\w))", re.IGNORECASE)
    return pattern, digits


def _with_digits(text: str, code: str) -> str:
    """`text` with the number words before a unit written as digits ("dos semanas": "2 semanas")."""
    found = _number_words(code)
    if found is None:
        return text
    pattern, digits = found
    return pattern.sub(lambda m: digits[m.group(1).lower()], text)


def _stretches(text: str, hit: _Hit) -> list[tuple[int, int]]:
    """Character spans of the runs of up to `MAX_WORDS` words holding `hit`, longest first."""
    words = []
    for m in _SPAN.finditer(text):  # a word the hit starts inside ("l'anno") is cut there
        cut = m.start() < hit.start < m.end()
        words += [(m.start(), hit.start), (hit.start, m.end())] if cut else [m.span()]
    first = next(i for i, (_, e) in enumerate(words) if e > hit.start)
    last = next(i for i in range(len(words) - 1, -1, -1) if words[i][0] < hit.end)
    runs = [
        (a, b)
        for a in range(max(0, last - MAX_WORDS + 1), first + 1)
        for b in range(last, min(len(words), a + MAX_WORDS))
    ]
    runs.sort(key=lambda r: (r[0] - r[1], r[0]))
    return [(words[a][0], words[b][1]) for a, b in runs]


def dates_named(text: str, now: datetime, languages: Sequence[str]) -> list[NamedDate]:
    """The dates `text` names in `languages` (English aside), resolved against `now`.

    Args:
        text: The question.
        now: When it is asked (its own time zone's days; the date is taken as written there).
        languages: Language codes (`PassageConfig.languages`).

    Returns:
        One date per time phrase that dateparser reads as one, in text order, in the
        likeliest language that reads any; empty when the text holds no time phrase of the
        languages (dateparser is then not called).

    Example:
        >>> got = dates_named("Was habe ich vor zwei Wochen gemacht?", datetime(2024, 6, 15),
        ...                   ("en", "de"))
        >>> [(d.phrase, d.day.isoformat(), d.period, d.calendar) for d in got]
        [('vor 2 Wochen', '2024-06-01', 'week', False)]
    """
    codes = tuple(languages)
    for code in _read_in(text, codes):
        if any(h.phrase.language == code and h.phrase.kind != "now" for h in _hits(text, codes)):
            got = _dates_in(_with_digits(text, code), now, code, codes)
            if got:
                return got
    return []


def _dates_in(text: str, now: datetime, code: str, codes: tuple[str, ...]) -> list[NamedDate]:
    """The dates dateparser reads around the time phrases of language `code` in `text`."""
    from dateparser.conf import settings as defaults
    from dateparser.date import DateDataParser

    settings = defaults.replace(
        PREFER_DATES_FROM="past",
        RELATIVE_BASE=now.replace(tzinfo=None),
        PARSERS=["relative-time", "absolute-time"],
    )
    parser = DateDataParser(languages=[code], settings=settings)
    locale = _locale(code)
    hits = [h for h in _hits(text, codes) if h.phrase.language == code]
    out: list[NamedDate] = []
    taken: list[tuple[int, int]] = []
    for hit in hits:
        if hit.phrase.kind == "now" or any(s <= hit.start and hit.end <= e for s, e in taken):
            continue
        for start, end in _stretches(text, hit):
            piece = text[start:end]
            stripped = piece.strip(_EDGE)
            if not stripped:
                continue
            start += len(piece) - len(piece.lstrip(_EDGE))
            end = start + len(stripped)
            try:
                data = parser.get_date_data(stripped)
            except (ValueError, OverflowError):  # a date out of range: its words name none
                break
            if data.date_obj is None or data.period not in PERIODS:
                continue
            relative = any(
                h.phrase.kind == "relative" and start <= h.start and h.end <= end for h in hits
            )
            translated = locale.translate(stripped, settings=settings)
            span = not relative and _RELATIVE.search(translated) is not None  # from now
            out.append(NamedDate(stripped, data.date_obj.date(), data.period, not span, code))
            taken.append((start, end))
            break
    return out
