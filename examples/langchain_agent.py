"""A LangChain 1.x agent (`create_agent`) with long-term memory and a LangGraph store.

Two pieces, each one object:

* `ReflectiveMemoryMiddleware` in `middleware=[...]`: before the model is called the user's
  relevant memories are put into the system message (numbered, with an instruction to cite
  them); every exchange is recorded; closed sessions become memories.
* `ReflectiveStore` as `store=...`: tools read and write items with `runtime.store` (or
  `langgraph.config.get_store()`). Namespaces start with the user id, so `("ana", "facts")` holds
  facts about `ana`. Items are memories of that user too, so the middleware recalls them.

Runs offline by default: a small scripted tool-calling model stands in for the LLM (it saves
facts the user asks it to remember with the `save_fact` tool, lists them with `list_facts`, and
otherwise answers from the memory in its system message that best matches the question, citing
it). To use a real model, install its LangChain integration, set its API key and name it with any
`init_chat_model` string::

    pip install langchain-openai && export OPENAI_API_KEY=...
    export REFLECTIVE_CHAT_MODEL="openai:gpt-4o-mini"
    python examples/langchain_agent.py

Options: `--embedder hashing` (fast, no model load) or the default bundled all-MiniLM-L6-v2;
`--path DIR` keeps memories and store items on disk between runs.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the examples' shared helpers
from _offline import chat_model as _configured_model
from _offline import numbered_memories, words  # noqa: E402
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from reflective_memory import HashingEmbedder, ReflectiveMemory

from langchain_reflective import LangChainLLM, ReflectiveMemoryMiddleware, ReflectiveStore

USER = "ana"
DAY_1 = [
    "Hi! I just adopted a grey cat named Miso.",
    "Remember: my sister Lea lives in Porto.",
    "I'm also training for the Lyon half marathon in April.",
]
DAY_2 = [
    "What is my cat called?",
    "Which city does my sister live in?",
    "What do you know about me?",
]


@dataclass
class UserContext:
    """Per-run context: who the agent is talking to."""

    user_id: str


def save_fact(fact: str, runtime: ToolRuntime[UserContext]) -> str:
    """Save a lasting fact about the user (people, preferences, plans) to long-term memory."""
    key = hashlib.sha256(fact.strip().lower().encode()).hexdigest()[:12]
    runtime.store.put((runtime.context.user_id, "facts"), key, {"fact": fact.strip()})
    return f"Saved: {fact.strip()}"


def list_facts(runtime: ToolRuntime[UserContext]) -> str:
    """List the facts saved about the user."""
    items = runtime.store.search((runtime.context.user_id, "facts"), limit=50)
    return "\n".join(f"- {item.value['fact']}" for item in items) or "No facts saved yet."


class ScriptedAgentModel(BaseChatModel):
    """Offline stand-in for a tool-calling LLM (see the module documentation)."""

    @property
    def _llm_type(self) -> str:
        return "scripted-agent-demo"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedAgentModel:  # type: ignore[override]
        """Tools are chosen by the script; nothing to bind."""
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Sequence[str] | None = None, **kw: Any
    ) -> ChatResult:
        last = messages[-1]
        said = str(last.text)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"{said} [NO_CITE]")
        elif isinstance(last, HumanMessage) and said.lower().startswith("remember:"):
            fact = said.split(":", 1)[1].strip()
            call = {"name": "save_fact", "args": {"fact": fact}, "id": f"save-{len(messages)}"}
            reply = AIMessage(content="", tool_calls=[call])
        elif isinstance(last, HumanMessage) and "know about me" in said.lower():
            call = {"name": "list_facts", "args": {}, "id": f"list-{len(messages)}"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content=self._answer(messages, said))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    @staticmethod
    def _answer(messages: list[BaseMessage], question: str) -> str:
        system = "\n".join(str(m.text) for m in messages if isinstance(m, SystemMessage))
        wanted = words(question)
        best: tuple[int, int, str] | None = None
        for i, lines in numbered_memories(system).items():
            for line in lines:
                overlap = len(wanted & words(line))
                if overlap and (best is None or overlap > best[0]):
                    best = (overlap, i, re.sub(r"^(user|assistant|fact): ", "", line))
        if best is None:
            return "Nice to hear, tell me more! [NO_CITE]"
        return f'You told me: "{best[2]}" [{best[1]}]'


def chat_model() -> BaseChatModel:
    """The model named by `REFLECTIVE_CHAT_MODEL` (an `init_chat_model` string), else offline."""
    return _configured_model(ScriptedAgentModel)


def run(embedder: str = "minilm", path: str | None = None) -> dict[str, Any]:
    """Talk to the agent on day 1, close the session, ask about it on day 2."""
    model = chat_model()
    memory = ReflectiveMemory(
        path,
        embedder=HashingEmbedder() if embedder == "hashing" else None,
        llm=None if isinstance(model, ScriptedAgentModel) else LangChainLLM(model),
    )
    out: dict[str, Any] = {"day_1": [], "day_2": []}
    with memory:
        middleware = ReflectiveMemoryMiddleware(memory=memory, user_id=USER, session_id="day-1")
        agent = create_agent(
            model,
            tools=[save_fact, list_facts],
            system_prompt="You are a friendly assistant. Save lasting facts with save_fact.",
            middleware=[middleware],
            store=ReflectiveStore(memory=memory),  # namespaces: (user_id, ...)
            context_schema=UserContext,
        )
        context = UserContext(user_id=USER)

        def ask(text: str) -> str:
            state = agent.invoke({"messages": [("user", text)]}, context=context)
            return str(state["messages"][-1].text)

        for text in DAY_1:
            out["day_1"].append(ask(text))
        built = middleware.end_session("day-2")  # day 1 becomes long-term memories
        print(f"day 1 closed: {len(built)} memories built")
        for question in DAY_2:
            answer = ask(question)
            out["day_2"].append(answer)
            print(f"Q: {question}\nA: {answer}")
        out["facts"] = [m.text for m in memory.memories(USER) if m.granularity == "item"]
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
