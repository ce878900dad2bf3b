"""`bench li-memory`: LlamaIndex `Memory` with our chat store and block, one long session.

The README's setup (`Memory.from_defaults(session_id=..., chat_store=ReflectiveDBChatStore(...),
memory_blocks=[ReflectiveMemoryBlock(...)], token_limit=...)`) takes `--messages` messages of
one session, user and assistant in turn, each a few sentences long, so `Memory` flushes its
oldest messages to the block again and again. Reported: the turns the core holds afterwards
(one per message is right), `Memory.put` p50 / p95, and, interleaved so both see the same
load, `ReflectiveMemory.add_turn` of the same texts on a second memory: the price of the
framework's own bookkeeping over storing the turn.

    reflective-memory bench li-memory --messages 1000
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

import numpy as np
from reflective_memory.errors import InvalidInputError

__all__ = ["time_llamaindex_memory", "register"]

logger = logging.getLogger(__name__)

_TOPICS = (
    "my garden and the tomatoes I grow every summer",
    "the new job at the hospital and its night shifts",
    "training for the Oslo half marathon in the spring",
    "my sister's wedding in Porto next June",
    "the cello lessons I started in January",
    "a trip to Kyoto with two friends from school",
)


def _message(rng: random.Random, i: int) -> str:
    topic = rng.choice(_TOPICS)
    return f"({i}) Let me tell you more about {topic}. " * rng.randint(1, 4)


def time_llamaindex_memory(
    embedder: Any, messages: int, token_limit: int, seed: int = 0
) -> dict[str, Any]:
    """Put `messages` messages through LlamaIndex `Memory` and store the same as core turns.

    Args:
        embedder: The embedder of both memories.
        messages: Messages to put (user and assistant in turn).
        token_limit: `Memory`'s token limit (it flushes above `token_limit * 0.7`).
        seed: Seed of the message texts.

    Returns:
        The core turns stored, `Memory.put` and `add_turn` p50 / p95 in ms, their p50 ratio.
    """
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.memory import Memory
    from reflective_memory import ReflectiveMemory

    from llamaindex_reflective import ReflectiveDBChatStore, ReflectiveMemoryBlock

    rng = random.Random(seed)
    texts = [_message(rng, i) for i in range(messages)]
    with ReflectiveMemory(embedder=embedder) as mem, ReflectiveMemory(embedder=embedder) as core:
        memory = Memory.from_defaults(
            session_id="long",
            chat_store=ReflectiveDBChatStore(memory=mem, user_id="ana"),
            memory_blocks=[ReflectiveMemoryBlock(memory=mem, user_id="ana")],
            token_limit=token_limit,
        )
        put, add = [], []
        for i, text in enumerate(texts):
            role = "user" if i % 2 == 0 else "assistant"
            t0 = time.perf_counter()
            memory.put(ChatMessage(role=role, content=text))
            t1 = time.perf_counter()
            core.add_turn("ana", "long", role, text)
            t2 = time.perf_counter()
            put.append((t1 - t0) * 1000)
            add.append((t2 - t1) * 1000)
        stored = len(mem.turns("ana"))
    return {
        "messages": messages,
        "core_turns": stored,
        "put_ms": {"p50": float(np.median(put)), "p95": float(np.percentile(put, 95))},
        "add_turn_ms": {"p50": float(np.median(add)), "p95": float(np.percentile(add, 95))},
        "ratio_p50": float(np.median(put) / np.median(add)),
    }


def _run(args: argparse.Namespace) -> int:
    from reflective_memory import HashingEmbedder
    from reflective_memory.embed import SentenceTransformerEmbedder

    if args.messages < 2 or args.token_limit < 100:
        raise InvalidInputError("--messages needs at least 2 and --token-limit at least 100")
    embedder = HashingEmbedder(256) if args.embedder == "hashing" else SentenceTransformerEmbedder()
    r = time_llamaindex_memory(embedder, args.messages, args.token_limit)
    p, a = r["put_ms"], r["add_turn_ms"]
    print(  # noqa: T201
        f"{r['messages']} messages put, {r['core_turns']} core turns; Memory.put p50 "
        f"{p['p50']:.1f} ms, p95 {p['p95']:.1f} ms; add_turn p50 {a['p50']:.1f} ms, "
        f"p95 {a['p95']:.1f} ms; put p50 / add_turn p50 = {r['ratio_p50']:.2f}"
    )
    return 0


def register(bench: Any) -> None:
    """Add `bench li-memory` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "li-memory",
        help="LlamaIndex Memory + our chat store and block: turns stored and put latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--messages", type=int, default=1000, help="messages put (>= 2)")
    p.add_argument("--token-limit", type=int, default=4000, help="Memory's token_limit")
    p.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    p.set_defaults(func=_run)
