from __future__ import annotations

import pytest
from reflective_memory import InvalidInputError
from reflective_memory.rmm.citations import parse_citations, strip_citations


@pytest.mark.parametrize(
    ("answer", "stored"),
    [
        ("September 6, in Gothenburg. [0]", "September 6, in Gothenburg."),
        ("You play the cello [1] and the piano [0, 2].", "You play the cello and the piano."),
        ("Your cat is Miso [0].", "Your cat is Miso."),
        ("Both, I think.[1][2]", "Both, I think."),
        ("Lyon [0-2], then Paris.", "Lyon, then Paris."),
        ("I don't know that yet. [NO_CITE]", "I don't know that yet."),
        ("No idea. [ no cite ]", "No idea."),
        ("[NO_CITE]", ""),
        ("Steps:\n1. Book it [0]\n2. Pay", "Steps:\n1. Book it\n2. Pay"),
    ],
)
def test_our_marks_are_removed(answer: str, stored: str) -> None:
    assert strip_citations(answer) == stored
    assert not parse_citations(strip_citations(answer), 5).found


@pytest.mark.parametrize(
    "answer",
    [
        "See the [link] and the [docs].",
        "In Python, array[0] is the first item and m[0][1] a cell.",
        'f(x)[1] and d["k"]_[0] stay.',
        "Run `xs [0]` in the shell.",
        "```python\nxs = [1, 2]\nprint(xs [0])\n```",
        "Memory serves me well [sic].",
    ],
)
def test_other_brackets_and_code_are_kept(answer: str) -> None:
    assert strip_citations(answer) == answer


def test_mixed_answer_keeps_code_and_drops_marks() -> None:
    answer = "Index it with `items[0]`, e.g. ```\nys = [0, 1]\n``` as you asked [3]. [NO_CITE]"
    assert strip_citations(answer) == (
        "Index it with `items[0]`, e.g. ```\nys = [0, 1]\n``` as you asked."
    )


def test_a_bare_numeric_footnote_is_indistinguishable_and_removed() -> None:
    assert (
        strip_citations("As the study says [1], sleep helps.") == "As the study says, sleep helps."
    )


def test_rejects_non_text() -> None:
    with pytest.raises(InvalidInputError):
        strip_citations(None)  # type: ignore[arg-type]
