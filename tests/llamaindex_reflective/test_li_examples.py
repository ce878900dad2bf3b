import runpy
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
