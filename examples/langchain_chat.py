"""A chat assistant with long-term memory, three ways, on LangChain.

1. A `create_agent` agent that gains memory from one object: `ReflectiveMemoryMiddleware`.
2. A classic `ConversationChain` with `ReflectiveChatMemory`.
3. Retrieval-augmented answering over `ReflectiveRetriever`, reranked by `ReflectiveCompressor`.

Runs offline by default: a small scripted chat model stands in for an LLM (it answers from the
memories it is shown and cites them). To use a real model, install its LangChain integration and
name it, e.g.::

    export REFLECTIVE_CHAT_MODEL="openai:gpt-4o-mini"   # any init_chat_model string
    python examples/langchain_chat.py

Options: `--embedder hashing` (fast, no model load) or the default bundled all-MiniLM-L6-v2;
`--path DIR` keeps the memory on disk between runs.
"""

from __future__ import annotations

import argparse
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from langchain_reflective import (
    LangChainLLM,
    ReflectiveChatMemory,
    ReflectiveCompressor,
    ReflectiveMemoryMiddleware,
    ReflectiveRetriever,
)
from shared import HashingEmbedder, MemoryConfig, ReflectiveMemory

USER = "ana"

FIRST_SESSION = [
    "Hi! I just adopted a grey cat named Miso.",
    "I'm also training for the Lyon half marathon in April.",
    "Work is busy: I started as a nurse at the city hospital.",
]
QUESTIONS = [
    "What is my cat called?",
    "Which race am I training for?",
]


class ScriptedChatModel(BaseChatModel):
    """Offline stand-in for an LLM: answers from the first memory it is shown, citing it."""

    @property
    def _llm_type(self) -> str:
        return "scripted-memory-demo"

    def _generate(
        self, messages: list[BaseMessage], stop: Sequence[str] | None = None, **kw: Any
    ) -> ChatResult:
        context = "\n".join(str(m.text) for m in messages if isinstance(m, SystemMessage))
        if not context:  # a classic chain sends one prompt with the memories inside
            context = str(messages[-1].text)
        match = re.search(
            r"(?:\[0\]|Memory \[0\] ===)\s*(.*?)(?:\n\s*\[1\]|=== end|\Z)", context, re.S
        )
        if match is None:
            reply = "Thanks, I'll remember that. [NO_CITE]"
        else:
            said = [ln for ln in match.group(1).splitlines() if "user:" in ln]
            fact = said[0].split("user:", 1)[1].strip() if said else match.group(1).strip()
            reply = f'You told me: "{fact}" [0]'
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])


def chat_model() -> BaseChatModel:
    """The configured real model (`REFLECTIVE_CHAT_MODEL`), else the offline scripted one."""
    name = os.environ.get("REFLECTIVE_CHAT_MODEL")
    if name:
        from langchain.chat_models import init_chat_model

        return init_chat_model(name)
    return ScriptedChatModel()


def run(embedder: str = "minilm", path: str | None = None) -> dict[str, Any]:
    """Run the three demos and return what they produced (also printed)."""
    model = chat_model()
    memory = ReflectiveMemory(
        path,
        embedder=HashingEmbedder() if embedder == "hashing" else None,
        llm=LangChainLLM(model),
        config=MemoryConfig(granularities=("turn", "segment")),
    )
    out: dict[str, Any] = {"agent": [], "chain": [], "rag": []}
    with memory:
        # 1. create_agent + middleware: one object gives the agent long-term memory.
        middleware = ReflectiveMemoryMiddleware(memory=memory, user_id=USER, session_id="day-1")
        agent = create_agent(
            model, system_prompt="You are a friendly assistant.", middleware=[middleware]
        )
        for text in FIRST_SESSION:
            agent.invoke({"messages": [("user", text)]})
        middleware.end_session("day-2")  # the first session becomes memories
        for question in QUESTIONS:
            answer = agent.invoke({"messages": [("user", question)]})["messages"][-1].text
            out["agent"].append(answer)
            print(f"[agent] {question}\n        {answer}")

        # 2. Classic chain with ReflectiveChatMemory.
        from langchain_classic.chains import ConversationChain

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConversationChain itself is deprecated upstream
            chain = ConversationChain(
                llm=model,
                memory=ReflectiveChatMemory(memory=memory, user_id=USER, session_id="day-3"),
            )
            answer = chain.invoke({"input": "Remind me where I work?"})["response"]
        out["chain"].append(answer)
        print(f"[chain] Remind me where I work?\n        {answer}")

        # 3. RAG over the retriever, reranked by the citation-trained compressor.
        retriever = ReflectiveRetriever(memory=memory, user_id=USER, k=8)
        compressor = ReflectiveCompressor(memory=memory, user_id=USER, top_n=2)
        query = "half marathon training"
        docs = compressor.compress_documents(retriever.invoke(query), query)
        for d in docs:
            out["rag"].append(d.metadata)
            said = [ln for ln in d.page_content.splitlines() if ln.startswith("user:")]
            first = said[0] if said else d.page_content.splitlines()[-1]
            print(
                f"[rag] {d.metadata['granularity']:8s} {d.metadata['session_id']:6s} {first[:70]}"
            )
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
