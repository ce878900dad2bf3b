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
    assert '"signal": "none"' in out  # MockLLM writes no citations


def test_chat_example_runs_offline(capsys):
    assert (
        _main("llamaindex_chat.py")(["--embedder", "hashing", "--message", "How is my dog?"]) == 0
    )
    out = capsys.readouterr().out
    assert "stored 7 past sessions" in out
    assert "<reflective_memory>" in out and "[0]" in out  # memories reached the prompt
    assert "memories used: ['" in out


@pytest.mark.integration
def test_chat_example_with_minilm(capsys):
    assert _main("llamaindex_chat.py")(["--message", "Where do I live now?"]) == 0
    out = capsys.readouterr().out
    assert "Berlin" in out.split("memories used")[0]
