"""A retrieval-augmented chat app over a user's past conversations, on LangChain.

* Past conversations (dated turns) are stored in the core and closed into memories.
* `ReflectiveRetriever` fetches candidate memories; `CitationReranker` (in LangChain's
  `ContextualCompressionRetriever`) keeps the best few; the model answers from them, numbered,
  citing what it used as `[i]`.
* Today's chat is kept in a `ReflectiveChatMessageHistory`, so it is durable too and becomes
  memories when the session is closed.
* After each answer, `CitationReranker.feedback` turns the citations into training signal for
  the user's reranker: the engine's own, the one `memory.retrieve` applies, saved with the store
  (one update per `rerank_batch_size` answers; the report says what it did).

Runs offline by default: a small scripted chat model stands in for the LLM (it quotes the
numbered memory that best matches the question and cites it). To use a real model, install its
LangChain integration, set its API key and name it with any `init_chat_model` string::

    pip install langchain-openai && export OPENAI_API_KEY=...
    export REFLECTIVE_CHAT_MODEL="openai:gpt-4o-mini"
    python examples/langchain_rag_chat.py

Options: `--embedder hashing` (fast, no model load) or the default bundled all-MiniLM-L6-v2;
`--path DIR` keeps the memory on disk between runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the examples' shared helpers
from _offline import chat_model as _configured_model  # noqa: E402
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from reflective_memory import HashingEmbedder, ReflectiveMemory

from langchain_reflective import (
    CitationReranker,
    LangChainLLM,
    ReflectiveChatMessageHistory,
    ReflectiveRetriever,
)

USER = "ana"
PAST_SESSIONS = {
    "2024-03-01": [
        ("user", "I adopted a grey cat named Miso last week."),
        ("assistant", "Congratulations! How is Miso settling in?"),
        ("user", "Miso loves sleeping on the radiator."),
    ],
    "2024-03-05": [
        ("user", "I'm training for the Lyon half marathon in April."),
        ("assistant", "Great goal. How far are your long runs?"),
        ("user", "My long run this Sunday is 18 kilometres."),
    ],
    "2024-03-09": [
        ("user", "I switched jobs: I now work as a nurse at the city hospital."),
        ("assistant", "A big change! Night shifts too?"),
        ("user", "Yes, two night shifts a week, which makes training hard."),
    ],
}
QUESTIONS = [
    "Where does my cat love to sleep?",
    "How long is my long run on Sunday?",
    "Where do I work now?",
]
SYSTEM = (
    "You are a helpful assistant with memories of earlier conversations with this user. "
    "Answer from the numbered memories below when they help and cite each one you use by its "
    "number in square brackets, e.g. [0] or [0, 2]. If none helped, end with [NO_CITE].\n\n"
    "{context}"
)

_STOP = set(
    (
        "a an and the i im me my is am are was to of in on at for what which where who how do does"
    ).split()
)


def _words(text: str) -> set[str]:
    """Content words, crudely stemmed (enough for the offline demo model)."""
    return {w.rstrip("s")[:5] for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def format_documents(docs: Sequence[Document]) -> str:
    """Number documents for citation: `[i]` then the memory text, indented."""
    return "\n".join(
        f"[{i}] " + "\n    ".join(d.page_content.splitlines() or [""]) for i, d in enumerate(docs)
    )


class ScriptedChatModel(BaseChatModel):
    """Offline stand-in for an LLM: quotes the numbered memory line that best fits the question."""

    @property
    def _llm_type(self) -> str:
        return "scripted-rag-demo"

    def _generate(
        self, messages: list[BaseMessage], stop: Sequence[str] | None = None, **kw: Any
    ) -> ChatResult:
        system = "\n".join(str(m.text) for m in messages if isinstance(m, SystemMessage))
        asked = [m for m in messages if isinstance(m, HumanMessage)]
        wanted = _words(str(asked[-1].text)) if asked else set()
        best: tuple[int, int, str] | None = None
        current = -1
        for line in system.splitlines():
            start = re.match(r"^\[(\d+)\] (.*)$", line)
            if start:
                current, line = int(start.group(1)), start.group(2)
            elif not line.startswith("    "):
                current = -1
            if current < 0:
                continue
            text = re.sub(r"^\s*(user|assistant): ", "", line)
            overlap = len(wanted & _words(text))
            if overlap and (best is None or overlap > best[0]):
                best = (overlap, current, text)
        reply = "I don't remember that. [NO_CITE]" if best is None else f"{best[2]} [{best[1]}]"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])


def chat_model() -> BaseChatModel:
    """The model named by `REFLECTIVE_CHAT_MODEL` (an `init_chat_model` string), else offline."""
    return _configured_model(ScriptedChatModel)


def store_past_sessions(memory: ReflectiveMemory) -> None:
    """Store the demo's past conversations (dated turns) and close them into memories."""
    for session_id, turns in PAST_SESSIONS.items():
        if memory.turns(USER, session_id):  # kept from an earlier run (--path)
            continue
        start = datetime.fromisoformat(session_id).replace(hour=19, tzinfo=timezone.utc)
        memory.add_turns(
            {
                "user_id": USER,
                "session_id": session_id,
                "role": role,
                "text": text,
                "timestamp": start + timedelta(minutes=2 * i),
            }
            for i, (role, text) in enumerate(turns)
        )
        memory.end_session(USER, session_id)


def build_chain(memory: ReflectiveMemory, model: BaseChatModel) -> tuple[Any, CitationReranker]:
    """Question (+ chat history) -> retrieved, reranked memories -> cited answer."""
    reranker = CitationReranker(memory=memory, user_id=USER, top_n=3)
    retriever = ContextualCompressionRetriever(
        base_compressor=reranker,
        base_retriever=ReflectiveRetriever(memory=memory, user_id=USER),
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = (
        RunnablePassthrough.assign(docs=itemgetter("question") | retriever)
        .assign(context=lambda x: format_documents(x["docs"]))
        .assign(answer=prompt | model | StrOutputParser())
    )
    return chain, reranker


def run(embedder: str = "minilm", path: str | None = None) -> dict[str, Any]:
    """Store past sessions, then chat about them; return answers, sources and feedback."""
    model = chat_model()
    memory = ReflectiveMemory(
        path,
        embedder=HashingEmbedder() if embedder == "hashing" else None,
        llm=None if isinstance(model, ScriptedChatModel) else LangChainLLM(model),
    )
    out: dict[str, Any] = {"answers": [], "sources": [], "feedback": []}
    with memory:
        store_past_sessions(memory)
        chain, reranker = build_chain(memory, model)
        today = ReflectiveChatMessageHistory(memory=memory, user_id=USER, session_id="today")
        for question in QUESTIONS:
            result = chain.invoke({"question": question, "history": today.messages})
            today.add_messages([HumanMessage(question), AIMessage(result["answer"])])
            report = reranker.feedback(question, result["docs"], result["answer"])
            out["answers"].append(result["answer"])
            out["sources"].append([d.metadata for d in result["docs"]])
            out["feedback"].append(report)
            print(f"Q: {question}\nA: {result['answer']}")
            for i, d in enumerate(result["docs"]):
                said = [ln for ln in d.page_content.splitlines() if ln.startswith("user:")]
                print(
                    f"   [{i}] session {d.metadata['session_id']}: {said[0][:60] if said else ''}"
                )
            print(f"   cited {list(report.cited)}, reranker trained: {report.learned}")
        out["today"] = [t.text for t in memory.turns(USER, "today")]
        today.end_session()  # today's chat becomes memories too
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
