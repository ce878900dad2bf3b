"""What the time tests of the adapters ask of the `cooked` memory (`tests/conftest.py`)."""

from __future__ import annotations

from reflective_memory.testing.surfaces import COOKING, TWO_WEEKS_AGO

__all__ = ["ASKED", "CURRY", "QUESTION", "SOUP", "first_cooked"]

QUESTION = TWO_WEEKS_AGO
#: Asked on 20 April, "two weeks ago" is the curry; at the newest turn (4 May), the soup.
ASKED = "2025-04-20T12:00:00"
CURRY, SOUP = COOKING[1][1], COOKING[2][1]


def first_cooked(text: str) -> str:
    """The first of the cooking turns a text shows."""
    found = sorted((text.find(t), t) for _, t, _ in COOKING if t in text)
    assert found, text
    return found[0][1]
