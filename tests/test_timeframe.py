"""Time frames of questions: which period a question names, resolved against its date."""

from __future__ import annotations

import dataclasses
import doctest
from datetime import date, datetime, timedelta, timezone

import pytest
from reflective_memory.retrieval import timeframe
from reflective_memory.retrieval.timeframe import TimeFrame, time_frame

UTC = timezone.utc


def _utc(day: str) -> datetime:
    return datetime.fromisoformat(day).replace(tzinfo=UTC)


def _check(query: str, now: str, start: str, end: str, phrase: str | None = None) -> None:
    frame = time_frame(query, datetime.fromisoformat(now))
    assert frame is not None, query
    assert (frame.start, frame.end) == (_utc(start), _utc(end)), (query, frame)
    if phrase is not None:
        assert frame.phrase == phrase


# (question, now, start, end, phrase): LongMemEval's temporal questions with their own dates
LONGMEMEVAL = [
    ("Which book did I finish a week ago?", "2023-02-07 09:09", "2023-01-28", "2023-02-04",
     "a week ago"),
    ("What did I do with Rachel on the Wednesday two months ago?", "2023-04-01 16:08",
     "2023-02-01", "2023-02-02", "on the Wednesday two months ago"),
    ("I mentioned an investment for a competition four weeks ago? What did I buy?",
     "2023-04-01 08:30", "2023-03-01", "2023-03-08", "four weeks ago"),
    ("How many hours of jogging and yoga did I do last week?", "2023-05-30 21:24",
     "2023-05-22", "2023-05-29", "last week"),
    ("How many plants did I acquire in the last month?", "2023-05-30 21:51", "2023-04-30",
     "2023-05-31", "in the last month"),
    ("How many babies were born to friends and family members in the last few months?",
     "2023-05-13 23:55", "2023-02-13", "2023-05-14", "in the last few months"),
    ("How many Crash Course videos have I watched in the past few weeks?", "2023-10-05 05:19",
     "2023-09-14", "2023-10-06", "in the past few weeks"),
    ("How many days did I spend participating in faith-related activities in December?",
     "2024-01-10 23:41", "2023-12-01", "2024-01-01", "in December"),
    ("What was the page count of the two novels I finished in January and March?",
     "2023-05-30 19:21", "2023-01-01", "2023-04-01", "in January and March"),
    ("How many different museums or galleries did I visit in the month of February?",
     "2023-03-03 23:25", "2023-02-01", "2023-03-01", "in the month of February"),
    ("What time did I reach the clinic on Monday?", "2023-05-30 22:10", "2023-05-29",
     "2023-05-30", "on Monday"),
    ("How much more miles per gallon was my car getting a few months ago compared to now?",
     "2023-05-30 23:51", "2023-02-13", "2023-03-16", "a few months ago"),
    ("I was thinking about rearranging the furniture in my bedroom this weekend. Any tips?",
     "2023-05-30 23:39", "2023-06-03", "2023-06-05", "this weekend"),
    ("Can you recommend a show or movie for me to watch tonight?", "2023-05-30 23:43",
     "2023-05-30", "2023-05-31", "tonight"),
]  # fmt: skip

# REALTALK's date questions, asked after the last session
REALTALK = [
    ("What kind of pasta did Kate make on 29 Dec 2023?", "2023-12-29", "2023-12-30",
     "on 29 Dec 2023"),
    ("Where was Elise on 31 Dec 2023?", "2023-12-31", "2024-01-01", "on 31 Dec 2023"),
    ("Which place did Elise visit in the first week of 2024?", "2024-01-01", "2024-01-08",
     "in the first week of 2024"),
    ("Where are Kate and Elise planning to celebrate New Year 2025?", "2024-12-31",
     "2025-01-02", "New Year 2025"),
    ("Which country did Elise visit in winter 2021 - 2022?", "2021-12-01", "2022-03-01",
     "in winter 2021 - 2022"),
    ("What happened to Elise in the library on 5 January 2024?", "2024-01-05", "2024-01-06",
     "on 5 January 2024"),
    ("Where does Kate plan to visit in the spring of 2024?", "2024-03-01", "2024-06-01",
     "in the spring of 2024"),
    ("What is Paola planning to do on 10.01.2024 with her friends?", "2024-01-10",
     "2024-01-11", "on 10.01.2024"),
    ("Where is Paola going on the 10th of February 2024?", "2024-02-10", "2024-02-11",
     "on the 10th of February 2024"),
    ("How many times did Nicolas take naps on January 6 2024?", "2024-01-06", "2024-01-07",
     "on January 6 2024"),
    ("What football match did Kevin watch in 2017?", "2017-01-01", "2018-01-01", "in 2017"),
    ("Where is Paola planning to go during spring break of 2024?", "2024-01-01", "2025-01-01",
     "of 2024"),
    ("Did Kevin's New Year's Eve plans come true?", "2023-12-31", "2024-01-02",
     "New Year's Eve"),
    ("Where did Elise celebrate the New Year?", "2023-12-31", "2024-01-02", "the New Year"),
    ("What TV show was Kate watching shortly before 7 Jan 2024?", "2024-01-07", "2024-01-08",
     "7 Jan 2024"),
]  # fmt: skip

