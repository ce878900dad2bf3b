"""From an answer to the hits it cited: the reading half of feedback.

`read_answer` validates a feedback call and turns the answer's citation markers (or the cited
positions given directly) into positions in the shown list; `candidate_positions` maps the shown
hits onto the reranked candidates, a passage hit standing for one of its source units. What the
rerankers then learn from it is `reflective_memory.rmm.feedback.RerankStage`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reflective_memory.errors import InvalidInputError
from reflective_memory.rmm.citations import echoes_instructions, parse_citations
from reflective_memory.types import Retrieval

__all__ = ["FeedbackResult", "read_answer", "candidate_positions"]


@dataclass
class FeedbackResult:
    """What one feedback call learned: the one result type of every feedback API.

    Returned by `ReflectiveMemory.feedback`, LlamaIndex's `ReflectiveNodePostprocessor.feedback`
    and `ReflectiveMemoryBlock.feedback`, and LangChain's `CitationReranker.feedback` (and the
    chat memory / middleware that send answers back).

    Attributes:
        retrieval_id: The retrieval (or adapter ranking) the feedback is about.
        user_id: Its user.
        cited: Positions in the shown list (`retrieval.hits`, or the nodes / documents the
            adapter returned) counted as cited.
        rewards: Reward per shown item (+1 cited, -1 not) fed to the reranker, by memory id (or
            node / document id in the adapters).
        inferred: The citations were inferred by the attribution fallback (no marker in the
            answer).
        no_cite: The answer said `[NO_CITE]`.
        out_of_range: Cited numbers that named no hit (ignored).
        repeated: Repeated citations (ignored).
        learned: An episode was given to the reranker.
        updates: Reranker optimizer steps taken by this call (0 while a batch fills).
        pending: Episodes waiting for the next step.
        loss: REINFORCE loss of the step taken, if any.
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
    similarities: list[float] | None = None
    reason: str = ""


def read_answer(
    retrieval: Retrieval,
    answer: str | None,
    cited: Sequence[int] | None,
    *,
    fallback: bool,
) -> FeedbackResult:
    """Validate a feedback call and read which hits the answer cited.

    Args:
        retrieval: The retrieval the answer was generated from.
        answer: The answer text (citation markers parsed), or None with `cited`.
        cited: Cited hit positions given directly, or None.
        fallback: Whether an answer without markers goes to the attribution fallback (then
            `inferred` is set and `cited` is left for the caller to infer).

    Returns:
        A `FeedbackResult`; a non-empty `reason` means there is nothing to learn.

    Raises:
        InvalidInputError: Not a Retrieval, no answer nor citations, or bad positions.
    """
    if not isinstance(retrieval, Retrieval):
        raise InvalidInputError(f"retrieval must be a Retrieval, got {type(retrieval).__name__}")
    if answer is None and cited is None:
        raise InvalidInputError("give the answer text or the cited positions")
    if answer is not None and not isinstance(answer, str):
        raise InvalidInputError(f"answer must be a str, got {type(answer).__name__}")
    n = len(retrieval.hits)
    out = FeedbackResult(retrieval.retrieval_id, retrieval.user_id)
    if cited is None and echoes_instructions(answer):  # type: ignore[arg-type]
        out.reason = "the answer echoes the prompt's instructions"
        return out
    if cited is not None:
        if isinstance(cited, (str, bytes)) or not isinstance(cited, Sequence):
            raise InvalidInputError("cited must be a sequence of hit positions")
        pos: list[int] = []
        for c in cited:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
                raise InvalidInputError(f"cited positions must be ints, got {c!r}")
            if not 0 <= int(c) < n:
                raise InvalidInputError(f"cited position {c} is not a hit (0..{n - 1})")
            if int(c) not in pos:
                pos.append(int(c))
        out.cited = tuple(pos)
    else:
        parsed = parse_citations(answer, n)  # type: ignore[arg-type]
        out.no_cite, out.out_of_range, out.repeated = (
            parsed.no_cite,
            parsed.out_of_range,
            parsed.repeated,
        )
        if parsed.found:
            out.cited = parsed.indices
        elif not fallback:
            out.reason = "the answer has no citation and the attribution fallback is off"
            return out
        else:
            out.inferred = True
    if n == 0:
        out.reason = "the retrieval has no hits"
    return out


def candidate_positions(retrieval: Retrieval, ids: Sequence[str]) -> dict[str, int]:
    """Position among the reranked candidates `ids` of each shown hit's memory id.

    A hit that is a candidate itself maps to its own position; a passage hit (built from turns
    at retrieval) stands for the first of its `metadata["sources"]` that is a candidate no
    other hit already stands for. Hits with neither are left out.
    """
    where = {mid: i for i, mid in enumerate(ids)}
    taken = {where[h.memory.id] for h in retrieval.hits if h.memory.id in where}
    for hit in retrieval.hits:
        mem = hit.memory
        if mem.id not in where:
            for src in mem.metadata.get("sources") or ():
                if src in where and where[src] not in taken:
                    where[mem.id] = where[src]
                    taken.add(where[src])
                    break
    return where
