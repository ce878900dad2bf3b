"""SeCom compression denoising: retrieval keys stripped of redundant words; the LLM reads raw text.

- `base`: the `Denoiser` protocol, names and fitting helpers.
- `offline`: `OfflineDenoiser`, which needs nothing downloaded (the default).
- `llmlingua`: `LLMLinguaDenoiser`, LLMLingua-2 as in the paper (a local model folder).
- `factory`: `make_denoiser`, from a name or an object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.denoise.base import (
        DEFAULT_LLMLINGUA_MODEL,
        DENOISER_KINDS,
        Denoiser,
        FittableDenoiser,
        denoiser_name,
        fitted_on,
    )
    from reflective_memory.denoise.config import DenoiseConfig
    from reflective_memory.denoise.factory import make_denoiser
    from reflective_memory.denoise.llmlingua import LLMLinguaDenoiser, ensure_tiktoken_cache
    from reflective_memory.denoise.offline import OfflineDenoiser

_EXPORTS = {
    "DEFAULT_LLMLINGUA_MODEL": "reflective_memory.denoise.base",
    "DENOISER_KINDS": "reflective_memory.denoise.base",
    "Denoiser": "reflective_memory.denoise.base",
    "FittableDenoiser": "reflective_memory.denoise.base",
    "denoiser_name": "reflective_memory.denoise.base",
    "fitted_on": "reflective_memory.denoise.base",
    "make_denoiser": "reflective_memory.denoise.factory",
    "LLMLinguaDenoiser": "reflective_memory.denoise.llmlingua",
    "ensure_tiktoken_cache": "reflective_memory.denoise.llmlingua",
    "OfflineDenoiser": "reflective_memory.denoise.offline",
    "DenoiseConfig": "reflective_memory.denoise.config",
}

__all__ = [
    "DEFAULT_LLMLINGUA_MODEL",
    "DENOISER_KINDS",
    "Denoiser",
    "FittableDenoiser",
    "denoiser_name",
    "fitted_on",
    "make_denoiser",
    "LLMLinguaDenoiser",
    "ensure_tiktoken_cache",
    "OfflineDenoiser",
    "DenoiseConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
