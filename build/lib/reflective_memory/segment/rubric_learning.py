"""SeCom rubric learning: reflect on the worst-segmented dialogues and rewrite the rubric.

Each round segments annotated dialogues with the current rubric, picks those with the highest
WindowDiff and asks the LLM to revise the rubric from its mistakes (SeCom's reflection step).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from tqdm import tqdm

from reflective_memory.errors import InvalidInputError, LLMError
from reflective_memory.llm import as_llm
from reflective_memory.segment.llm import LLMSegmenter
from reflective_memory.segment.metrics import window_diff
from reflective_memory.segment.rubric import (
    LabeledDialogue,
    Rubric,
    build_reflection_prompt,
    parse_reflection,
)
from reflective_memory.types import Usage

__all__ = ["learn_rubric"]

logger = logging.getLogger(__name__)


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
