"""`DenoiseConfig`: SeCom compression of the retrieval keys (owned by the denoisers)."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.settings import check_choice, check_number

__all__ = ["DenoiseConfig", "DENOISERS"]

#: `DenoiseConfig.kind` values.
DENOISERS = ("none", "offline", "llmlingua")


@dataclass(frozen=True)
class DenoiseConfig:
    """How memory keys are denoised before indexing; the stored text always stays raw.

    Attributes:
        kind: `none` (default), `offline` (`OfflineDenoiser`, nothing downloaded) or
            `llmlingua` (`LLMLinguaDenoiser` with `model`). A denoiser object may be passed to
            `ReflectiveMemory` instead. After changing it, `ReflectiveMemory.redenoise(user)`
            re-keys old memories. `none` by default: with turn-level keys a denoised key must be
            embedded again at `end_session` (raw turn vectors are reused otherwise), and the
            dev-set ablation found no gain (docs/algorithms.md).
        rate: Fraction of each key kept, in (0, 1] (SeCom uses 0.75 with LLMLingua-2).
        model: LLMLingua-2 model name or folder (`None`: `DEFAULT_LLMLINGUA_MODEL`).
        device: Torch device of the LLMLingua-2 model.
    """

    kind: str = "none"
    rate: float = 0.5
    model: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_choice("denoise.kind", self.kind, DENOISERS)
        check_number("denoise.rate", self.rate, 0, 1, open_low=True)
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ConfigError("denoise.model must be None or a model name or folder")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError("denoise.device must be a torch device string such as 'cpu'")
