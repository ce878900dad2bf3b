import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _main(name):
    return runpy.run_path(str(EXAMPLES / name), run_name="example")["main"]


def test_query_engine_example_runs_offline(capsys):
    assert _main("llamaindex_query_engine.py")(["--embedder", "hashing"]) == 0
    out = capsys.readouterr().out
    assert "answer:" in out and "source 2" in out and "source 3" not in out
    assert "Travel policy" in out.split("source 2")[0]  # the reranked best node comes first
    answer = out.split("answer:")[1].splitlines()[0]
    # a sensible extractive answer from the top source, citing it; the citation trains
    assert answer.strip() == (
        "Travel policy: book trains for trips under four hours; flights need a manager's "
        "approval. [1]"
    )
    assert "feedback: cited [0], learned True" in out


def test_chat_example_runs_offline(capsys):
    assert (
        _main("llamaindex_chat.py")(["--embedder", "hashing", "--message", "How is my dog?"]) == 0
    )
    out = capsys.readouterr().out
    assert "stored 7 past sessions" in out
    assert "memories used: ['" in out
    reply = out.split("assistant:")[1].split("memories used")[0].strip()
    # the offline model answers from a memory and cites it; it never echoes the prompt
    assert "<reflective_memory>" not in reply and "cite its number" not in reply
    assert reply.endswith("]") and ("beagle" in reply.lower() or "dog" in reply.lower())
    assert "learned True" in out


@pytest.mark.integration
def test_chat_example_with_minilm(capsys):
    assert _main("llamaindex_chat.py")(["--message", "Which language exam did I pass?"]) == 0
    out = capsys.readouterr().out
    reply = out.split("assistant:")[1].split("memories used")[0]
    assert "Goethe B1 exam" in reply and reply.strip().endswith("]")
    assert "learned True" in out


def _read_by_the_llm(monkeypatch, name: str, argv: list[str]) -> list[str]:
    """Run an example offline and return every prompt its LLM was given."""
    main = _main(name)  # runs the module, which imports the examples' `_offline` helpers
    offline = sys.modules["_offline"]
    answer = offline.answer_prompt  # what the offline LLM does with its whole prompt
    prompts: list[str] = []

    def recording(prompt: str) -> str:
        prompts.append(prompt)
        return answer(prompt)

    monkeypatch.setattr(offline, "answer_prompt", recording)
    assert main(argv) == 0
    return prompts


@pytest.mark.integration
def test_chat_example_llm_reads_the_evidence_at_the_default(monkeypatch):
    # the example's own question (its default message); ReflectiveMemoryBlock at its default
    # top_k and budget, the bundled MiniLM embedder
    (prompt,) = _read_by_the_llm(monkeypatch, "llamaindex_chat.py", [])
    from _offline import last_question, numbered_memories

    assert last_question(prompt) == "Remind me, where am I living these days?"
    memories = numbered_memories(prompt)
    said = [line for lines in memories.values() for line in lines if line.startswith("user: ")]
    # she moved to Neukölln on August 1 (earlier: Alfama in Lisbon, a Friedrichshain sublet)
    evidence = ("I'm moving to Neukölln on August 1", "the Neukölln flat is great")
    assert any(e in line for e in evidence for line in said), memories


@pytest.mark.integration
def test_query_engine_llm_reads_the_evidence_at_the_default(monkeypatch):
    # the example keeps the postprocessor's top 2 nodes: a prefix of what its default (top 5)
    # keeps, so this holds at the default too
    prompts = _read_by_the_llm(monkeypatch, "llamaindex_query_engine.py", [])
    from _offline import citation_sources, last_question

    assert [last_question(p) for p in prompts] == ["How should I travel to a meeting 3 hours away?"]
    sources = citation_sources(prompts[0])
    lines = [line for block in sources.values() for line in block]
    assert any("book trains for trips under four hours" in line for line in lines), sources
