"""Compression-based denoising of memory keys (SeCom §2.3).

SeCom indexes each memory unit under a *compressed* version of its text: redundant tokens act as
noise for the retriever, so dropping them sharpens retrieval, while the LLM still reads the raw
text. Two denoisers are provided:

* `OfflineDenoiser`: needs nothing downloaded. Drops the least informative words of each unit
  (punctuation-only tokens, fillers, stopwords, then the words with the lowest self-information
  under word statistics of a corpus, typically the user's own memories), keeping a fixed fraction
  of the words in their original order. Deterministic and fast (no model call).
* `LLMLinguaDenoiser`: LLMLingua-2 through the `llmlingua` package, as in the paper; the model is
  a local folder or a Hugging Face name supplied by the user.

Both follow the `Denoiser` protocol: `denoise(str | list[str]) -> str | list[str]` with the same
shape out, one output per input unit, in the same order. A denoiser may also expose
`fit(corpus) -> self` to learn corpus statistics; `fitted_on` gives a fitted copy without
touching the original, so nothing learnt for one user leaks into another user's keys.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import random
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, overload, runtime_checkable

from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    ModelLoadError,
    ReflectiveMemoryError,
)

__all__ = [
    "Denoiser",
    "FittableDenoiser",
    "OfflineDenoiser",
    "LLMLinguaDenoiser",
    "DEFAULT_LLMLINGUA_MODEL",
    "DENOISER_KINDS",
    "make_denoiser",
    "fitted_on",
    "denoiser_name",
    "ensure_tiktoken_cache",
]

logger = logging.getLogger(__name__)

#: The LLMLingua-2 model used by the SeCom paper (xlm-roberta-large, MeetingBank data).
DEFAULT_LLMLINGUA_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"

#: Names accepted by `make_denoiser` (and by `MemoryConfig.denoiser`).
DENOISER_KINDS = ("none", "offline", "llmlingua")

# llmlingua picks its word-merging rules from these substrings of the model name or path.
_LLMLINGUA_FAMILIES = ("bert-base-multilingual-cased", "xlm-roberta-large")


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


def _check_texts(texts: str | Sequence[str]) -> tuple[list[str], bool]:
    """Normalise `str | list[str]` to a list, remembering whether a single string came in."""
    if isinstance(texts, str):
        return [texts], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    return list(texts), False


def _check_rate(rate: Any) -> float:
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
        self.rate = _check_rate(rate)
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
        texts, _ = _check_texts(corpus)
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
        texts, _ = _check_texts(corpus)
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
        items, single = _check_texts(texts)
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
# --------------------------------------------------------------------------------------------


def ensure_tiktoken_cache() -> str | None:
    """Point `TIKTOKEN_CACHE_DIR` at a cached `cl100k_base` so llmlingua works offline.

    llmlingua builds tiktoken's `gpt-3.5-turbo` encoding when it loads, which downloads
    `cl100k_base` unless it is cached. llama-index-core ships that file; when the variable is not
    set already, it is set to llama-index-core's cache folder.

    Returns:
        The value of `TIKTOKEN_CACHE_DIR` afterwards (`None` when unset and no cache was found).
    """
    current = os.environ.get("TIKTOKEN_CACHE_DIR")
    if current:
        return current
    try:
        spec = importlib.util.find_spec("llama_index.core")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "_static" / "tiktoken_cache"
        if folder.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
            logger.debug("TIKTOKEN_CACHE_DIR set to %s", folder)
            return str(folder)
    return None


_DEFAULT_FOLDER = DEFAULT_LLMLINGUA_MODEL.rsplit("/", 1)[-1]
_SENTENCE_RE = re.compile(r"(?<=[.!?\n])\s+")


class LLMLinguaDenoiser:
    r"""LLMLingua-2 compression of each memory unit, as in the SeCom paper.

    Wraps `llmlingua.PromptCompressor(model_name=model, use_llmlingua2=True, device_map=device)`.
    Each unit is compressed on its own (the keep threshold is computed per unit, per chunk of at
    most `max_chunk_tokens` model tokens; chunks are cut at sentence ends and their compressions
    joined with a space). The model loads lazily on first use, once; `warm_up()` loads it now.

    Offline use: the model must be on disk. llmlingua recognises a model by its name, so a local
    folder's path must contain `bert-base-multilingual-cased` or `xlm-roberta-large`.
    `TIKTOKEN_CACHE_DIR` is pointed at llama-index-core's cached `cl100k_base` when not set.

    Args:
        model: A Hugging Face model name or a local folder of an LLMLingua-2 token-classification
            model.
        rate: Fraction of the (tiktoken) tokens kept, in (0, 1]; the paper uses 0.75.
        device: Torch device, e.g. `"cpu"` or `"cuda"`.
        batch_size: Chunks per forward pass.
        max_chunk_tokens: Longest chunk given to the model, in model tokens (at most 510).
        force_tokens: Tokens always kept (e.g. `["\\n", "?"]`).
        force_reserve_digit: Always keep tokens that contain a digit.
        model_config: Extra keyword arguments for `from_pretrained` (e.g.
            `{"local_files_only": True}`).

    Raises:
        ConfigError: A setting is out of range.
    """

    def __init__(
        self,
        model: str = DEFAULT_LLMLINGUA_MODEL,
        rate: float = 0.75,
        device: str = "cpu",
        *,
        batch_size: int = 16,
        max_chunk_tokens: int = 500,
        force_tokens: Sequence[str] | None = None,
        force_reserve_digit: bool = False,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
            raise ConfigError(f"model must be a model name or a folder path, got {model!r}")
        self.model = str(model)
        self.rate = _check_rate(rate)
        if not isinstance(device, str) or not device:
            raise ConfigError(f"device must be a torch device string, got {device!r}")
        self.device = device
        for label, val, hi in (
            ("batch_size", batch_size, None),
            ("max_chunk_tokens", max_chunk_tokens, 510),
        ):
            if (
                not isinstance(val, int)
                or isinstance(val, bool)
                or val < 1
                or (hi is not None and val > hi)
            ):
                raise ConfigError(f"{label} must be an integer in [1, {hi or 'inf'}], got {val!r}")
        self.batch_size = batch_size
        self.max_chunk_tokens = max_chunk_tokens
        self.force_tokens = list(force_tokens) if force_tokens is not None else []
        if len(self.force_tokens) > 100:
            raise ConfigError("llmlingua accepts at most 100 force_tokens")
        self.force_reserve_digit = bool(force_reserve_digit)
        self.model_config = dict(model_config) if model_config is not None else {}
        self._compressor: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """Identifier with settings, e.g. `llmlingua(<model>,rate=0.75)`."""
        return f"llmlingua({self.model},rate={self.rate:g})"

    def __copy__(self) -> LLMLinguaDenoiser:
        # Share the loaded model; a copy only needs its own lock.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._lock = threading.Lock()
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_compressor"] = None
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def warm_up(self) -> LLMLinguaDenoiser:
        """Load the model now (otherwise it loads on the first `denoise`).

        Returns:
            `self`.

        Raises:
            ModelLoadError: The model or tiktoken's encoding could not be loaded; the message
                says how to provide them.
        """
        self._get()
        return self

    def _get(self) -> Any:
        if self._compressor is not None:
            return self._compressor
        with self._lock:
            if self._compressor is None:
                self._compressor = self._load()
        return self._compressor

    def _load(self) -> Any:
        family = next((f for f in _LLMLINGUA_FAMILIES if f in self.model), None)
        if family is None:
            raise ModelLoadError(
                f"llmlingua cannot use model {self.model!r}: LLMLingua-2 recognises a model by "
                f"its name, which must contain one of {_LLMLINGUA_FAMILIES}. Use e.g. "
                f"{DEFAULT_LLMLINGUA_MODEL!r} or save/symlink the model in a folder whose name "
                "contains 'xlm-roberta-large' or 'bert-base-multilingual-cased'."
            )
        try:
            from llmlingua import PromptCompressor
        except ImportError as exc:
            raise ModelLoadError(
                "LLMLinguaDenoiser needs the 'llmlingua' package: pip install llmlingua"
            ) from exc
        ensure_tiktoken_cache()
        # llmlingua seeds every global RNG when it loads; keep the caller's random state.
        import numpy as np
        import torch

        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        saved_hash_seed = os.environ.get("PYTHONHASHSEED")
        try:
            compressor = PromptCompressor(
                model_name=self.model,
                device_map=self.device,
                model_config=dict(self.model_config),
                use_llmlingua2=True,
                llmlingua2_config={"max_batch_size": self.batch_size},
            )
        except Exception as exc:  # noqa: BLE001 - anything here means "cannot load"
            tiktoken_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
            raise ModelLoadError(
                f"Could not load the LLMLingua-2 model {self.model!r} on {self.device!r} "
                f"({type(exc).__name__}: {exc}). Provide the model on disk: download it where "
                "the internet is reachable (e.g. `huggingface-cli download "
                f"{DEFAULT_LLMLINGUA_MODEL} --local-dir <folder>/{_DEFAULT_FOLDER}`)"
                " and pass that folder as model=...; the folder name must contain "
                "'xlm-roberta-large' or 'bert-base-multilingual-cased'. llmlingua also needs "
                "tiktoken's cl100k_base: set TIKTOKEN_CACHE_DIR to a folder holding it "
                "(llama-index-core ships one) "
                f"[TIKTOKEN_CACHE_DIR={tiktoken_dir!r}]. Or use the offline denoiser "
                "(denoiser='offline')."
            ) from exc
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])
            if saved_hash_seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = saved_hash_seed
        logger.info("loaded LLMLingua-2 model %s on %s", self.model, self.device)
        return compressor

    def _chunks(self, tokenizer: Any, text: str) -> list[str]:
        """Cut `text` at sentence ends into pieces of at most `max_chunk_tokens` model tokens."""
        limit = self.max_chunk_tokens
        pieces: list[str] = []
        current: list[str] = []
        size = 0
        for sentence in _SENTENCE_RE.split(text):
            if not sentence.strip():
                continue
            n = len(tokenizer.tokenize(sentence))
            if n > limit:  # an over-long sentence: cut it by words
                if current:
                    pieces.append(" ".join(current))
                    current, size = [], 0
                for word in sentence.split():
                    m = len(tokenizer.tokenize(word))
                    if current and size + m > limit:
                        pieces.append(" ".join(current))
                        current, size = [], 0
                    current.append(word)
                    size += m
                continue
            if current and size + n > limit:
                pieces.append(" ".join(current))
                current, size = [], 0
            current.append(sentence)
            size += n
        if current:
            pieces.append(" ".join(current))
        return pieces

    @overload
    def denoise(self, texts: str) -> str: ...

    @overload
    def denoise(self, texts: list[str]) -> list[str]: ...

    def denoise(self, texts: str | list[str]) -> str | list[str]:
        """Compress each text separately with LLMLingua-2.

        Args:
            texts: One text or a list of texts (each one memory unit).

        Returns:
            The compressed text(s), same shape as `texts`. A text that is blank, or that would
            compress to nothing, comes back unchanged.

        Raises:
            InvalidInputError: `texts` is not a str or a list of str.
            ModelLoadError: The model could not be loaded.
            ReflectiveMemoryError: llmlingua failed while compressing.
        """
        items, single = _check_texts(texts)
        if self.rate >= 1.0 or not any(t.strip() for t in items):
            return items[0] if single else items
        compressor = self._get()
        chunks: list[str] = []
        owner: list[int] = []
        for i, text in enumerate(items):
            if not text.strip():
                continue
            for piece in self._chunks(compressor.tokenizer, text):
                chunks.append(piece)
                owner.append(i)
        parts: list[list[str]] = [[] for _ in items]
        step = max(1, self.batch_size * 4)
        try:
            for start in range(0, len(chunks), step):
                batch = chunks[start : start + step]
                result = compressor.compress_prompt_llmlingua2(
                    batch,
                    rate=self.rate,
                    use_context_level_filter=False,
                    force_tokens=list(self.force_tokens),
                    force_reserve_digit=self.force_reserve_digit,
                )
                compressed = result["compressed_prompt_list"]
                if len(compressed) != len(batch):
                    raise ReflectiveMemoryError(
                        f"llmlingua returned {len(compressed)} texts for {len(batch)} inputs"
                    )
                for j, piece in enumerate(compressed):
                    if piece.strip():
                        parts[owner[start + j]].append(piece.strip())
        except ReflectiveMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - llmlingua raises assorted errors
            raise ReflectiveMemoryError(f"llmlingua compression failed: {exc}") from exc
        out = [" ".join(p) if p else text for p, text in zip(parts, items, strict=True)]
        return out[0] if single else out

    def to_dict(self) -> dict[str, Any]:
        """Serialise the settings."""
        return {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "init_parameters": {
                "model": self.model,
                "rate": self.rate,
                "device": self.device,
                "batch_size": self.batch_size,
                "max_chunk_tokens": self.max_chunk_tokens,
                "force_tokens": self.force_tokens or None,
                "force_reserve_digit": self.force_reserve_digit,
                "model_config": self.model_config or None,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMLinguaDenoiser:
        """Rebuild from `to_dict` output."""
        return cls(**data.get("init_parameters", {}))

    def __repr__(self) -> str:
        return (
            f"LLMLinguaDenoiser(model={self.model!r}, rate={self.rate!r}, device={self.device!r})"
        )


def make_denoiser(
    spec: str | Denoiser | None,
    *,
    rate: float = 0.75,
    model: str | None = None,
    device: str = "cpu",
) -> Denoiser | None:
    """Build a denoiser from a name, or pass an object through.

    Args:
        spec: `None` or `"none"` (no denoising), `"offline"`, `"llmlingua"`, or any object with
            a `denoise` method (returned as is).
        rate: Keep rate for the named denoisers.
        model: Model for `"llmlingua"` (default `DEFAULT_LLMLINGUA_MODEL`).
        device: Torch device for `"llmlingua"`.

    Returns:
        The denoiser, or `None` for no denoising.

    Raises:
        ConfigError: Unknown name, or an object without `denoise`.

    Example:
        >>> make_denoiser("offline", rate=0.5).name
        'offline(rate=0.5)'
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        kind = spec.strip().lower()
        if kind == "none":
            return None
        if kind == "offline":
            return OfflineDenoiser(rate=rate)
        if kind == "llmlingua":
            return LLMLinguaDenoiser(
                model=DEFAULT_LLMLINGUA_MODEL if model is None else model,
                rate=rate,
                device=device,
            )
        raise ConfigError(f"denoiser must be one of {DENOISER_KINDS} or an object, got {spec!r}")
    if callable(getattr(spec, "denoise", None)):
        return spec
    raise ConfigError(
        f"denoiser object {type(spec).__name__} has no denoise(texts) method; see the Denoiser "
        "protocol in reflective_memory.denoise"
    )
