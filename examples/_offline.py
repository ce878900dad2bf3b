"""Helpers shared by the LangChain examples' offline stand-in models (not part of the library)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from langchain_core.language_models import BaseChatModel

STOPWORDS = set(
    "a an and the i im me my is am are was to of in on at for what which where who how do".split()
)


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


def chat_model(offline: Callable[[], BaseChatModel]) -> BaseChatModel:
    """The model named by `REFLECTIVE_CHAT_MODEL` (an `init_chat_model` name), else `offline()`."""
    name = os.environ.get("REFLECTIVE_CHAT_MODEL")
    if name:
        from langchain.chat_models import init_chat_model

        return init_chat_model(name)
    return offline()
