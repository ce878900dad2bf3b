"""`OfflineDenoiser`: drops fillers, stopwords and low self-information words; no model."""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any, overload

from reflective_memory.denoise.base import check_rate, check_texts

__all__ = ["OfflineDenoiser"]

logger = logging.getLogger(__name__)

# Offline denoiser
# --------------------------------------------------------------------------------------------

# Function words of English (normalised: lower case, apostrophes removed).
_STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are arent as at be because been before
    being below between both but by can cant cannot could couldnt did didnt do does doesnt doing
    dont down during each few for from further had hadnt has hasnt have havent having he hed hell
    hes her here heres hers herself him himself his how hows i id ill im ive if in into is isnt
    it its itself lets me more most mustnt my myself no nor not of off on once only or other
    ought our ours ourselves out over own same shant she shed shell shes should shouldnt so some
    such than that thats the their theirs them themselves then there theres these they theyd
    theyll theyre theyve this those through to too under until up very was wasnt we wed well
    were weve werent what whats when whens where wheres which while who whos whom why whys with
    wont would wouldnt you youd youll youre youve your yours yourself yourselves also just
    will shall may might must us s t d ll m re ve via upon onto within without whether yet
    """.split()
)

# Conversational fillers, hedges and politeness markers that carry no retrievable content.
_FILLERS = frozenset(
    """
    um umm uh uhh uhm er erm hmm hm mm mhm ah oh ooh wow hey hi hello ok okay yeah yep yes yup
    nope nah lol haha hehe btw like really actually basically literally totally honestly
    definitely certainly sure please thanks thank thx anyway anyways kinda sorta maybe perhaps
    quite pretty rather somewhat just well right alright great cool awesome nice glad happy
    absolutely indeed course let know feel free hope helps help helpful wonderful fantastic
    """.split()
)

_TOKEN_RE = re.compile(r"\S+")
_STRIP_RE = re.compile(r"[\W_]+", re.UNICODE)
_DIGIT_RE = re.compile(r"\d")


def _normalise(token: str) -> str:
    """Lower-case a whitespace token and drop everything but letters and digits."""
    return _STRIP_RE.sub("", token.lower())


class OfflineDenoiser:
    """Keeps the most informative words of each unit; needs no model and nothing downloaded.

    Every whitespace-separated token of a unit gets a rank: tokens without letters or digits
    (punctuation, markdown) rank lowest, then fillers, then stopwords, then content words by
    self-information `-log p(w)` under the fitted corpus statistics (Laplace-smoothed unigram
    probabilities; unseen words are the most informative), and tokens containing a digit rank
    highest when `keep_numbers` is set. The top `ceil(rate * n)` tokens are kept in their
    original order (ties go to the earlier token), so the output is deterministic.

    Without `fit`, the statistics come from the texts of each `denoise` call itself.

    Args:
        rate: Fraction of the tokens of each unit that is kept, in (0, 1]. `1.0` returns the
            texts unchanged.
        keep_numbers: Rank tokens containing a digit above every other token.
        stopwords: Extra words (any case) to treat as stopwords, added to the built-in list.

    Example:
        >>> d = OfflineDenoiser(rate=0.5)
        >>> d.denoise("um so I really adopted a beagle named Rex last week")
        'adopted beagle named Rex last week'
    """

    def __init__(
        self,
        rate: float = 0.75,
        *,
        keep_numbers: bool = True,
        stopwords: Iterable[str] | None = None,
    ) -> None:
        self.rate = check_rate(rate)
        self.keep_numbers = bool(keep_numbers)
        self.stopwords = tuple(sorted(stopwords)) if stopwords is not None else ()
        self._fillers = _FILLERS
        self._stop = _STOPWORDS | frozenset(_normalise(w) for w in self.stopwords)
        self.counts_: Counter[str] | None = None
        self.total_: int = 0

    @property
    def name(self) -> str:
        """Identifier with settings, e.g. `offline(rate=0.75)`."""
        extra = "" if self.keep_numbers else ",keep_numbers=False"
        if self.stopwords:
            extra += f",stopwords={len(self.stopwords)}"
        return f"offline(rate={self.rate:g}{extra})"

    def fit(self, corpus: list[str]) -> OfflineDenoiser:
        """Learn word statistics from `corpus`, replacing earlier ones.

        Args:
            corpus: Texts, typically every memory text of one user.

        Returns:
            `self`.
        """
        texts, _ = check_texts(corpus)
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(self._words(text))
        self.counts_ = counts
        self.total_ = sum(counts.values())
        return self

    def partial_fit(self, corpus: list[str]) -> OfflineDenoiser:
        """Add the word statistics of `corpus` to those already learnt.

        Args:
            corpus: More texts.

        Returns:
            `self`.
        """
        texts, _ = check_texts(corpus)
        counts = Counter(self.counts_) if self.counts_ is not None else Counter()
        for text in texts:
            counts.update(self._words(text))
        self.counts_ = counts
        self.total_ = sum(counts.values())
        return self

    def _words(self, text: str) -> Iterable[str]:
        for token in _TOKEN_RE.findall(text):
            norm = _normalise(token)
            if norm:
                yield norm

    @overload
    def denoise(self, texts: str) -> str: ...

    @overload
    def denoise(self, texts: list[str]) -> list[str]: ...

    def denoise(self, texts: str | list[str]) -> str | list[str]:
        """Drop the least informative tokens of each text.

        Args:
            texts: One text or a list of texts (each one memory unit).

        Returns:
            The denoised text(s), same shape as `texts`. Texts without tokens come back as
            they are.

        Raises:
            InvalidInputError: `texts` is not a str or a list of str.
        """
        items, single = check_texts(texts)
        if self.rate >= 1.0:
            return items[0] if single else items
        counts, total = self.counts_, self.total_
        if counts is None:
            counts = Counter()
            for text in items:
                counts.update(self._words(text))
            total = sum(counts.values())
        denom = total + len(counts) + 1
        out = [self._denoise_one(text, counts, denom) for text in items]
        return out[0] if single else out

    def _denoise_one(self, text: str, counts: Counter[str], denom: int) -> str:
        tokens = _TOKEN_RE.findall(text)
        n = len(tokens)
        if n == 0:
            return text
        keep = max(1, math.ceil(self.rate * n - 1e-9))
        if keep >= n:
            return " ".join(tokens)
        ranks: list[tuple[int, float, int]] = []
        for pos, token in enumerate(tokens):
            norm = _normalise(token)
            if not norm:
                tier, info = 0, 0.0
            elif self.keep_numbers and _DIGIT_RE.search(norm):
                tier, info = 4, 0.0
            elif norm in self._fillers:
                tier, info = 1, -math.log((counts.get(norm, 0) + 1) / denom)
            elif norm in self._stop:
                tier, info = 2, -math.log((counts.get(norm, 0) + 1) / denom)
            else:
                tier, info = 3, -math.log((counts.get(norm, 0) + 1) / denom)
            ranks.append((tier, info, -pos))
        order = sorted(range(n), key=ranks.__getitem__, reverse=True)
        kept = sorted(order[:keep])
        return " ".join(tokens[i] for i in kept)

    def to_dict(self) -> dict[str, Any]:
        """Serialise the settings (not the fitted statistics)."""
        return {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "init_parameters": {
                "rate": self.rate,
                "keep_numbers": self.keep_numbers,
                "stopwords": list(self.stopwords) if self.stopwords else None,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OfflineDenoiser:
        """Rebuild from `to_dict` output."""
        return cls(**data.get("init_parameters", {}))

    def __repr__(self) -> str:
        return f"OfflineDenoiser(rate={self.rate!r}, keep_numbers={self.keep_numbers!r})"


# --------------------------------------------------------------------------------------------
# LLMLingua-2 denoiser
