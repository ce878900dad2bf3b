"""Build the denoiser a name or object asks for (`make_denoiser`)."""

from __future__ import annotations

import logging

from reflective_memory.denoise.base import DEFAULT_LLMLINGUA_MODEL, DENOISER_KINDS, Denoiser
from reflective_memory.denoise.llmlingua import LLMLinguaDenoiser
from reflective_memory.denoise.offline import OfflineDenoiser
from reflective_memory.errors import (
    ConfigError,
)

__all__ = ["make_denoiser"]

logger = logging.getLogger(__name__)


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