# (question, now, start, end): every other form, asked on Wednesday 10 January 2024
FORMS = [
    ("What did I buy yesterday?", "2024-01-09", "2024-01-10"),
    ("What did I cook last night?", "2024-01-09", "2024-01-10"),
    ("Where was I the day before yesterday?", "2024-01-08", "2024-01-09"),
    ("What did I eat this morning?", "2024-01-10", "2024-01-11"),
    ("What did I say today?", "2024-01-10", "2024-01-11"),
    ("What did I read 3 days ago?", "2024-01-06", "2024-01-09"),
    ("Who called a couple of days ago?", "2024-01-07", "2024-01-10"),
    ("Which film did I see two weeks ago?", "2023-12-24", "2023-12-31"),
    ("What did I order a month ago?", "2023-11-25", "2023-12-26"),
    ("Where did I travel a year ago?", "2022-07-11", "2023-07-13"),
    ("What did I do last Wednesday?", "2024-01-03", "2024-01-04"),
    ("What am I doing next Friday?", "2024-01-12", "2024-01-13"),
    ("What did I do this past weekend?", "2024-01-06", "2024-01-08"),
    ("What did I do last weekend?", "2024-01-06", "2024-01-08"),
    ("What is planned for next week?", "2024-01-15", "2024-01-22"),
    ("What have I done this week?", "2024-01-08", "2024-01-15"),
    ("What did I spend this month?", "2024-01-01", "2024-02-01"),
    ("What did I read last year?", "2023-01-01", "2024-01-01"),
    ("What are my goals this year?", "2024-01-01", "2025-01-01"),
    ("What did I read over the past year?", "2023-01-10", "2024-01-11"),
    ("What did I eat in the past 3 days?", "2024-01-07", "2024-01-11"),
    ("Where did I go last summer?", "2023-06-01", "2023-09-01"),
    ("Where did I go last fall?", "2023-09-01", "2023-12-01"),
    ("What did I plant in the summer?", "2023-06-01", "2023-09-01"),
    ("Where will I ski this winter?", "2023-12-01", "2024-03-01"),
    ("Where did I go in summer 2022?", "2022-06-01", "2022-09-01"),
    ("Where did I go in the summer of 2022?", "2022-06-01", "2022-09-01"),
    ("Where did I ski in winter 2021?", "2020-12-01", "2021-03-01"),
    ("What did I buy in May 2023?", "2023-05-01", "2023-06-01"),
    ("What did I buy in May?", "2023-05-01", "2023-06-01"),
    ("What did I buy in Jan?", "2024-01-01", "2024-02-01"),
    ("How much have I saved since March?", "2023-03-01", "2023-04-01"),
    ("What did I read in early May?", "2023-05-01", "2023-05-11"),
    ("What did I read in mid-May 2022?", "2022-05-11", "2022-05-21"),
    ("What did I read in late February 2024?", "2024-02-21", "2024-03-01"),
    ("Where did I live in late 2022?", "2022-09-01", "2023-01-01"),
    ("What did I do on December 29th, 2023?", "2023-12-29", "2023-12-30"),
    ("What did I do on Dec. 29?", "2023-12-29", "2023-12-30"),
    ("What did I do on 2023-12-29?", "2023-12-29", "2023-12-30"),
    ("What did I do on 2023/12/29?", "2023-12-29", "2023-12-30"),
    ("What did I do on 29 Dec?", "2023-12-29", "2023-12-30"),
    ("What did I do on Feb 29?", "2020-02-29", "2020-03-01"),
    ("Where was I on New Year's Eve 2022?", "2022-12-31", "2023-01-02"),
    ("What did I do in the last week of December 2023?", "2023-12-25", "2024-01-01"),
    ("What did I do in the second week of May?", "2023-05-08", "2023-05-15"),
    ("What did I do in the year 2020?", "2020-01-01", "2021-01-01"),
    ("Where was I between November and January?", "2023-11-01", "2024-02-01"),
    ("Which trips did I take in January, February and March?", "2023-01-01", "2023-04-01"),
]


