"""A classic LangChain conversation chain with long-term memory: `ReflectiveChatMemory`.

Day 1 the user chats; the session is then closed and becomes memories. Day 2 a new session asks
about day 1: before each call the chain's memory retrieves the relevant memories and puts them,
numbered for citation, into the prompt; after the call it records the exchange and forwards the
answer's citations to the engine's reranker (`memory.feedback`).

Runs offline by default: a small scripted chat model stands in for the LLM (it answers from the
memory in its prompt that best matches the question, and cites it). To use a real model, install
its LangChain integration, set its API key and name it with any `init_chat_model` string::

    pip install langchain-openai && export OPENAI_API_KEY=...
    export REFLECTIVE_CHAT_MODEL="openai:gpt-4o-mini"
    python examples/langchain_classic_chain.py

Options: `--embedder hashing` (fast, no model load; retrieval is then word-overlap quality) or
the default bundled all-MiniLM-L6-v2; `--path DIR` keeps the memory on disk between runs.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the examples' shared helpers
from _offline import chat_model as _configured_model
from _offline import numbered_memories, words  # noqa: E402
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from reflective_memory import HashingEmbedder, ReflectiveMemory

from langchain_reflective import LangChainLLM, ReflectiveChatMemory

USER = "ana"
DAY_1 = [
    "Hi! I just adopted a grey cat named Miso.",
    "I'm also training for the Lyon half marathon in April.",
    "Work is busy: I started as a nurse at the city hospital.",
]
DAY_2 = [
    "What is my cat called?",
    "Which race am I training for?",
    "Remind me where I work?",
]


class ScriptedChatModel(BaseChatModel):
    """Offline stand-in for an LLM: quotes the memory line that best matches the question."""

    @property
    def _llm_type(self) -> str:
        return "scripted-memory-demo"

    def _generate(
        self, messages: list[BaseMessage], stop: Sequence[str] | None = None, **kw: Any
    ) -> ChatResult:
        prompt = "\n".join(str(m.text) for m in messages)
        asked = re.findall(r"^Human: (.*)$", prompt, re.M)
        question = words(asked[-1] if asked else prompt)
        best: tuple[int, int, str] | None = None
        for i, lines in numbered_memories(prompt).items():
            for line in lines:
                overlap = len(question & words(line))
                if overlap and (best is None or overlap > best[0]):
                    best = (overlap, i, re.sub(r"^(user|assistant): ", "", line))
        if best is None:
            reply = "Thanks for telling me, I'll remember that. [NO_CITE]"
        else:
            reply = f'You told me: "{best[2]}" [{best[1]}]'
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])


def chat_model() -> BaseChatModel:
    """The model named by `REFLECTIVE_CHAT_MODEL` (an `init_chat_model` string), else offline."""
    return _configured_model(ScriptedChatModel)


def run(embedder: str = "minilm", path: str | None = None) -> dict[str, Any]:
    """Chat on day 1, close the session, ask about it on day 2; return what happened."""
    from langchain_classic.chains import ConversationChain

    model = chat_model()
    memory = ReflectiveMemory(
        path,
        embedder=HashingEmbedder() if embedder == "hashing" else None,
        # A real model also segments sessions and writes memories; offline the core's own
        # fallbacks do that.
        llm=None if isinstance(model, ScriptedChatModel) else LangChainLLM(model),
    )
    out: dict[str, Any] = {"day_1": [], "day_2": []}
    with memory, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConversationChain itself is deprecated upstream
        chat_memory = ReflectiveChatMemory(
            memory=memory,
            user_id=USER,
            session_id="day-1",
            idle_timeout_seconds=30 * 60,  # a pause of 30 minutes also starts a new session
        )
        chain = ConversationChain(llm=model, memory=chat_memory)
        for text in DAY_1:
            out["day_1"].append(chain.invoke({"input": text})["response"])
        built = chat_memory.end_session("day-2")  # day 1 becomes long-term memories
        print(f"day 1 closed: {len(built)} memories built")
        for question in DAY_2:
            answer = chain.invoke({"input": question})["response"]
            out["day_2"].append(answer)
            print(f"Q: {question}\nA: {answer}")
        out["stats"] = memory.stats(USER)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--path", default=None, help="keep the memory in this directory")
    args = parser.parse_args(argv)
    run(args.embedder, args.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
