"""SeCom compression denoising: retrieval keys stripped of redundant words; the LLM reads raw text.

- `base`: the `Denoiser` protocol, names and fitting helpers.
- `offline`: `OfflineDenoiser`, which needs nothing downloaded (the default).
- `llmlingua`: `LLMLinguaDenoiser`, LLMLingua-2 as in the paper (a local model folder).
- `factory`: `make_denoiser`, from a name or an object.
"""

from reflective_memory.denoise.base import (
    DEFAULT_LLMLINGUA_MODEL,
    DENOISER_KINDS,
    Denoiser,
    FittableDenoiser,
    denoiser_name,
    fitted_on,
)
from reflective_memory.denoise.factory import make_denoiser
from reflective_memory.denoise.llmlingua import LLMLinguaDenoiser, ensure_tiktoken_cache
from reflective_memory.denoise.offline import OfflineDenoiser

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
