"""SeCom's "segmentation with reflection": learn a rubric from annotated dialogues.

`learn_rubric` segments annotated dialogues with an `LLMSegmenter`, ranks them by WindowDiff,
takes the worst ones, and walks through them in mini-batches. For each batch the LLM sees its
predicted segments next to the annotated ones, reflects on the differences, and returns the
updated rubric (at most `max_items` short rules) and one representative example with a comment.
The rubric is persisted as JSON and put in front of later segmentation prompts
(`LLMSegmenter(llm, rubric=Rubric.load(path))`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflective_memory.errors import InvalidFileError, InvalidInputError
from reflective_memory.jsonfile import MAX_MODEL_FILE_BYTES, loads_bounded, read_text_file
from reflective_memory.segment.base import boundaries_to_spans, check_spans
from reflective_memory.types import Turn

__all__ = [
    "LabeledDialogue",
    "Rubric",
    "build_reflection_prompt",
    "parse_reflection",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabeledDialogue:
    """A dialogue with its reference segmentation (one unit per utterance).

    Attributes:
        utterances: The utterances in order.
        spans: Reference segments as half-open utterance spans.
        roles: Speaker of each utterance (`None`: alternating `user` / `assistant`).
        dialogue_id: Identifier for reports.
    """

    utterances: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    roles: tuple[str, ...] | None = None
    dialogue_id: str = ""

    def __post_init__(self) -> None:
        if not self.utterances:
            raise InvalidInputError("a labeled dialogue needs at least one utterance")
        check_spans(self.spans, len(self.utterances))
        if self.roles is not None and len(self.roles) != len(self.utterances):
            raise InvalidInputError("roles must have one entry per utterance")

    @classmethod
    def from_starts(
        cls, utterances: Sequence[str], starts: Sequence[int], dialogue_id: str = ""
    ) -> LabeledDialogue:
        """Build from the indices of utterances that open a new segment."""
        spans = boundaries_to_spans(starts, len(utterances))
        return cls(tuple(utterances), tuple(spans), None, dialogue_id)

    def turns(self, user_id: str = "bench") -> list[Turn]:
        """The utterances as `Turn`s of one session."""
        sid = self.dialogue_id or "dialogue"
        roles = self.roles or tuple(
            "user" if i % 2 == 0 else "assistant" for i in range(len(self.utterances))
        )
        return [
            Turn(user_id, sid, roles[i], text, f"{sid}:{i}", i)
            for i, text in enumerate(self.utterances)
        ]


@dataclass
class Rubric:
    """Segmentation guidance learned by reflection: rules plus representative examples.

    Attributes:
        items: At most 10 short rules.
        examples: Representative examples with the LLM's comments.
        metadata: Provenance (data, batches, date).
    """

    items: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def is_empty(self) -> bool:
        """True when there is nothing to put in a prompt."""
        return not self.items and not self.examples

    def to_prompt(self) -> str:
        """The prompt prefix: the rules, then the examples."""
        parts = []
        if self.items:
            parts.append(
                "# Segmentation rubric (learned from annotated conversations)\n"
                + "\n".join(f"- {x}" for x in self.items)
            )
        if self.examples:
            parts.append(
                "# Examples of past mistakes\n"
                + "\n\n".join(f"Example {i + 1}:\n{x}" for i, x in enumerate(self.examples))
            )
        return "\n\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Serializable form (`{"type": ..., "init_parameters": {...}}`)."""
        return {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "init_parameters": {
                "items": list(self.items),
                "examples": list(self.examples),
                "metadata": dict(self.metadata),
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rubric:
        """Inverse of `to_dict`.

        Raises:
            InvalidInputError: Not a rubric.
        """
        params = data.get("init_parameters", data) if isinstance(data, dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("items", []), list):
            raise InvalidInputError("not a serialized Rubric")
        return cls(
            items=[str(x) for x in params.get("items", [])],
            examples=[str(x) for x in params.get("examples", [])],
            metadata=dict(params.get("metadata", {})),
        )

    def save(self, path: str | Path) -> Path:
        """Write the rubric as JSON; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Rubric:
        """Read a rubric written by `save`.

        Raises:
            InvalidInputError: Missing file, not a bounded regular JSON file, or not a rubric.
        """
        try:  # a bounded regular file, bounded JSON (`jsonfile`)
            data = loads_bounded(read_text_file(path, max_bytes=MAX_MODEL_FILE_BYTES), path)
        except InvalidFileError as exc:
            raise InvalidInputError(f"cannot read rubric {exc}") from None
        return cls.from_dict(data)


_REFLECT = """\
You are improving the instructions of a conversation segmenter. Below are conversations that it
segmented badly. For each one you see the segments it predicted and the segments expert
annotators chose. Each segment starts with "Segment k:" followed by its utterances.

Compare the two, work out which habits caused the mistakes (cutting too often, too rarely, at
the wrong place, missing a change of subject, splitting a question from its answer, ...), and
update the rubric: keep the rules that still hold, rewrite or replace those that misled, and add
at most one new rule. The rubric may have at most {max_items} rules; each rule is one short,
general sentence that does not mention these particular conversations.

Answer in exactly this form:
<reflection>
what went wrong, conversation by conversation
</reflection>
<rubric>
- rule
- rule
</rubric>
<example>
the most instructive of these conversations (shortened if long), its correct segments, and one
or two sentences on what to learn from it
</example>

# Current rubric
{rubric}

# Conversations
{examples}
"""


def _render_segments(utterances: Sequence[str], spans: Sequence[tuple[int, int]], cap: int) -> str:
    lines = []
    for k, (a, b) in enumerate(spans):
        lines.append(f"Segment {k}:")
        for i in range(a, b):
            text = utterances[i]
            lines.append(f"  ({i}) {text if len(text) <= cap else text[:cap] + ' ...'}")
    return "\n".join(lines)


def build_reflection_prompt(
    rubric: Rubric,
    batch: Sequence[tuple[LabeledDialogue, list[tuple[int, int]]]],
    max_items: int = 10,
    max_chars: int = 300,
) -> str:
    """The reflection prompt for one mini-batch of `(dialogue, predicted spans)`."""
    current = "\n".join(f"- {x}" for x in rubric.items) if rubric.items else "(empty)"
    blocks = []
    for j, (dlg, pred) in enumerate(batch):
        blocks.append(
            f"## Conversation {j + 1}\n### Predicted\n"
            f"{_render_segments(dlg.utterances, pred, max_chars)}\n### Annotated\n"
            f"{_render_segments(dlg.utterances, dlg.spans, max_chars)}"
        )
    return _REFLECT.format(max_items=max_items, rubric=current, examples="\n\n".join(blocks))


def _tag(text: str, name: str) -> str | None:
    m = re.search(rf"<{name}>(.*?)(?:</{name}>|$)", text, re.DOTALL | re.IGNORECASE)
    return m.group(1).strip() if m else None


def parse_reflection(text: str, max_items: int = 10) -> tuple[list[str] | None, str | None]:
    r"""Rules and example from a reflection answer; `None` where a part is missing.

    Example:
        >>> parse_reflection("<rubric>- Cut when the subject changes.</rubric><example>x</example>")
        (['Cut when the subject changes.'], 'x')
    """
    if not isinstance(text, str):
        return None, None
    body = _tag(text, "rubric")
    items: list[str] | None = None
    if body is not None:
        items = []
        for line in body.splitlines():
            line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", line).strip()
            if line and line not in items:
                items.append(line[:400])
        items = items[:max_items] or None
    example = _tag(text, "example")
    return items, (example[:3000] if example else None)
