"""Time and "now" beyond English (issue 49): dateparser's locale data feeds the cues.

Time frames ("vor zwei Wochen", "hace dos semanas", "i fjor") and the present cue ("jetzt",
"maintenant", "ahora", "nå") in the languages of `passages.languages`; English read by the
package's own rules as before; ordinary questions in those languages get no cue.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from reflective_memory import MemoryConfig
from reflective_memory.errors import ConfigError
from reflective_memory.retrieval import time_words
from reflective_memory.retrieval.cues import present_tense, without_present_cue
from reflective_memory.retrieval.passages import PassageConfig
from reflective_memory.retrieval.timeframe import time_frame

from tests.test_timeframe import FORMS, LONGMEMEVAL, REALTALK

ROOT = Path(__file__).resolve().parents[1]
UTC = timezone.utc
LANGUAGES = PassageConfig().languages
#: Asked on Saturday 15 June 2024 at noon (UTC).
NOW = datetime(2024, 6, 15, 12, tzinfo=UTC)


def _frame(query: str, languages: tuple[str, ...] = LANGUAGES) -> tuple[str, str] | None:
    frame = time_frame(query, NOW, languages)
    return None if frame is None else (frame.start.date().isoformat(), frame.end.date().isoformat())


TWO_WEEKS_AGO = ("2024-05-29", "2024-06-05")  # June 1, +-3 days, as "two weeks ago"
LAST_YEAR = ("2023-01-01", "2024-01-01")
LAST_WEEK = ("2024-06-03", "2024-06-10")  # the calendar week before, Monday to Sunday
YESTERDAY = ("2024-06-14", "2024-06-15")
MARCH = ("2024-03-01", "2024-04-01")  # the latest March begun
MAY = ("2024-05-01", "2024-06-01")
A_MONTH_AGO = ("2024-04-30", "2024-05-31")  # May 15, +-15 days

# (question, expected window): several phrasings per language
FRAMES = [
    # English: the package's own rules, unchanged
    ("What did I do two weeks ago?", TWO_WEEKS_AGO),
    ("What did I do last year?", LAST_YEAR),
    ("What did I do last week?", LAST_WEEK),
    ("What did I do in March?", MARCH),
    # German
    ("Was habe ich vor zwei Wochen gemacht?", TWO_WEEKS_AGO),
    ("Was habe ich vor 2 Wochen gemacht?", TWO_WEEKS_AGO),
    ("Was habe ich letztes Jahr gemacht?", LAST_YEAR),
    ("Was habe ich letzte Woche gemacht?", LAST_WEEK),
    ("Was habe ich gestern gemacht?", YESTERDAY),
    ("Was habe ich letzten März gemacht?", MARCH),
    ("Was habe ich im Mai gemacht?", MAY),
    ("Was habe ich vor einem Monat gekauft?", A_MONTH_AGO),
    ("Was habe ich am 3. März 2023 gemacht?", ("2023-03-03", "2023-03-04")),
    ("Was habe ich am Dienstag gemacht?", ("2024-06-11", "2024-06-12")),
    # French
    ("Qu'est-ce que j'ai fait il y a deux semaines ?", TWO_WEEKS_AGO),
    ("Qu'ai-je fait l'année dernière ?", LAST_YEAR),
    ("Qu'ai-je fait la semaine dernière ?", LAST_WEEK),
    ("Qu'ai-je fait hier ?", YESTERDAY),
    ("Qu'ai-je fait en mars dernier ?", MARCH),
    ("Qu'ai-je acheté il y a un mois ?", A_MONTH_AGO),
    ("Qu'ai-je fait il y a quinze jours ?", ("2024-05-30", "2024-06-02")),  # 15 days +-1
    # Spanish ("dos": a number word dateparser's data lacks, from num2words)
    ("¿Qué hice hace dos semanas?", TWO_WEEKS_AGO),
    ("¿Qué hice hace 2 semanas?", TWO_WEEKS_AGO),
    ("¿Qué hice el año pasado?", LAST_YEAR),
    ("¿Qué hice la semana pasada?", LAST_WEEK),
    ("¿Qué hice ayer?", YESTERDAY),
    ("¿Qué hice el marzo pasado?", MARCH),
    ("¿Qué compré en mayo?", MAY),
    ("¿Qué compré hace tres meses?", ("2024-02-29", "2024-03-31")),  # March 15 +-15 days
    # Norwegian (Bokmål)
    ("Hva gjorde jeg for to uker siden?", TWO_WEEKS_AGO),
    ("Hva gjorde jeg i fjor?", LAST_YEAR),
    ("Hva gjorde jeg forrige uke?", LAST_WEEK),
    ("Hva gjorde jeg i går?", YESTERDAY),
    ("Hva gjorde jeg i mai?", MAY),
    ("Hva gjorde jeg i august?", ("2023-08-01", "2023-09-01")),  # a month English has too
    # the other default languages
    ("Cosa ho fatto due settimane fa?", TWO_WEEKS_AGO),
    ("Wat deed ik twee weken geleden?", TWO_WEEKS_AGO),
    ("Vad gjorde jag för två veckor sedan?", TWO_WEEKS_AGO),
    ("Hvad lavede jeg for to uger siden?", TWO_WEEKS_AGO),
    ("Cosa ho fatto l'anno scorso?", LAST_YEAR),
]


@pytest.mark.parametrize(("query", "window"), FRAMES)
def test_frames_resolve_against_now(query: str, window: tuple[str, str]) -> None:
    assert _frame(query) == window


def test_the_frame_names_its_phrase_with_digits() -> None:
    frame = time_frame("¿Qué hice hace dos semanas?", NOW, LANGUAGES)
    assert frame is not None and frame.phrase == "hace 2 semanas"
    frame = time_frame("Hva gjorde jeg i fjor?", NOW, LANGUAGES)
    assert frame is not None and frame.phrase == "i fjor"


def test_days_are_those_of_now_s_time_zone() -> None:
    from datetime import timedelta

    oslo = timezone(timedelta(hours=2))
    frame = time_frame("Hva gjorde jeg i går?", datetime(2024, 6, 15, 0, 30, tzinfo=oslo), ("nb",))
    assert frame is not None
    assert (frame.start, frame.end) == (
        datetime(2024, 6, 13, 22, tzinfo=UTC),  # 14 June, 00:00 in Oslo
        datetime(2024, 6, 14, 22, tzinfo=UTC),
    )


# (question, its searched text without the cue)
PRESENT = [
    ("Where do I live now?", "Where do I live?"),
    ("Now, where do I live?", ", where do I live?"),
    ("Wo wohne ich jetzt?", "Wo wohne ich?"),
    ("Wo arbeite ich jetzt?", "Wo arbeite ich?"),
    ("Und jetzt, wo wohne ich?", "Und, wo wohne ich?"),
    ("Où est-ce que j'habite maintenant ?", "Où est-ce que j'habite?"),
    ("Maintenant, où est-ce que je travaille ?", ", où est-ce que je travaille?"),  # as English
    ("¿Dónde vivo ahora?", "¿Dónde vivo?"),
    ("¿Ahora dónde trabajo?", "¿dónde trabajo?"),
    ("Hvor bor jeg nå?", "Hvor bor jeg?"),
    ("Hvor jobber jeg nå?", "Hvor jobber jeg?"),
    ("Nå, hva heter kjæresten min?", ", hva heter kjæresten min?"),
    ("Waar woon ik nu?", "Waar woon ik?"),  # "nu" is Dutch, Swedish and Danish: cut once
]


@pytest.mark.parametrize(("query", "searched"), PRESENT)
def test_present_cue_in_each_language(query: str, searched: str) -> None:
    assert present_tense(query, LANGUAGES)
    assert without_present_cue(query, LANGUAGES) == searched


ORDINARY = [
    "What am I allergic to?",
    "What did I tell you about the Mars rover?",
    "Which health issue did I deal with first, the cough or the skin tag removal?",
    "Wann ist die Hochzeit meiner Schwester?",
    "Woran bin ich allergisch?",
    "Wie viele Tage war ich in Berlin?",
    "Was hat August empfohlen?",
    "Quand est le mariage de ma sœur ?",
    "À quoi suis-je allergique ?",
    "Combien de jours ai-je passé à Lyon ?",
    "¿Cuándo es la boda de mi hermana?",
    "¿A qué soy alérgico?",
    "¿Cuántos días estuve en Madrid?",
    "Når er bryllupet til søsteren min?",
    "Hva er jeg allergisk mot?",
    "Hvor mange dager var jeg i Bergen?",
]


@pytest.mark.parametrize("query", ORDINARY)
def test_no_cue_on_ordinary_questions(query: str) -> None:
    assert _frame(query) is None
    assert not time_words.now_spans(query, LANGUAGES)
    assert without_present_cue(query, LANGUAGES) == without_present_cue(query)  # spacing only


def test_a_when_question_is_no_frame() -> None:
    from reflective_memory.retrieval.cues import asks_when

    assert asks_when("When is my sister's wedding?")
    assert _frame("Wann ist die Hochzeit meiner Schwester?") is None  # "die" is no Tuesday
    assert _frame("When is my sister's wedding?") is None


@pytest.mark.parametrize(("query", "now", "start", "end", "phrase"), LONGMEMEVAL)
def test_english_frames_are_unchanged(query: str, now: str, start: str, end: str, phrase: str):
    asked = datetime.fromisoformat(now)
    assert time_frame(query, asked, LANGUAGES) == time_frame(query, asked)
    assert present_tense(query, LANGUAGES) == present_tense(query)
    assert without_present_cue(query, LANGUAGES) == without_present_cue(query)


@pytest.mark.parametrize("query", [q for q, *_ in REALTALK + FORMS])
def test_english_forms_are_unchanged(query: str) -> None:
    asked = datetime(2024, 1, 10, 23, 41)
    assert time_frame(query, asked, LANGUAGES) == time_frame(query, asked)
    assert present_tense(query, LANGUAGES) == present_tense(query)


def test_english_is_read_only_when_listed() -> None:
    assert time_frame("What did I do two weeks ago?", NOW, ("de",)) is None
    assert not present_tense("Where do I live now?", ("de",))
    assert present_tense("Wo wohne ich jetzt?", ("de",))
    assert time_frame("Was habe ich vor zwei Wochen gemacht?", NOW, ("en",)) is None
    assert not present_tense("Wo wohne ich jetzt?", ("en",))
    assert time_frame("Was habe ich vor zwei Wochen gemacht?", NOW, ()) is None


def test_the_likeliest_language_reads_the_date() -> None:
    # "en mars" is French "in March", but Norwegian "en" is "one": read as French, a month
    frame = time_frame("Qu'ai-je fait en mars ?", NOW, ("en", "nb", "fr"))
    assert frame is not None and (frame.start.date().isoformat(), frame.phrase) == (
        "2024-03-01",
        "en mars",
    )


def test_languages_setting_is_validated() -> None:
    assert PassageConfig(languages=["de", "nb"]).languages == ("de", "nb")
    assert MemoryConfig(passages={"languages": ["fr"]}).passages.languages == ("fr",)
    assert PassageConfig(languages=()).languages == ()
    with pytest.raises(ConfigError, match="'xx'"):
        PassageConfig(languages=("en", "xx"))
    with pytest.raises(ConfigError, match="'no'.*'nb'"):
        PassageConfig(languages=("no",))
    with pytest.raises(ConfigError, match="passages.languages"):
        PassageConfig(languages=("de", "de"))
    with pytest.raises(ConfigError, match="passages.languages"):
        PassageConfig(languages=5)


def test_dateparser_loads_only_when_a_question_needs_it() -> None:
    code = (
        "import sys\n"
        "import reflective_memory\n"
        "from reflective_memory import MemoryConfig\n"
        "from reflective_memory.retrieval import cues, timeframe\n"
        "MemoryConfig(passages={'languages': ['en', 'de']})\n"
        "assert cues.present_tense('Where do I live now?')\n"
        "lazy = [m for m in ('dateparser', 'num2words') if m in sys.modules]\n"
        "assert not lazy, lazy\n"
        "assert cues.present_tense('Wo wohne ich jetzt?', ('en', 'de'))\n"
        "assert 'dateparser' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_docstring_examples_run() -> None:
    result = doctest.testmod(time_words)
    assert result.attempted > 0 and result.failed == 0
