"""The denoiser protocol and helpers shared by every denoiser (SeCom compression denoising)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
)

__all__ = [
    "Denoiser",
    "FittableDenoiser",
    "check_texts",
    "check_rate",
    "denoiser_name",
    "fitted_on",
    "DEFAULT_LLMLINGUA_MODEL",
    "DENOISER_KINDS",
    "LLMLINGUA_FAMILIES",
]

logger = logging.getLogger(__name__)


#: The LLMLingua-2 model used by the SeCom paper (xlm-roberta-large, MeetingBank data).
DEFAULT_LLMLINGUA_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"

#: Names accepted by `make_denoiser` (and by `MemoryConfig.denoiser`).
DENOISER_KINDS = ("none", "offline", "llmlingua")

# llmlingua picks its word-merging rules from these substrings of the model name or path.
LLMLINGUA_FAMILIES = ("bert-base-multilingual-cased", "xlm-roberta-large")


@runtime_checkable
class Denoiser(Protocol):
    """Turns memory-unit texts into denoised retrieval keys.

    Implementations return one key per input text, in the input order, and keep the words of a
    key in the order they have in the text. A `str` in gives a `str` out; a list gives a list.
    An optional `name` attribute identifies the denoiser and its settings (stored with each key
    so that stale keys can be found).
    """

    def denoise(self, texts: str | list[str]) -> str | list[str]:
        """Return the denoised key of each text (same shape as the input)."""
        ...


@runtime_checkable
class FittableDenoiser(Denoiser, Protocol):
    """A `Denoiser` that learns statistics from a corpus before denoising."""

    def fit(self, corpus: list[str]) -> FittableDenoiser:
        """Learn statistics from `corpus` (replacing earlier ones) and return `self`."""
        ...


def check_texts(texts: str | Sequence[str]) -> tuple[list[str], bool]:
    """Normalise `str | list[str]` to a list, remembering whether a single string came in."""
    if isinstance(texts, str):
        return [texts], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    return list(texts), False


def check_rate(rate: Any) -> float:
    """Check a keep rate in (0, 1]; return it as a float."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
        raise ConfigError(f"rate (fraction of the text kept) must be in (0, 1], got {rate!r}")
    return float(rate)


def denoiser_name(denoiser: Any) -> str:
    """A short identifier of a denoiser and its settings (`"none"` for `None`).

    Args:
        denoiser: A denoiser or `None`.

    Returns:
        The denoiser's `name` attribute when it has a string one, else its class name.

    Example:
        >>> denoiser_name(OfflineDenoiser(rate=0.5))
        'offline(rate=0.5)'
    """
    if denoiser is None:
        return "none"
    name = getattr(denoiser, "name", None)
    return name if isinstance(name, str) and name else type(denoiser).__name__


def fitted_on(denoiser: Denoiser, corpus: Iterable[str]) -> Denoiser:
    """Return a copy of `denoiser` fitted on `corpus`, or `denoiser` itself if it cannot fit.

    The original is never modified, so one denoiser object can serve many users without
    carrying one user's statistics into another's keys.

    Args:
        denoiser: Any denoiser.
        corpus: Texts to learn statistics from (e.g. all memory texts of one user).

    Returns:
        A fitted shallow copy when the denoiser has a `fit` method, else the denoiser.
    """
    fit = getattr(denoiser, "fit", None)
    if not callable(fit):
        return denoiser
    clone = copy.copy(denoiser)
    result = clone.fit(list(corpus))
    return clone if result is None else result


# --------------------------------------------------------------------------------------------
