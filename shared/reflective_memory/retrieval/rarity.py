"""How rare a turn's words are in the user's own history: what small talk lacks.

Chatter ("Hey, I'm doing well, what about you?", "See you!") is made of words the user says all
the time; a statement with content holds at least one word that is rare for this user (a name,
a place, "peanuts"). `WordCounts` counts how many of a user's turns hold each word, and
`WordCounts.rarity` turns the rarest word of a turn into a number the learned ranker weighs
(`features.FEATURES` `rarity`): no word list, so it reads any language, and a fact said again
and again keeps its rare word (said in 8 of 500 turns, "peanuts" is still rarer than "you").

The counts are of the user's turns as stored (`votes.UserTurns.word_counts` keeps them per
index version and carries them over appends), so the same history gives the same numbers on
every backend and after a reopen.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from reflective_memory.text import words_of

__all__ = ["WordCounts"]


class WordCounts:
    """How many of a user's turns hold each word.

    Args:
        texts: Turn texts to count.

    Example:
        >>> chat = ["Hi, how are you?", "Good, and you?", "I'm allergic to peanuts.", "Cool!"]
        >>> counts = WordCounts(chat * 3)
        >>> counts.rarity(words_of("How are you?")) < counts.rarity(words_of("Peanuts!"))
        True
    """

    __slots__ = ("holding", "turns", "said")

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self.holding: Counter[str] = Counter()
        self.said: Counter[frozenset[str]] = Counter()
        self.turns = 0
        self.add(texts)

    def add(self, texts: Iterable[str], sign: int = 1) -> None:
        """Count more turns (`sign=-1`: count turns counted before out again).

        A turn of the same words as one counted before is the same statement said again: it
        counts once, so saying a fact again does not make its words common.
        """
        for text in texts:
            words = words_of(text)
            before = self.said[words]
            self.said[words] = before + sign
            if sign > 0 and before == 0:
                self.holding.update(words)
                self.turns += 1
            elif sign < 0 and before == 1:
                self.holding.subtract(words)
                self.turns -= 1
                del self.said[words]

    def copy(self) -> WordCounts:
        """An independent copy."""
        out = WordCounts()
        out.holding = self.holding.copy()
        out.said = self.said.copy()
        out.turns = self.turns
        return out

    def rarity(self, words: Iterable[str]) -> float:
        """How rare the rarest of `words` is: 1 when one turn holds it, near 0 when all do.

        The inverse document frequency of the rarest word, `log((n + 1) / df)`, over its
        largest value, `log(n + 1)`, for `n` counted turns. A word no counted turn holds (a
        turn not counted yet) counts as held by one. No words (an emoji, "?") is 0.
        """
        n = self.turns
        least = min((self.holding.get(w, 0) for w in words), default=None)
        if least is None or n <= 0:
            return 0.0
        return max(0.0, math.log((n + 1) / max(least, 1)) / math.log(n + 1))
