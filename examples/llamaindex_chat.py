"""A LlamaIndex chat engine with long-term memory from reflective-memory.

Seven past sessions of the bundled demo conversation (user `maya`) are stored through the chat
store; a new chat then runs with LlamaIndex's `Memory`, whose `ReflectiveMemoryBlock` puts the
relevant long-term memories, numbered for citation, into the system message.

    python examples/llamaindex_chat.py                      # offline (MiniLM + extractive LLM)
    python examples/llamaindex_chat.py --embedder hashing   # no model at all (fast)
    python examples/llamaindex_chat.py --openai gpt-4o-mini # a real LLM (needs
        # llama-index-llms-openai and OPENAI_API_KEY)

Offline, a small extractive stand-in (`examples/_offline.py`) answers with the memory line that
best matches the message and cites that memory, so the feedback trains the reranker on a real
citation.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the examples' shared helpers
from _offline import llamaindex_llm  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import Memory
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

from llamaindex_reflective import (
    ReflectiveChatStore,
    ReflectiveDBChatStore,
    ReflectiveMemoryBlock,
)

USER = "maya"


def make_llm(openai_model: str | None):
    """The offline extractive LLM, or an OpenAI model (needs llama-index-llms-openai)."""
    if openai_model is None:
        return llamaindex_llm()
    from llama_index.llms.openai import OpenAI  # type: ignore[import-not-found]

    return OpenAI(model=openai_model)


def load_history(memory: ReflectiveMemory) -> int:
    """Store the demo's past sessions through the chat store and end them (builds memories)."""
    data = json.loads(
        resources.files("reflective_memory")
        .joinpath("data/demo_conversation.json")
        .read_text("utf-8")
    )
    history = ReflectiveChatStore(memory=memory, user_id=USER)
    for session in data["sessions"]:
        for turn in session["turns"]:
            history.add_message(
                session["session_id"],
                ChatMessage(
                    role=turn["role"],
                    content=turn["text"],
                    additional_kwargs={"timestamp": turn["timestamp"]},
                ),
            )
        history.end_session(session["session_id"])
    return len(data["sessions"])


def main(argv: list[str] | None = None) -> int:
    """Load the history, chat once, print the reply and what the memory block retrieved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message", default="Remind me, where am I living these days?")
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--openai", metavar="MODEL", default=None, help="use an OpenAI model")
    args = parser.parse_args(argv)

    embedder = HashingEmbedder(256) if args.embedder == "hashing" else None
    config = MemoryConfig()  # the defaults: turns searchable at once, segments for context
    with ReflectiveMemory(embedder=embedder, config=config) as memory:
        n = load_history(memory)
        block = ReflectiveMemoryBlock(memory=memory, user_id=USER, priority=1)
        chat_memory = Memory.from_defaults(
            session_id="2025-11-21-chat",
            chat_store=ReflectiveDBChatStore(memory=memory, user_id=USER),
            memory_blocks=[block],
            token_limit=4000,
        )
        engine = SimpleChatEngine.from_defaults(llm=make_llm(args.openai), memory=chat_memory)
        reply = engine.chat(args.message)
        print(f"stored {n} past sessions; {memory.stats(USER)['memories']} memories")
        print("user:", args.message)
        print("assistant:", str(reply).strip()[:1500])
        hits = block.last_retrieval.hits if block.last_retrieval is not None else []
        print("memories used:", [h.memory.turn_ids[0] for h in hits])
        report = block.feedback(str(reply))
        print(f"feedback: cited {list(report.cited)}, learned {report.learned}", report.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
