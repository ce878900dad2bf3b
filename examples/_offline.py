"""Offline stand-ins for an LLM, shared by the examples (not part of the library).

`extractive_answer` is the whole "model": it reads the numbered memories (or LlamaIndex's
`Source N:` blocks) in a prompt, picks the line that shares the most content words with the
question, and answers with that line, citing the memory it came from. Never the instructions:
only the memory blocks are read. `llamaindex_llm()` wraps it as a LlamaIndex LLM; the LangChain
examples wrap it in their own scripted chat models. Set `REFLECTIVE_CHAT_MODEL` (an
`init_chat_model` name) to use a real model in the LangChain examples instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

STOPWORDS = set(
    "a an and the i im me my is am are was to of in on at for what which where who how do".split()
)
# Question words that say nothing about which memory answers it.
_QUESTION_NOISE = set(
    "does did you your it its this that these those be been can could would should will with "
    "about remind now day".split()
)
_ROLE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?(?:user|assistant|human|ai|system)\s*:\s*", re.I)
_NO_ANSWER = "I don't know that from what I remember. [NO_CITE]"


def words(text: str) -> set[str]:
    """Content words, crudely stemmed (enough for the offline demo models)."""
    return {w.rstrip("s") for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS}


def numbered_memories(prompt: str) -> dict[int, list[str]]:
    """The numbered memories in a prompt, in either of the library's citation formats."""
    blocks: dict[int, list[str]] = {}
    current: int | None = None
    for line in prompt.splitlines():
        start = re.match(r"^(?:=== Memory \[(\d+)\] ===|\[(\d+)\] (.*))$", line)
        if start:
            current = int(start.group(1) or start.group(2))
            blocks[current] = [start.group(3)] if start.group(3) else []
        elif line.startswith("=== end of memory"):
            current = None
        elif current is not None and line[:1] in ("|", " ") and line.strip():
            blocks[current].append(line.lstrip("| ").strip())
        else:
            current = None
    return blocks


def citation_sources(prompt: str) -> dict[int, list[str]]:
    """The `Source N:` blocks of a LlamaIndex citation prompt (instructions and examples skipped).

    LlamaIndex's `CitationQueryEngine` prompt shows a worked example before the real sources;
    only the blocks after the last example's answer are returned.
    """
    body = prompt.split("Now it's your turn.")[-1]
    blocks: dict[int, list[str]] = {}
    current: int | None = None
    for line in body.splitlines():
        start = re.match(r"^Source (\d+):\s*(.*)$", line)
        if start:
            current = int(start.group(1))
            blocks[current] = [start.group(2)] if start.group(2).strip() else []
        elif re.match(r"^(Query|Answer):", line):
            current = None
        elif current is not None and line.strip():
            blocks[current].append(line.strip())
    return blocks


def last_question(prompt: str) -> str:
    """The user's question in a prompt: the last `Query:` or `user:` line."""
    found = re.findall(r"^(?:Query|user|User|Human|human):\s*(.+)$", prompt, re.M)
    return found[-1].strip() if found else ""


def _stems(text: str) -> set[str]:
    """Content words with common English endings cut ("living", "lives", "live" -> "liv")."""
    out = set()
    for w in words(text) - _QUESTION_NOISE:
        for end in ("ing", "ed", "es", "e"):
            if len(w) > len(end) + 2 and w.endswith(end):
                w = w[: -len(end)]
                break
        out.add(w)
    return out


def extractive_answer(question: str, sources: dict[int, list[str]]) -> str:
    """Answer with the source line that best matches the question, citing its number.

    Args:
        question: What was asked.
        sources: Numbered sources, each a list of lines (its number is what gets cited).

    Returns:
        `"<best line> [i]"`, or an admission with `[NO_CITE]` when no line shares a content word
        with the question. Ties go to the newer memory (by the date that heads its text), then
        to the earlier source (the better ranked memory).
    """
    wanted = _stems(question)
    best: tuple[int, str, int, str] | None = None
    for number, lines in sources.items():
        dated = re.match(r"^\[(\d{4}-\d{2}-\d{2})", lines[0]) if lines else None
        date = dated.group(1) if dated else ""
        for line in lines:
            text = _ROLE.sub("", line).strip()
            if not text or text.startswith("["):
                continue
            overlap = len(wanted & _stems(text))
            # more shared words first; on a tie the newer memory (what is true now), then rank
            if overlap and (best is None or (overlap, date) > (best[0], best[1])):
                best = (overlap, date, number, text)
    if best is None:
        return _NO_ANSWER
    return f"{best[3]} [{best[2]}]"


def answer_prompt(prompt: str) -> str:
    """The offline model's reply to a whole prompt (memory or citation-source format)."""
    sources = citation_sources(prompt) if re.search(r"^Source \d+:", prompt, re.M) else {}
    if not sources:
        sources = numbered_memories(prompt)
    return extractive_answer(last_question(prompt), sources)


def llamaindex_llm() -> Any:
    """`extractive_answer` as a LlamaIndex LLM (completion and chat)."""
    from llama_index.core.llms import (
        CompletionResponse,
        CompletionResponseGen,
        CustomLLM,
        LLMMetadata,
    )
    from llama_index.core.llms.callbacks import llm_completion_callback

    class ExtractiveLLM(CustomLLM):
        """Offline LLM: answers with the best-matching memory line and cites it."""

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name="offline-extractive")

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            return CompletionResponse(text=answer_prompt(prompt))

        @llm_completion_callback()
        def stream_complete(
            self, prompt: str, formatted: bool = False, **kw: Any
        ) -> CompletionResponseGen:
            text = answer_prompt(prompt)
            yield CompletionResponse(text=text, delta=text)

    return ExtractiveLLM()


def chat_model(offline: Callable[[], BaseChatModel]) -> BaseChatModel:
    """The model named by `REFLECTIVE_CHAT_MODEL` (an `init_chat_model` name), else `offline()`."""
    name = os.environ.get("REFLECTIVE_CHAT_MODEL")
    if name:
        from langchain.chat_models import init_chat_model

        return init_chat_model(name)
    return offline()
