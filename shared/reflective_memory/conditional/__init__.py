"""Conditional memory: decide what is worth remembering, and self-reflection retrieval.

- `memorize`: the offline decision (what a user message keeps) and the fused-response prompt.
- `notes`: context + knowledge notes per worthwhile user message (LLM path with offline fallback).
- `reflection`: self-reflection retrieval, re-querying with the LLM's keywords.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.conditional.config import ConditionalConfig
    from reflective_memory.conditional.notes import (
        NOTE_GRANULARITY,
        LLMNoteMaker,
        build_note_drafts,
    )
    from reflective_memory.conditional.reflection import Reflection, reflective_retrieve

_EXPORTS = {
    "NOTE_GRANULARITY": "reflective_memory.conditional.notes",
    "LLMNoteMaker": "reflective_memory.conditional.notes",
    "build_note_drafts": "reflective_memory.conditional.notes",
    "Reflection": "reflective_memory.conditional.reflection",
    "reflective_retrieve": "reflective_memory.conditional.reflection",
    "ConditionalConfig": "reflective_memory.conditional.config",
}

__all__ = [
    "NOTE_GRANULARITY",
    "LLMNoteMaker",
    "build_note_drafts",
    "Reflection",
    "reflective_retrieve",
    "ConditionalConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
