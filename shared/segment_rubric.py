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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .errors import InvalidInputError, LLMError
from .llm import as_llm
from .metrics import window_diff
from .segment import boundaries_to_spans, check_spans
from .types import Turn, Usage

__all__ = [
    "LabeledDialogue",
    "Rubric",
    "learn_rubric",
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
            InvalidInputError: Missing file or not a rubric.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"cannot read rubric {path}: {exc}") from exc
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


def learn_rubric(
    llm: Any,
    dialogues: Sequence[LabeledDialogue],
    *,
    hard_examples: int = 100,
    batch_size: int = 10,
    max_items: int = 10,
    max_examples: int = 3,
    rounds: int = 1,
    rubric: Rubric | None = None,
    segmenter_kwargs: dict[str, Any] | None = None,
    usage: Usage | None = None,
    progress: bool = False,
) -> Rubric:
    """Learn a segmentation rubric by reflecting on the worst-segmented dialogues.

    Each round segments all `dialogues` with the current rubric, keeps the `hard_examples` with the
    highest WindowDiff, splits them into mini-batches of `batch_size` and asks the LLM to update
    the rubric after each batch. A batch whose answer cannot be parsed (or whose call fails) leaves
    the rubric unchanged.

    Args:
        llm: Any LLM the core accepts.
        dialogues: Annotated dialogues (per-utterance units).
        hard_examples: How many of the worst dialogues to reflect on per round.
        batch_size: Dialogues per reflection call.
        max_items: Most rules in the rubric.
        max_examples: Most representative examples kept (the latest ones).
        rounds: Segment-select-reflect rounds.
        rubric: Starting rubric (default: empty).
        segmenter_kwargs: Extra `LLMSegmenter` arguments (e.g. a `fallback` segmenter).
        usage: Operation-level `Usage` to add the calls to.
        progress: Show a progress bar.

    Returns:
        The learned rubric, with provenance in `metadata`.

    Raises:
        InvalidInputError: No dialogues or bad sizes.
    """
    from .segment_llm import LLMSegmenter

    if not dialogues:
        raise InvalidInputError("learn_rubric needs annotated dialogues")
    if hard_examples < 1 or batch_size < 1 or max_items < 1 or rounds < 1 or max_examples < 0:
        raise InvalidInputError("hard_examples, batch_size, max_items and rounds must be >= 1")
    client = as_llm(llm)
    if client is None:
        raise InvalidInputError("learn_rubric needs an llm")
    current = rubric if rubric is not None else Rubric()
    kwargs = {"unit": "turn", **(segmenter_kwargs or {})}
    own = Usage()
    history: list[dict[str, Any]] = []
    for r in range(rounds):
        seg = LLMSegmenter(client, rubric=current, **kwargs)
        scored = []
        for dlg in tqdm(dialogues, disable=not progress, desc=f"round {r + 1}: segmenting"):
            pred = seg.segment_detailed(dlg.turns(), usage=own).spans
            scored.append((window_diff(list(dlg.spans), pred), dlg, pred))
        scored.sort(key=lambda x: -x[0])
        hard = [(d, p) for wd, d, p in scored[:hard_examples] if wd > 0]
        mean_wd = sum(x[0] for x in scored) / len(scored)
        history.append({"round": r + 1, "mean_wd": mean_wd, "hard": len(hard)})
        logger.info(
            "rubric round %d: mean WindowDiff %.3f, %d hard dialogues", r + 1, mean_wd, len(hard)
        )
        for b in range(0, len(hard), batch_size):
            prompt = build_reflection_prompt(current, hard[b : b + batch_size], max_items)
            try:
                answer = client.complete(prompt, usage=own)
            except LLMError as exc:
                logger.warning("rubric reflection failed, keeping the rubric: %s", exc)
                continue
            items, example = parse_reflection(answer, max_items)
            if items is None:
                own.failures += 1
                logger.warning("rubric reflection had no <rubric> block; keeping the rubric")
                continue
            examples = current.examples + ([example] if example else [])
            current = Rubric(
                items=items,
                examples=examples[-max_examples:] if max_examples else [],
                metadata=current.metadata,
            )
    current.metadata = {
        **current.metadata,
        "learned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dialogues": len(dialogues),
        "rounds": history,
    }
    if usage is not None:
        usage.add(own)
    return current
