"""`ConditionalConfig`: conditional memory's notes and self-reflection retrieval."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.settings import check_bool, check_int

__all__ = ["ConditionalConfig"]


@dataclass(frozen=True)
class ConditionalConfig:
    """Conditional memory (what is worth remembering; re-query when memories do not suffice).

    Attributes:
        notes: `end_session` also builds `note` memories (context + knowledge of the user
            utterances worth remembering). With an LLM: one call per `note_prompt_chars` of
            conversation; without: an offline heuristic, no call.
        note_prompt_chars: Conversation characters per note-making LLM call.
        self_reflection: `retrieve` lets the LLM judge the memories and retrieve again with its
            keywords when they do not suffice; needs an LLM.
        self_reflection_rounds: Most judging rounds (LLM calls) per reflective retrieval.
    """

    notes: bool = False
    note_prompt_chars: int = 12_000
    self_reflection: bool = False
    self_reflection_rounds: int = 1

    def __post_init__(self) -> None:
        check_bool("conditional.notes", self.notes)
        check_bool("conditional.self_reflection", self.self_reflection)
        check_int("conditional.note_prompt_chars", self.note_prompt_chars, 500)
        check_int("conditional.self_reflection_rounds", self.self_reflection_rounds, 1)