@pytest.mark.parametrize(("query", "now", "start", "end", "phrase"), LONGMEMEVAL)
def test_longmemeval_questions(query: str, now: str, start: str, end: str, phrase: str) -> None:
    _check(query, now, start, end, phrase)


@pytest.mark.parametrize(("query", "start", "end", "phrase"), REALTALK)
def test_realtalk_questions(query: str, start: str, end: str, phrase: str) -> None:
    _check(query, "2024-01-26 18:00", start, end, phrase)


@pytest.mark.parametrize(("query", "start", "end"), FORMS)
def test_forms(query: str, start: str, end: str) -> None:
    _check(query, "2024-01-10 23:41", start, end)


@pytest.mark.parametrize(
    "query",
    [
        "How many months have passed since I last visited a museum with a friend?",
        "How many days had passed between the Sunday mass at St. Mary's Church and the Ash "
        "Wednesday service at the cathedral?",
        "How many days passed between my first jog and the marathon?",
        "How many weeks ago did I meet up with my aunt and receive the crystal chandelier?",
        "How many weeks had passed since I recovered from the flu when I went on my 10th jog?",
        "Where do I live now?",
        "What am I currently reading?",
        "What do I eat these days?",
        "Do I still play tennis?",
        "What have I been doing recently?",
        "I went running for two weeks, how far did I get?",
        "What do I do every Monday?",
        "What do I usually do on Mondays?",
        "Do I have a meeting at 5 pm?",
        "May I ask what my cat's name is?",
        "It may be raining; what should I wear?",
        "Which shoes do you think I may like?",
        "What did my friend May recommend?",
        "What did May's sister cook?",
        "What did I get as a gift from Jan?",
        "Did we march in the parade?",
        "What was my New Year's resolution?",
        "Where did I go for spring break?",
        "When did I last fall ill?",
        "What did I tell you about the 2017 final?",
        "What will I do in two weeks?",
        "What is my favourite season?",
    ],
)
def test_no_frame(query: str) -> None:
    assert time_frame(query, datetime(2024, 1, 10, 12)) is None


def test_the_most_specific_expression_wins() -> None:
    now = datetime(2024, 1, 10)
    _check("What did I do last week on Monday?", "2024-01-10", "2024-01-08", "2024-01-09")
    _check("In 2023, what did I buy on 5 May?", "2024-01-10", "2023-05-05", "2023-05-06")
    frame = time_frame("In the first week of 2024, did I run?", now)
    assert frame is not None and frame.phrase == "In the first week of 2024"  # not "of 2024"
    assert time_frame("the day before yesterday", now).phrase == "the day before yesterday"


def test_a_listed_may_is_no_month() -> None:
    _check("Did I go there in March, may I ask?", "2024-01-10", "2023-03-01", "2023-04-01")


@pytest.mark.parametrize(
    ("query", "now", "start", "end"),
    [
        ("What did I buy last month?", "2024-01-10", "2023-12-01", "2024-01-01"),
        ("What did I eat last week?", "2024-01-02", "2023-12-25", "2024-01-01"),
        ("What did I do a week ago?", "2024-01-03", "2023-12-24", "2023-12-31"),
        ("Where did I ski last winter?", "2024-01-10", "2022-12-01", "2023-03-01"),
        ("Where did I ski last winter?", "2024-04-10", "2023-12-01", "2024-03-01"),
        ("Where did I go in winter?", "2024-01-10", "2023-12-01", "2024-03-01"),
        ("Where did I go last summer?", "2023-07-15", "2022-06-01", "2022-09-01"),
        ("Where did I go last summer?", "2023-10-15", "2023-06-01", "2023-09-01"),
        ("Where will I go this summer?", "2023-12-20", "2023-06-01", "2023-09-01"),
        ("Where will I go this summer?", "2024-04-20", "2024-06-01", "2024-09-01"),
        ("Where do I ski next winter?", "2023-12-20", "2024-12-01", "2025-03-01"),
        ("What did I buy on December 29?", "2024-01-05", "2023-12-29", "2023-12-30"),
        ("What did I buy on December 29?", "2023-12-29", "2023-12-29", "2023-12-30"),
        ("What did I do in December?", "2023-12-15", "2023-12-01", "2024-01-01"),
        ("What did I do in late December?", "2024-01-05", "2023-12-21", "2024-01-01"),
        ("Where will I spend the New Year?", "2023-12-20", "2023-12-31", "2024-01-02"),
        ("Where did I spend the New Year?", "2024-01-20", "2023-12-31", "2024-01-02"),
        ("What did I do on Wednesday?", "2024-01-10", "2024-01-03", "2024-01-04"),
        ("What did I do this weekend?", "2024-01-07", "2024-01-06", "2024-01-08"),
        ("What did I do last weekend?", "2024-01-07", "2023-12-30", "2024-01-01"),
    ],
)
def test_year_boundaries_and_reference_days(query: str, now: str, start: str, end: str) -> None:
    _check(query, now, start, end)


