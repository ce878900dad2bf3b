"""Time frames of questions: the period a question is anchored in, resolved against a date.

"Which book did I finish a week ago?" asks about the days around `now - 7 days`; "What did Kate
make on 29 Dec 2023?" about one day. `time_frame` finds such an expression and turns it into a
window of whole days `[start, end)` in `now`'s time zone, given in UTC. Present-tense cues ("now",
"these days", "recently") are not frames, nor are durations and habits ("for two weeks", "every
Monday"), and a month needs a preposition, a day or a year ("May I ask" is no month).

Vague expressions get slack that grows with their unit: "N days ago" ±1 day, "N weeks ago"
±3 days, "N months ago" ±15 days, "N years ago" ±183 days. Seasons are meteorological and of the
northern hemisphere (winter is December to February; "winter 2021" is the one ending in 2021).
"early/mid/late May" are days 1-10, 11-20 and 21 to the end; "early/mid/late 2023" are its
months 1-4, 5-8 and 9-12; "the first week of May" is May 1-7, "the last week" its last 7 days.
When several expressions appear, the shortest window wins (an expression inside a longer one,
"2024" in "the first week of 2024", does not count on its own).

These rules read English. A question in another language of `languages` in which they find
nothing is read through dateparser's locale data (`retrieval.time_words.dates_named`): "vor
zwei Wochen", "hace dos semanas" and "for to uker siden" are spans back from `now` with the
slack above, "letzte Woche", "i fjor" and "en mars" calendar units, as their English
counterparts are.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from reflective_memory.retrieval.time_words import ENGLISH, NamedDate, dates_named

__all__ = ["TimeFrame", "time_frame"]

Window = tuple[date, date]
_ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class TimeFrame:
    """A period a question asks about.

    Attributes:
        start: First instant of the period (inclusive), timezone-aware UTC.
        end: First instant after the period (exclusive), timezone-aware UTC.
        phrase: The matched text, as written in the question (with its preposition; in
            a language other than English, with number words written as digits).
    """

    start: datetime
    end: datetime
    phrase: str


_WORDS = "one two three four five six seven eight nine ten eleven twelve".split()
_NUM = r"(?:(?:a\s+)?couple(?:\s+of)?|(?:a\s+)?few|several|an?|" + "|".join(_WORDS) + r"|\d{1,3})"
_UNIT = r"(?P<u>day|week|month|year)s?"
_YEAR = r"(?:19|20)\d\d(?!\d)"
_MONTH = (
    r"\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may(?!\s+(?:be|not)\b)|june?|july?|"
    r"aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\b\.?"
)
_FULL_MONTHS = {name.lower() for name in calendar.month_name if name}
_MONTH_KEYS = [name[:3].lower() for name in calendar.month_name[1:]]
_WEEKDAYS = [name.lower() for name in calendar.day_name]
_WEEKDAY = r"(?P<wd>" + "|".join(_WEEKDAYS) + r")\b"
_MONTH_YEAR = rf"(?P<m>{_MONTH})(?:,?\s+(?P<y>{_YEAR}))?"
#: Months joined by "and", "to", ...: a listed month after the first is never "may I/be/...".
_MONTH_LIST = (
    rf"(?P<m>{_MONTH}(?:\s*(?:,|and|or|to|through|-|–)\s*"
    + _MONTH.replace("be|not", "i|we|you|he|she|they|it|be|not")
    + rf")*)(?!['’])(?:,?\s+(?P<y>{_YEAR}))?"
)
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_SLACK_DAYS = {"day": 1, "week": 3, "month": 15, "year": 183}


def _number(text: str) -> int:
    word = " ".join(text.lower().split()).removeprefix("a ").removesuffix(" of")
    vague = {"a": 1, "an": 1, "couple": 2, "few": 3, "several": 3}
    return int(word) if word.isdigit() else vague.get(word) or _WORDS.index(word) + 1


def _add_months(d: date, months: int) -> date:
    year, month = divmod(d.month - 1 + months, 12)
    year += d.year
    return date(year, month + 1, min(d.day, calendar.monthrange(year, month + 1)[1]))


def _back(today: date, n: int, unit: str) -> date:
    if unit in ("day", "week"):
        return today - timedelta(days=n * (7 if unit == "week" else 1))
    return _add_months(today, -n * (12 if unit == "year" else 1))


def _day(d: date) -> Window:
    return d, d + _ONE_DAY


def _month_number(text: str) -> int:
    return int(text) if text.isdigit() else _MONTH_KEYS.index(text.casefold()[:3]) + 1  # "Dec."


def _month(name: str, year: str | None, today: date) -> Window:
    """A named month: of `year`, else the latest one begun by `today`."""
    month = _month_number(name)
    start = date(int(year) if year else today.year - (month > today.month), month, 1)
    return start, _add_months(start, 1)


def _year(year: str) -> Window:
    return date(int(year), 1, 1), date(int(year) + 1, 1, 1)


def _relative_day(m: re.Match[str], today: date) -> Window:
    word = " ".join(m["w"].lower().split())
    offset = 2 if word.startswith("the day") else 1 if word in ("yesterday", "last night") else 0
    return _day(today - timedelta(days=offset))


def _ago(m: re.Match[str], today: date) -> Window:
    """Days around `now - N units`; "the Wednesday two months ago" is the Wednesday nearest."""
    anchor = _back(today, _number(m["n"]), m["u"].lower())
    if m["wd"]:
        shift = (_WEEKDAYS.index(m["wd"].lower()) - anchor.weekday() + 3) % 7 - 3
        return _day(anchor + timedelta(days=shift))
    slack = timedelta(days=_SLACK_DAYS[m["u"].casefold()])
    return anchor - slack, anchor + _ONE_DAY + slack


def _weekday(m: re.Match[str], today: date) -> Window:
    wd = _WEEKDAYS.index(m["wd"].lower())
    if m["rel"].lower() == "next":
        return _day(today + timedelta(days=(wd - today.weekday() - 1) % 7 + 1))
    return _day(today - timedelta(days=(today.weekday() - wd - 1) % 7 + 1))


def _rolling(m: re.Match[str], today: date) -> Window | None:
    """A span back from today, up to and including it ("the past few weeks", "past 3 days")."""
    if m["n"] is None and m["the"] is None and m["rel"].lower() == "last":
        return None  # "last week" is the calendar week
    return _back(today, _number(m["n"] or "1"), m["u"].lower()), today + _ONE_DAY


def _calendar(m: re.Match[str], today: date) -> Window:
    step = {"last": -1, "past": -1, "this": 0, "next": 1}[m["rel"].lower().split()[-1]]
    unit = m["u"].lower()
    if unit.startswith("week"):
        monday = today - timedelta(days=today.weekday() - 7 * step)
        return monday + timedelta(days=5 * (unit == "weekend")), monday + timedelta(days=7)
    if unit == "month":
        start = _add_months(today.replace(day=1), step)
        return start, _add_months(start, 1)
    return _year(str(today.year + step))


def _season(m: re.Match[str], today: date) -> Window | None:
    first = _SEASONS[m["s"].casefold()]

    def occurrence(year: int) -> Window:
        return date(year, first, 1), _add_months(date(year, first, 1), 3)

    if m["y"]:  # "winter 2021" ends in 2021, "winter 2021-2022" begins in 2021
        return occurrence(int(m["y"]) - (first == 12 and not m["y2"]))
    rel = (m["rel"] or "").lower()
    if not rel and not m["pre"]:
        return None
    options = [occurrence(year) for year in range(today.year - 2, today.year + 2)]
    if rel in ("last", "past"):
        return max(w for w in options if w[1] <= today)
    if rel == "next":
        return min(w for w in options if w[0] > today)
    if rel == "this":
        return min(options, key=lambda w: abs((w[0] - today) + (w[1] - today)))  # the nearest
    return max(w for w in options if w[0] <= today)


def _new_year(m: re.Match[str], today: date) -> Window:
    """December 31 and January 1 around the named (else the nearest) New Year."""
    year = int(m["y"]) + bool(m["eve"]) if m["y"] else today.year + (today.month > 6)
    jan1 = date(year, 1, 1)
    return jan1 - _ONE_DAY, jan1 + _ONE_DAY


def _exact_day(m: re.Match[str], today: date) -> Window | None:
    """A date; without a year the latest such day not after `today`."""
    month, day = _month_number(m["m"]), int(m["d"])
    if m["y"]:
        return _day(date(int(m["y"]), month, day))
    for year in range(today.year, today.year - 8, -1):
        if day <= calendar.monthrange(year, month)[1] and date(year, month, day) <= today:
            return _day(date(year, month, day))
    return None


def _months(m: re.Match[str], today: date) -> Window | None:
    """Named months ("in May", "December 2023"); "in January and March" spans January-March."""
    names = [name.rstrip(".") for name in re.findall(_MONTH, m["m"], re.IGNORECASE)]
    abbreviated = not _FULL_MONTHS.issuperset(name.lower() for name in names)
    if not m["y"] and (not m["pre"] or abbreviated and m["pre"].lower() in ("by", "of", "from")):
        return None  # "May I ask", "a gift from Jan": a bare month is no frame
    windows = [_month(names[-1], m["y"], today)]
    for name in reversed(names[:-1]):  # each the latest begun by the month listed after it
        windows.append(_month(name, None, windows[-1][0]))
    return windows[-1][0], windows[0][1]


def _part(m: re.Match[str], today: date) -> Window:
    i = ("early", "mid", "late").index(m["part"].lower())
    if m["yr"]:
        start = date(int(m["yr"]), 1 + 4 * i, 1)
        return start, _add_months(start, 4)
    start, end = _month(m["m"], m["y"], today)
    return start + timedelta(days=10 * i), end if i == 2 else start + timedelta(days=10 * i + 10)


def _week_of(m: re.Match[str], today: date) -> Window:
    start, end = _year(m["yr"]) if m["yr"] else _month(m["m"], m["y"], today)
    nth = ("first", "second", "third", "fourth", "last").index(m["nth"].lower())
    first = end - 7 * _ONE_DAY if nth == 4 else start + 7 * nth * _ONE_DAY
    return first, first + 7 * _ONE_DAY


#: Resolvers take a match and today's date and give a window of dates, or None (no frame).
_Resolver = Callable[[re.Match[str], date], "Window | None"]
_ON = r"(?:\bon\s+)?(?:the\s+)?"
_IN = r"(?:\b(?:in|on|at|for|over|during|within|around)\s+)?"
_UNITS = ("day", "week", "month", "year")
_MONTH_STEMS = tuple(_MONTH_KEYS)
#: What every match of a rule holds, case aside: per group, one of its words or a match of its
#: pattern of digits. A text lacking a group is not searched with the rule: the rules are slow
#: on long texts (milliseconds for a long turn), and most texts name no time.
_Needs = tuple[tuple[str, ...] | str, ...]
#: The rules: a pattern, its resolver, and what its matches need (`_Needs`).
_PATTERNS: list[tuple[str, _Resolver, _Needs]] = [
    (
        r"\b(?P<w>the\s+day\s+before\s+yesterday|yesterday|today|tonight|last\s+night|"
        r"this\s+(?:morning|afternoon|evening))\b",
        _relative_day,
        (("yesterday", "today", "night", "morning", "afternoon", "evening"),),
    ),
    (
        rf"(?:(?:\bon\s+)?\b(?:the|that)\s+{_WEEKDAY}\s+)?\b(?P<n>{_NUM})\s+{_UNIT}\s+ago\b",
        _ago,
        (("ago",), _UNITS),
    ),
    (
        rf"\b(?P<rel>on|last|this\s+past|past|next)\s+(?:the\s+)?{_WEEKDAY}(?!s)",
        _weekday,
        (tuple(_WEEKDAYS), ("on", "last", "past", "next")),
    ),
    (
        rf"(?:\b(?:in|over|during|within|for)\s+)?(?P<the>the\s+)?\b(?P<rel>last|past)\s+"
        rf"(?:(?P<n>{_NUM})\s+)?{_UNIT}\b",
        _rolling,
        (("last", "past"), _UNITS),
    ),
    (
        rf"{_IN}\b(?P<rel>last|this\s+past|this|next)\s+(?P<u>weekend|week|month|year)\b",
        _calendar,
        (("last", "this", "next"), _UNITS),
    ),
    (
        r"(?:\b(?P<pre>in|during|over|since|by|of|throughout)\s+)?(?:the\s+)?"
        r"(?:(?P<rel>last|this|next|past)\s+)?\b(?P<s>spring|summer|autumn|fall|winter)\b"
        rf"(?:\s+(?:of\s+)?(?P<y>{_YEAR})(?:\s*[-–/]\s*(?P<y2>{_YEAR}))?)?"
        r"(?!\s+(?:break|camp|semester|term|vacation|holidays?|sale|school|job|clothes|"
        r"asleep|ill|sick|down|over|off|apart|behind|for)\b)",
        _season,
        (tuple(_SEASONS),),
    ),
    (
        rf"{_IN}(?:the\s+)?\bnew\s+year(?!['’]?s?\s+resol)(?:['’]?s)?(?P<eve>\s+eve)?"
        rf"(?:\s+(?:of\s+)?(?P<y>{_YEAR}))?",
        _new_year,
        (("new",), ("year",)),
    ),
    (
        rf"{_ON}\b(?P<y>{_YEAR})[-/](?P<m>\d\d?)[-/](?P<d>\d\d?)\b",
        _exact_day,
        (r"(?:19|20)\d\d[-/]",),
    ),
    (rf"{_ON}\b(?P<d>\d\d?)\.(?P<m>\d\d?)\.(?P<y>{_YEAR})", _exact_day, (r"\d\.\d",)),
    (
        rf"{_ON}\b(?P<d>\d\d?)(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_YEAR}",
        _exact_day,
        (_MONTH_STEMS, r"\d"),
    ),
    (
        rf"{_ON}(?P<m>{_MONTH})\s+(?:the\s+)?(?P<d>\d\d?)(?:st|nd|rd|th)?\b(?!:)"
        rf"(?:,?\s+(?P<y>{_YEAR}))?",
        _exact_day,
        (_MONTH_STEMS, r"\d"),
    ),
    (
        r"(?:\b(?P<pre>in|during|since|by|of|between|from|throughout|until|till)\s+"
        rf"(?:the\s+month\s+of\s+)?)?{_MONTH_LIST}",
        _months,
        (_MONTH_STEMS,),
    ),
    (
        rf"{_IN}\b(?P<part>early|mid|late)(?:\s+|-)(?:{_MONTH_YEAR}|(?P<yr>{_YEAR}))",
        _part,
        (("early", "mid", "late"),),
    ),
    (
        rf"{_IN}(?:the\s+)?\b(?P<nth>first|second|third|fourth|last)\s+week\s+of\s+"
        rf"(?:{_MONTH_YEAR}|(?P<yr>{_YEAR}))",
        _week_of,
        (("week",), ("first", "second", "third", "fourth", "last")),
    ),
    (
        rf"(?:\b(?:in|during|of|since|by|from|throughout)\s+(?:the\s+year\s+)?|\bthe\s+year\s+)"
        rf"(?P<yr>{_YEAR})",
        lambda m, today: _year(m["yr"]),
        (_YEAR,),
    ),
]
_RULES = [
    (re.compile(pattern, re.IGNORECASE), resolve, needs) for pattern, resolve, needs in _PATTERNS
]
#: A month's name as `_MONTH` finds it: its stem at the start of a word (in a lower-cased
#: ASCII text, where `\b` reads as in the text).
_MONTH_START = re.compile(r"\b(?:" + "|".join(_MONTH_STEMS) + ")")
_DIGITS = {g: re.compile(g) for *_, needs in _PATTERNS for g in needs if isinstance(g, str)}
#: The only characters besides their own two cases that `re.IGNORECASE` matches to ASCII
#: letters (found by trying every code point).
_TO_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})


def _rules_for(text: str) -> list[tuple[re.Pattern[str], _Resolver]]:
    """The rules of `_RULES` whose needs `text` holds: the only ones that can match.

    The words are looked for in the text lower-cased, with the few characters that
    `re.IGNORECASE` also reads as ASCII letters mapped to them: a word is found there exactly
    when the rules' case-insensitive matching would find it.
    """
    ascii_ = text.isascii()
    low = text.lower() if ascii_ else text.translate(_TO_ASCII).lower()

    known: dict[tuple[str, ...] | str, bool] = {}  # rules share groups

    def holds(group: tuple[str, ...] | str) -> bool:
        got = known.get(group)
        if got is None:
            if isinstance(group, str):
                got = _DIGITS[group].search(text) is not None
            elif group is _MONTH_STEMS and ascii_:
                got = _MONTH_START.search(low) is not None
            else:
                got = any(word in low for word in group)
            known[group] = got
        return got

    return [(rule, resolve) for rule, resolve, needs in _RULES if all(map(holds, needs))]


def _named(named: NamedDate) -> Window:
    """The days of a date named in another language (`time_words.NamedDate`)."""
    d = named.day
    if not named.calendar:  # a span back from now, with the slack of its unit
        slack = timedelta(days=_SLACK_DAYS[named.period])
        return d - slack, d + _ONE_DAY + slack
    if named.period == "week":
        monday = d - timedelta(days=d.weekday())
        return monday, monday + 7 * _ONE_DAY
    if named.period == "month":
        return d.replace(day=1), _add_months(d.replace(day=1), 1)
    if named.period == "year":
        return _year(str(d.year))
    return _day(d)


def time_frame(
    query: str, now: datetime, languages: Sequence[str] = (ENGLISH,)
) -> TimeFrame | None:
    """The period `query` asks about, resolved against `now` (naive `now` = UTC), or None.

    Days are those of `now`'s time zone; the window is returned in UTC.

    Args:
        query: The question.
        now: When it is asked.
        languages: The languages it is read in (`PassageConfig.languages`): English by this
            module's rules (when `en` is listed), the others, when those find nothing,
            through dateparser (`time_words.dates_named`).

    Returns:
        The most specific (shortest) period the question names, or None when it names none.

    Example:
        >>> frame = time_frame("Which book did I finish a week ago?", datetime(2023, 2, 7, 9, 9))
        >>> frame.start.date().isoformat(), frame.end.date().isoformat(), frame.phrase
        ('2023-01-28', '2023-02-04', 'a week ago')
        >>> time_frame("Where do I live now?", datetime(2023, 2, 7)) is None
        True
        >>> frame = time_frame("Was habe ich vor zwei Wochen gemacht?", datetime(2024, 6, 15),
        ...                    ("en", "de"))
        >>> frame.start.date().isoformat(), frame.end.date().isoformat(), frame.phrase
        ('2024-05-29', '2024-06-05', 'vor 2 Wochen')
    """
    local = now if now.tzinfo is not None else now.replace(tzinfo=timezone.utc)
    today = local.date()
    found: list[tuple[tuple[int, int], Window]] = []
    for pattern, resolve in _rules_for(query) if ENGLISH in languages else ():
        for m in pattern.finditer(query):
            try:
                window = resolve(m, today)
            except (ValueError, OverflowError):  # 31 February, year 10000
                window = None
            if window is not None:
                found.append((m.span(), window))
    # (window, where it starts, phrase)
    kept = [
        (window, span[0], query[span[0] : span[1]])
        for span, window in found
        if not any(o != span and o[0] <= span[0] and span[1] <= o[1] for o, _ in found)
    ]
    if not kept and any(code != ENGLISH for code in languages):
        named = dates_named(query, local, languages)
        kept = [(_named(d), i, d.phrase) for i, d in enumerate(named)]
    if not kept:
        return None
    window, _, phrase = min(kept, key=lambda f: (f[0][1] - f[0][0], f[1]))
    start, end = (
        datetime.combine(d, time(), local.tzinfo).astimezone(timezone.utc) for d in window
    )
    return TimeFrame(start, end, phrase)
