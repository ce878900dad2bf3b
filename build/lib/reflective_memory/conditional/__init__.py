"""Conditional memory: decide what is worth remembering, and self-reflection retrieval.

- `memorize`: the offline decision (what a user message keeps) and the fused-response prompt.
- `notes`: context + knowledge notes per worthwhile user message (LLM path with offline fallback).
- `reflection`: self-reflection retrieval, re-querying with the LLM's keywords.
"""

from reflective_memory.conditional.notes import NOTE_GRANULARITY, LLMNoteMaker, build_note_drafts
from reflective_memory.conditional.reflection import Reflection, reflective_retrieve

__all__ = [
    "NOTE_GRANULARITY",
    "LLMNoteMaker",
    "build_note_drafts",
    "Reflection",
    "reflective_retrieve",
]
