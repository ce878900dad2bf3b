"""From an answer to the shown items it cited: the reading half of feedback.

`read_answer` validates a feedback call and turns the answer's citation markers (or the cited
numbers given directly) into positions in the shown list, through a numbering (by default
number `i` names shown item `i`). What the turn ranker then learns from it is
`reflective_memory.rmm.feedback.RerankStage`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.rmm.citations import echoes_instructions, parse_citations

__all__ = ["FeedbackResult", "read_answer"]


@dataclass
class FeedbackResult:
    """What one feedback call learned: the one result type of every feedback API.

    Returned by `ReflectiveMemory.feedback` (for a `Retrieval` or texts ranked by
    `ReflectiveMemory.rerank_texts`), and so by LlamaIndex's
    `ReflectiveNodePostprocessor.feedback` and `ReflectiveMemoryBlock.feedback`, and LangChain's
    `CitationReranker.feedback` (and the chat memory / middleware that send answers back).

    Attributes:
        retrieval_id: The retrieval (or text ranking) the feedback is about.
        user_id: Its user.
        cited: Positions in the shown list (`retrieval.hits`, or the texts shown) counted as
            cited.
        rewards: Reward per shown item (+1 cited, -1 not), by memory id (or
            text id: the node / document id in the adapters).
        inferred: The citations were inferred by the attribution fallback (no marker in the
            answer).
        no_cite: The answer said `[NO_CITE]`.
        out_of_range: Cited numbers that named no hit (ignored).
        repeated: Repeated citations (ignored).
        learned: An episode was given to the turn ranker (or to the caller's reranker).
        updates: Steps taken by this call (1 when the turn ranker learned).
        pending: Episodes learned but not yet stored (`rerank.save_every`).
        loss: The episode's loss before the step, if one was taken.
        serving: What the user's citations taught ranks their next retrieval: it has ranked
            later citations better than the weights it replaces (the gate, see
            `reflective_memory.rmm.turn_learning`); False while it is still being proven.
        similarities: For inferred feedback, the best answer-sentence cosine per hit.
        reason: Why nothing was learned, when `learned` is False.
    """

    retrieval_id: str
    user_id: str
    cited: tuple[int, ...] = ()
    rewards: dict[str, float] = field(default_factory=dict)
    inferred: bool = False
    no_cite: bool = False
    out_of_range: int = 0
    repeated: int = 0
    learned: bool = False
    updates: int = 0
    pending: int = 0
    loss: float | None = None
    serving: bool = False
    similarities: list[float] | None = None
    reason: str = ""


def read_answer(
    n_shown: int,
    answer: str | None,
    cited: Sequence[int] | None,
    *,
    fallback: bool,
    numbering: Mapping[int, int | None] | None = None,
    retrieval_id: str = "",
    user_id: str = "",
) -> FeedbackResult:
    """Validate a feedback call and read which shown items the answer cited.

    Args:
        n_shown: How many items were shown (hits, or texts).
        answer: The answer text (citation markers parsed), or None with `cited`.
        cited: Cited numbers given directly, or None.
        fallback: Whether an answer without markers goes to the attribution fallback (then
            `inferred` is set and `cited` is left for the caller to infer).
        numbering: What each citation number names: the position of a shown item, or None for
            something that was cited but not shown (e.g. a source the reranker did not rank).
            Default: number `i` names shown item `i`. A number the numbering does not hold is
            out of range.
        retrieval_id: Copied into the result.
        user_id: Copied into the result.

    Returns:
        A `FeedbackResult` with `cited` as positions in the shown list; a non-empty `reason`
        means there is nothing to learn.

    Raises:
        InvalidInputError: Neither answer nor citations, or a cited number names nothing.
    """
    if answer is None and cited is None:
        raise InvalidInputError("give the answer text or the cited positions")
    if answer is not None and not isinstance(answer, str):
        raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
    names: Mapping[int, int | None] = (
        {i: i for i in range(n_shown)} if numbering is None else numbering
    )
    out = FeedbackResult(retrieval_id, user_id)
    if cited is None and echoes_instructions(answer):  # type: ignore[arg-type]
        out.reason = "the answer echoes the prompt's instructions"
        return out
    pos: list[int] = []
    if cited is not None:
        if isinstance(cited, (str, bytes)) or not isinstance(cited, Sequence):
            raise InvalidInputError("cited must be a sequence of hit positions")
        for c in cited:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
                raise InvalidInputError(f"cited positions must be ints, got {c!r}")
            if int(c) not in names:
                raise InvalidInputError(f"cited position {c} is not a hit (0..{n_shown - 1})")
            p = names[int(c)]
            if p is not None and p not in pos:
                pos.append(p)
    else:
        parsed = parse_citations(answer, max(names, default=-1) + 1)  # type: ignore[arg-type]
        out.no_cite, out.repeated = parsed.no_cite, parsed.repeated
        out.out_of_range = parsed.out_of_range
        for i in parsed.indices:
            if i not in names:
                out.out_of_range += 1
            elif names[i] is not None and names[i] not in pos:
                pos.append(names[i])  # type: ignore[arg-type]
        if not parsed.found:
            if not fallback:
                out.reason = "the answer has no citation and the attribution fallback is off"
                return out
            out.inferred = True
    out.cited = tuple(pos)
    if n_shown == 0:
        out.reason = "the retrieval has no hits"
    return out
