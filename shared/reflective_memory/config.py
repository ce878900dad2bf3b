"""`MemoryConfig`: the settings of a `ReflectiveMemory`, composed of each stage's own config.

Every stage owns a small frozen config that validates itself and holds the one copy of its
defaults; `MemoryConfig` only composes them. Nested groups accept a dict of the fields to change:

>>> cfg = MemoryConfig(rerank={"top_k": 10}, passages={"speaker_focus": False})
>>> cfg.rerank.top_k, cfg.passages.speaker_focus, cfg.search.rrf_k
(10, False, 60)

The flat names of 0.1 (`rerank_top_k=10`) still work for one release, with a
`DeprecationWarning` naming the new place; settings removed in 0.2 raise `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from reflective_memory.conditional.config import ConditionalConfig
from reflective_memory.denoise.config import DenoiseConfig
from reflective_memory.errors import ConfigError
from reflective_memory.llm import LLMConfig
from reflective_memory.recall import RecallConfig
from reflective_memory.retrieval.fusion import SearchConfig
from reflective_memory.retrieval.passages import PassageConfig
from reflective_memory.retrieval.units import UnitConfig
from reflective_memory.rmm.config import RerankConfig, TopicConfig
from reflective_memory.segment.config import SegmentConfig
from reflective_memory.sessions.config import SessionConfig
from reflective_memory.settings import check_fields, coerce
from reflective_memory.storage.ann import IndexConfig

__all__ = ["MemoryConfig", "FLAT_NAMES", "REMOVED"]

#: The flat setting names of 0.1 and where each lives now (`group`, `field`).
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "granularities": ("units", "granularities"),
    "speaker_keys": ("units", "speaker_keys"),
    "date_prefix": ("units", "date_prefix"),
    "segment_vectors": ("units", "segment_vectors"),
    "embed_max_chars": ("units", "embed_max_chars"),
    "embed_batch_size": ("units", "embed_batch_size"),
    "segmenter": ("segment", "kind"),
    "segment_unit": ("segment", "unit"),
    "segment_window": ("segment", "window"),
    "segment_llm_window": ("segment", "llm_window"),
    "segment_llm_overlap": ("segment", "llm_overlap"),
    "segment_rubric": ("segment", "rubric"),
    "denoiser": ("denoise", "kind"),
    "denoise_rate": ("denoise", "rate"),
    "denoiser_model": ("denoise", "model"),
    "denoiser_device": ("denoise", "device"),
    "recall_calibrate": ("recall", "calibrate"),
    "retrieval_mode": ("search", "mode"),
    "dense_weight": ("search", "dense_weight"),
    "lexical_weight": ("search", "lexical_weight"),
    "rrf_k": ("search", "rrf_k"),
    "candidate_k": ("search", "candidate_k"),
    "default_k": ("search", "default_k"),
    "retrieval_views": ("search", "views"),
    "rerank_top_k": ("rerank", "top_k"),
    "rerank_top_m": ("rerank", "top_m"),
    "rerank_scope": ("rerank", "scope"),
    "rerank_explore": ("rerank", "explore"),
    "rerank_tau": ("rerank", "tau"),
    "rerank_learning_rate": ("rerank", "learning_rate"),
    "rerank_baseline": ("rerank", "baseline"),
    "rerank_batch_size": ("rerank", "batch_size"),
    "rerank_features": ("rerank", "features"),
    "rerank_feature_learning_rate": ("rerank", "feature_learning_rate"),
    "rerank_signed_features": ("rerank", "signed_features"),
    "rerank_user_learning_rate": ("rerank", "user_learning_rate"),
    "rerank_user_decay": ("rerank", "user_decay"),
    "rerank_seed": ("rerank", "seed"),
    "attribution_fallback": ("rerank", "attribution_fallback"),
    "attribution_threshold": ("rerank", "attribution_threshold"),
    "context_weight": ("passages", "context_weight"),
    "recency_weight": ("passages", "recency"),
    "speaker_focus": ("passages", "speaker_focus"),
    "length_exponent": ("passages", "length_exponent"),
    "length_free": ("passages", "length_free"),
    "length_keep_share": ("passages", "length_keep_share"),
    "budget_unit": ("passages", "budget_unit"),
    "max_session_turns": ("sessions", "max_turns"),
    "session_idle_seconds": ("sessions", "idle_seconds"),
    "max_text_chars": ("sessions", "max_text_chars"),
    "prospective_reflection": ("topics", "enabled"),
    "topic_merge_k": ("topics", "merge_k"),
    "topic_speakers": ("topics", "speakers"),
    "conditional_memory": ("conditional", "notes"),
    "note_prompt_chars": ("conditional", "note_prompt_chars"),
    "self_reflection": ("conditional", "self_reflection"),
    "self_reflection_rounds": ("conditional", "self_reflection_rounds"),
    "llm_timeout_s": ("llm", "timeout_s"),
    "llm_max_chars": ("llm", "max_chars"),
    "ann_threshold": ("index", "ann_threshold"),
    "ann_index": ("index", "ann_kind"),
    "ann_probe": ("index", "ann_probe"),
    "index_cache_bytes": ("index", "cache_bytes"),
}

#: Settings removed in 0.2, each measured neutral or negative on the dev sets (BENCHMARKS.md).
REMOVED = frozenset(
    {
        "neighbour_weight",
        "neighbour_span",
        "rerank_optimizer",
        "rerank_weight_decay",
        "rerank_memory_bias",
        "rerank_memory_credit",
        "rerank_memory_credit_cap",
        "rerank_turn_prior",
        "rerank_turn_prior_learning_rate",
        "extra",
        "context_full_budget",
        "recency_margin",
    }
)

#: Group name -> its config class.
_GROUPS: dict[str, type] = {
    "units": UnitConfig,
    "segment": SegmentConfig,
    "denoise": DenoiseConfig,
    "recall": RecallConfig,
    "search": SearchConfig,
    "rerank": RerankConfig,
    "passages": PassageConfig,
    "sessions": SessionConfig,
    "topics": TopicConfig,
    "conditional": ConditionalConfig,
    "llm": LLMConfig,
    "index": IndexConfig,
}
#: 0.1's booleans that had the name a group has now: `rerank=False`, `passages=False`.
_SWITCHES = {"rerank": "enabled", "passages": "enabled"}


@dataclass(frozen=True, init=False)
class MemoryConfig:
    """Settings of a `ReflectiveMemory`: one config per stage, each with safe defaults.

    Every group accepts its config object or a dict of the fields to change; see each class
    (and docs/configuration.md) for the fields and why each default was chosen.

    Attributes:
        units: `UnitConfig`: which units are built from turns and how their keys are made.
        segment: `SegmentConfig`: how SeCom segments are cut.
        denoise: `DenoiseConfig`: SeCom compression of the keys (off by default).
        recall: `RecallConfig`: RF-Mem over the dense index (familiarity by default).
        search: `SearchConfig`: dense + BM25 candidates and their reciprocal-rank fusion.
        rerank: `RerankConfig`: RMM's citation-trained reranker.
        passages: `PassageConfig`: small-to-big passages for the reader.
        sessions: `SessionConfig`: when sessions end; the largest turn.
        topics: `TopicConfig`: RMM topic memories (Add/Merge; needs an LLM).
        conditional: `ConditionalConfig`: notes and self-reflection retrieval.
        llm: `LLMConfig`: time and size bounds of every LLM call.
        index: `IndexConfig`: approximate search and the index cache.
    """

    units: UnitConfig
    segment: SegmentConfig
    denoise: DenoiseConfig
    recall: RecallConfig
    search: SearchConfig
    rerank: RerankConfig
    passages: PassageConfig
    sessions: SessionConfig
    topics: TopicConfig
    conditional: ConditionalConfig
    llm: LLMConfig
    index: IndexConfig

    def __init__(self, **settings: Any) -> None:
        groups: dict[str, Any] = {}
        flat: dict[str, dict[str, Any]] = {}
        for name, value in settings.items():
            if name in _SWITCHES and isinstance(value, bool):
                _deprecated(name, f"{name}.{_SWITCHES[name]}")
                flat.setdefault(name, {})[_SWITCHES[name]] = value
            elif name in _GROUPS:
                groups[name] = value
            elif name in FLAT_NAMES:
                group, field = FLAT_NAMES[name]
                _deprecated(name, f"{group}.{field}")
                flat.setdefault(group, {})[field] = value
            elif name in REMOVED:
                raise ConfigError(
                    f"{name} was removed in 0.2: it measured neutral or negative on the dev "
                    "sets (BENCHMARKS.md, 'Removed')"
                )
            else:
                raise ConfigError(
                    f"unknown MemoryConfig setting {name!r}; groups: {sorted(_GROUPS)}"
                )
        for name, cls in _GROUPS.items():
            value = coerce(cls, groups.get(name), name)
            if name in flat:
                value = dataclasses.replace(value, **flat[name])
            object.__setattr__(self, name, value)

    def validate(self) -> MemoryConfig:
        """Return self: every group validated itself when it was built."""
        return self

    def replace(self, **changes: Any) -> MemoryConfig:
        """A copy with groups changed; a dict merges into the group's current fields.

        Example:
            >>> MemoryConfig().replace(rerank={"enabled": False}).rerank.enabled
            False
        """
        out: dict[str, Any] = {name: getattr(self, name) for name in _GROUPS}
        for name, value in changes.items():
            current = out.get(name)
            if isinstance(value, dict) and current is not None:
                check_fields(type(current), value, name)
                value = dataclasses.replace(current, **value)
            out[name] = value
        return MemoryConfig(**out)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain-dict form (JSON-serialisable; tuples become lists)."""
        return {name: _plain(dataclasses.asdict(getattr(self, name))) for name in _GROUPS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryConfig:
        """Build from `to_dict` output (flat 0.1 names are accepted with a warning)."""
        if not isinstance(data, dict):
            raise ConfigError(f"a MemoryConfig dict is needed, got {type(data).__name__}")
        return cls(**data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"MemoryConfig({old}=...) is deprecated; use {new} (a nested setting) instead",
        DeprecationWarning,
        stacklevel=4,
    )
