"""The block of memories every surface shows its model: one numbering, one instruction, a budget.

The LangChain middleware and chat memory, the LlamaIndex memory block and the MCP `recall` tool
all put a user's memories in front of a model the same way: an instruction to cite, then the
memories numbered from `[0]`, each as `[i] ` and its text with every further line indented, so
no memory line starts a line of the block, and citation-shaped brackets inside a memory shown
with parentheses (`rmm.citations.neutralise_citations`), so its content cannot forge a memory
or a citation. `ReflectiveMemory.feedback` parses the answer's citations.

A surface given a token budget keeps the *whole block* within it: the instruction and the
numbering are paid from the budget, so the passages get what is left (`fit_block`). Tokens are
counted by `reflective_memory.llm.count_tokens`, the rule of every budget in the library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from reflective_memory.framing import frame_lines
from reflective_memory.llm import count_tokens
from reflective_memory.rmm.citations import (
    memory_text,
    neutralise_citations,
    register_instructions,
)
from reflective_memory.types import Hit, Memory, Retrieval
from reflective_memory.validation import check_positive

__all__ = ["CITATION_INSTRUCTION", "memory_block", "fit_block", "shown_memories"]

#: Told to the model above the numbered memories, on every surface.
CITATION_INSTRUCTION = (
    "Numbered memories from earlier conversations with this user. Use them only if they help; "
    "cite the ones you use by number, e.g. [0] or [0, 2], or write [NO_CITE] if none helped."
)

register_instructions(CITATION_INSTRUCTION)

#: Retrievals `fit_block` makes at most before it drops the lowest-ranked memories instead.
_FIT_ROUNDS = 3


def memory_block(
    memories: Sequence[Hit | Memory | str], instruction: str | None = CITATION_INSTRUCTION
) -> str:
    r"""Number memories for citation, `[0]` first, under an optional instruction.

    Args:
        memories: Hits or memories in the order they are shown.
        instruction: Text placed above the list (`None`: no header).

    Returns:
        The block, or "" when there are no memories.

    Example:
        >>> from datetime import datetime
        >>> t = datetime(2024, 1, 1)
        >>> m = Memory("m1", "u", "s", "turn", "user: I like tea", "k", ("s:0",), t, t)
        >>> moved = "[2025-03-01 (Sat) 09:30]\nuser: I moved [1] to Oslo"
        >>> print(memory_block([m, moved], instruction=None))
        [0] user: I like tea
        [1] [2025-03-01 (Sat) 09:30]
            user: I moved (1) to Oslo
    """
    if not memories:
        return ""
    body = "\n".join(_entry(i, item) for i, item in enumerate(memories))
    return body if instruction is None else f"{instruction}\n\n{body}"


def _entry(i: int, item: Hit | Memory | str) -> str:
    return f"[{i}] {frame_lines(neutralise_citations(memory_text(item)))}"


def fit_block(
    fetch: Callable[[int], Retrieval],
    budget_tokens: int,
    instruction: str | None = CITATION_INSTRUCTION,
) -> tuple[Retrieval, str]:
    """Retrieve memories whose whole block (instruction and numbering too) fits a budget.

    The first retrieval gets the budget less the instruction; when the framed block is still
    over, the next one gets the budget less what the block added to the memories it returned
    (the instruction and their numbering), up to three retrievals. If the block is over even
    then, the lowest-ranked memories are dropped until it fits (the retrieval's hits are cut to
    match, so feedback sees what was shown).

    Args:
        fetch: Retrieves with a passage budget in tokens (e.g.
            `lambda n: memory.retrieve(user, query, budget_tokens=n)`).
        budget_tokens: The budget of the whole block.
        instruction: The instruction above the memories (`None`: none).

    Returns:
        The retrieval (its hits the ones shown) and the block ("" when nothing fits).

    Raises:
        InvalidInputError: `budget_tokens` is not a positive integer.
    """
    check_positive("budget_tokens", budget_tokens)
    room = budget_tokens - (count_tokens(instruction) if instruction else 0)
    retrieval = fetch(max(room, 1))
    for _ in range(_FIT_ROUNDS - 1):
        framed = count_tokens(memory_block(retrieval.hits, instruction))
        if framed <= budget_tokens:
            break
        # what the block adds to its memories' text (the instruction, the numbering)
        frame = framed - sum(count_tokens(h.memory.text) for h in retrieval.hits)
        room = min(room - 1, budget_tokens - frame)
        if room < 1:
            break
        retrieval = fetch(room)
    hits = list(retrieval.hits)
    block = memory_block(hits, instruction)
    while hits and count_tokens(block) > budget_tokens:
        hits.pop()
        block = memory_block(hits, instruction)
    if len(hits) < len(retrieval.hits):
        retrieval = dataclasses.replace(retrieval, hits=hits)
    return retrieval, block


def shown_memories(
    memory: Any,
    user_id: str,
    query: str,
    *,
    k: int | None,
    budget_tokens: int | None,
    instruction: str | None,
    exclude_turns: Sequence[str],
    now: Any = None,
    message: bool = False,
) -> tuple[Retrieval, str]:
    """Retrieve the memories a model is shown and their numbered block.

    With `k` alone, the top `k` turns. With `budget_tokens` (and `k`: at most `k` hits),
    passages whose whole block (instruction and numbering too) fits it, as `fit_block` makes
    it. With neither, passages filling the core's `search.default_budget_tokens` (500), the
    instruction and numbering on top (about 60 tokens, and 25 a memory): the measured default
    keeps its passages whole. `now` is `retrieve`'s (None: the newest turn's time).

    With `message`, `query` is a user's chat message (the adapters search with the latest one):
    a message longer than `search.max_query_chars` is searched by its opening, so a pasted
    document never stops the conversation; otherwise such a query raises `InvalidInputError`.
    """
    if message:
        query = query[: memory.config.search.max_query_chars]
    if budget_tokens is None:
        retrieval = memory.retrieve(user_id, query, k=k, exclude_turns=exclude_turns, now=now)
        return retrieval, memory_block(retrieval.hits, instruction)
    return fit_block(
        lambda n: memory.retrieve(
            user_id, query, k=k, budget_tokens=n, exclude_turns=exclude_turns, now=now
        ),
        budget_tokens,
        instruction,
    )
