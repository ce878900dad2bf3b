"""`LLMLinguaDenoiser`: SeCom's LLMLingua-2 compression through the `llmlingua` package."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import random
import re
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from reflective_memory.denoise.base import (
    DEFAULT_LLMLINGUA_MODEL,
    LLMLINGUA_FAMILIES,
    check_rate,
    check_texts,
)
from reflective_memory.errors import (
    ConfigError,
    ModelLoadError,
    ReflectiveMemoryError,
)
from reflective_memory.quiet import quiet_model_loading

__all__ = [
    "ensure_tiktoken_cache",
    "tiktoken_encoding_cached",
    "model_on_disk",
    "LLMLinguaDenoiser",
]

logger = logging.getLogger(__name__)

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
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def tiktoken_encoding_cached() -> bool:
    """Whether tiktoken's `cl100k_base` (which llmlingua needs) is on disk, so no download."""
    name = hashlib.sha1(_CL100K_URL.encode()).hexdigest()
    folders = [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR")]
    folders.append(os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    return any(f and os.path.isfile(os.path.join(f, name)) for f in folders)


def model_on_disk(model: str) -> bool:
    """Whether `model` is a local folder or a Hugging Face model already in the local cache."""
    if Path(model).expanduser().is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a transformers dependency
        return False
    try:
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - a malformed name is simply not cached
        return False
    return isinstance(found, str) and os.path.isfile(found)


_SENTENCE_RE = re.compile(r"(?<=[.!?\n])\s+")


class LLMLinguaDenoiser:
    r"""LLMLingua-2 compression of each memory unit, as in the SeCom paper.

    Wraps `llmlingua.PromptCompressor(model_name=model, use_llmlingua2=True, device_map=device)`.
    Each unit is compressed on its own (the keep threshold is computed per unit, per chunk of at
    most `max_chunk_tokens` model tokens; chunks are cut at sentence ends and their compressions
    joined with a space). The model loads lazily on first use, once; `warm_up()` loads it now.

    Offline by default: the model must be on disk (a local folder, or a Hugging Face name already
    in the local cache); a missing model fails at once with `ModelLoadError`, without trying
    the network, unless `allow_download=True`. llmlingua recognises a model by its name, so a
    local folder's path must contain `bert-base-multilingual-cased` or `xlm-roberta-large`.
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
        model_config: Extra keyword arguments for `from_pretrained`.
        allow_download: Let llmlingua download a model (and tiktoken's encoding) that is not
            on disk; off by default (nothing touches the network).

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
        allow_download: bool = False,
    ) -> None:
        if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
            raise ConfigError(f"model must be a model name or a folder path, got {model!r}")
        self.model = str(model)
        self.rate = check_rate(rate)
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
        self.allow_download = bool(allow_download)
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
        family = next((f for f in LLMLINGUA_FAMILIES if f in self.model), None)
        if family is None:
            raise ModelLoadError(
                f"llmlingua cannot use model {self.model!r}: LLMLingua-2 recognises a model by "
                f"its name, which must contain one of {LLMLINGUA_FAMILIES}. Use e.g. "
                f"{DEFAULT_LLMLINGUA_MODEL!r} or save/symlink the model in a folder whose name "
                "contains 'xlm-roberta-large' or 'bert-base-multilingual-cased'."
            )
        ensure_tiktoken_cache()
        model_config = dict(self.model_config)
        if not self.allow_download:
            if not model_on_disk(self.model):
                raise ModelLoadError(
                    f"LLMLingua-2 model {self.model!r} is not on this machine (no such folder, "
                    "not in the Hugging Face cache) and downloads are off: pass "
                    "denoiser_model=<local folder> (e.g. from `huggingface-cli download "
                    f"{DEFAULT_LLMLINGUA_MODEL} --local-dir <dir>/{_DEFAULT_FOLDER}`), or "
                    "use denoiser='offline'"
                )
            if not tiktoken_encoding_cached():
                raise ModelLoadError(
                    "llmlingua needs tiktoken's cl100k_base, which is not cached and downloads "
                    "are off: set TIKTOKEN_CACHE_DIR to a folder holding it (llama-index-core "
                    "ships one), or use denoiser='offline'"
                )
            model_config.setdefault("local_files_only", True)
        try:
            from llmlingua import PromptCompressor
        except ImportError as exc:
            raise ModelLoadError(
                "LLMLinguaDenoiser needs the 'llmlingua' package: pip install llmlingua"
            ) from exc
        # llmlingua seeds every global RNG when it loads; keep the caller's random state.
        import numpy as np
        import torch

        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        saved_hash_seed = os.environ.get("PYTHONHASHSEED")
        try:
            with quiet_model_loading():
                compressor = PromptCompressor(
                    model_name=self.model,
                    device_map=self.device,
                    model_config=model_config,
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
        items, single = check_texts(texts)
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
                "allow_download": self.allow_download,
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