def test_naive_now_is_utc() -> None:
    naive = time_frame("What did I do yesterday?", datetime(2024, 1, 10, 23, 41))
    aware = time_frame("What did I do yesterday?", datetime(2024, 1, 10, 23, 41, tzinfo=UTC))
    assert naive == aware
    assert naive.start.tzinfo is UTC and naive.end.tzinfo is UTC


def test_days_are_those_of_now_s_time_zone() -> None:
    tokyo = timezone(timedelta(hours=9))
    now = datetime(2024, 1, 11, 8, 41, tzinfo=tokyo)  # 2024-01-10 23:41 in UTC
    frame = time_frame("What did I do yesterday?", now)
    assert frame.start == datetime(2024, 1, 9, 15, tzinfo=UTC)  # Jan 10, 00:00 in Tokyo
    assert frame.end == datetime(2024, 1, 10, 15, tzinfo=UTC)
    assert frame.start.utcoffset() == timedelta(0)
    new_york = timezone(timedelta(hours=-5))
    frame = time_frame("Where was I on 29 Dec 2023?", datetime(2024, 1, 10, tzinfo=new_york))
    assert (frame.start, frame.end) == (_utc("2023-12-29 05:00"), _utc("2023-12-30 05:00"))


#: Phrases of the past end by tomorrow; a month or season without a year has begun by now.
PAST_PHRASES = (
    "yesterday|a week ago|two months ago|last week|last month|last weekend|on Monday|last Sunday|"
    "last winter|last summer|on December 31|on Feb 29|the past few weeks|the Friday a month ago"
).split("|")
BEGUN_PHRASES = (
    "in the summer|in winter|in December|in May|in January and March|in early March|"
    "in the first week of February"
).split("|")


def test_every_day_of_two_years() -> None:
    day = date(2023, 1, 1)
    while day < date(2025, 1, 1):
        now = datetime(day.year, day.month, day.day, 12)
        tomorrow = _utc((day + timedelta(days=1)).isoformat())
        for phrase in PAST_PHRASES:
            frame = time_frame(f"What did I do {phrase}?", now)
            assert frame is not None and frame.start < frame.end <= tomorrow, (day, phrase)
        for phrase in BEGUN_PHRASES:
            frame = time_frame(f"What did I do {phrase}?", now)
            assert frame is not None and frame.start < tomorrow, (day, phrase)
        for phrase in ("next week", "next Friday", "next spring", "this summer", "the New Year"):
            frame = time_frame(f"What will I do {phrase}?", now)
            assert frame is not None and frame.start < frame.end, (day, phrase)
        day += timedelta(days=1)


def test_an_impossible_date_is_no_day() -> None:
    assert time_frame("What did I do on 2023-02-31?", datetime(2024, 1, 10)) is None
    assert time_frame("What did I do on 31 Feb?", datetime(2024, 1, 10)) is None


def test_the_frame_is_frozen() -> None:
    frame = time_frame("What did I do yesterday?", datetime(2024, 1, 10))
    assert isinstance(frame, TimeFrame)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frame.phrase = "today"  # type: ignore[misc]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(timeframe)
    assert result.attempted > 0 and result.failed == 0


def test_unicode_case_variants_of_a_season_or_month_resolve_instead_of_raising() -> None:
    # `re.IGNORECASE` matches "ſ" (long s) as "s"; the lookup must fold it the same way
    now = datetime(2023, 5, 1)
    spring = time_frame("What did I do in ſpring 2021?", now)
    assert spring is not None and spring.start.date().isoformat() == "2021-03-01"
    sept = time_frame("Where was I in ſeptember?", now)
    assert sept is not None and sept.start.date().isoformat() == "2022-09-01"
