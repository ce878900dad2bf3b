"""A LlamaIndex query engine whose retrieved nodes are reranked by reflective-memory.

Offline by default: the bundled MiniLM embedder and a small extractive stand-in for an LLM
(`examples/_offline.py`: it answers with the source line that best matches the question and
cites that source). Run:

    python examples/llamaindex_query_engine.py                # offline
    python examples/llamaindex_query_engine.py --embedder hashing   # no model at all (fast)
    python examples/llamaindex_query_engine.py --openai gpt-4o-mini  # a real LLM (needs
        # llama-index-llms-openai and OPENAI_API_KEY)

The postprocessor ranks the retriever's nodes with the user's citation-trained reranker; the
answer's citations (`[1]`, `[2]`, ... as `CitationQueryEngine` asks for) become training through
`postprocessor.feedback(response)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the examples' shared helpers
from _offline import llamaindex_llm  # noqa: E402
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.query_engine import CitationQueryEngine
from reflective_memory import HashingEmbedder, ReflectiveMemory

from llamaindex_reflective import ReflectiveEmbedding, ReflectiveNodePostprocessor

NOTES = [
    "Team handbook: stand-up is at 9:30 every weekday in the small meeting room.",
    "Travel policy: book trains for trips under four hours; flights need a manager's approval.",
    "The office closes between Christmas and New Year; support has an on-call rota.",
    "Expense claims are due by the fifth working day of the following month.",
    "New laptops are ordered through the IT portal and arrive within two weeks.",
    "Remote work: up to three days a week, agreed with your team lead.",
]


def make_llm(openai_model: str | None):
    """The offline extractive LLM, or an OpenAI model (needs llama-index-llms-openai)."""
    if openai_model is None:
        return llamaindex_llm()
    from llama_index.llms.openai import OpenAI  # type: ignore[import-not-found]

    return OpenAI(model=openai_model)


def main(argv: list[str] | None = None) -> int:
    """Build the index, ask a question, print the answer, sources and the feedback report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="How should I travel to a meeting 3 hours away?")
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--openai", metavar="MODEL", default=None, help="use an OpenAI model")
    args = parser.parse_args(argv)

    embedder = HashingEmbedder(256) if args.embedder == "hashing" else None
    with ReflectiveMemory(embedder=embedder) as memory:
        embed_model = ReflectiveEmbedding(embedder=memory.embedder)
        index = VectorStoreIndex.from_documents(
            [Document(text=t) for t in NOTES], embed_model=embed_model
        )
        rerank = ReflectiveNodePostprocessor(memory=memory, user_id="demo-user", top_n=2)
        engine = CitationQueryEngine.from_args(
            index,
            llm=make_llm(args.openai),
            similarity_top_k=5,
            node_postprocessors=[rerank],
        )
        response = engine.query(args.question)
        print("answer:", str(response).strip())
        for i, node in enumerate(response.source_nodes, start=1):
            print(f"  source {i} (score {node.score:.3f}):", node.node.get_content().strip())
        report = rerank.feedback(response)
        print(f"feedback: cited {list(report.cited)}, learned {report.learned}", report.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
