from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langchain_chat.py"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.delenv("REFLECTIVE_CHAT_MODEL", raising=False)
    spec = importlib.util.spec_from_file_location("langchain_chat_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_runs_offline(example, tmp_path, capsys):
    assert example.main(["--embedder", "hashing", "--path", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "[agent] What is my cat called?" in printed and "[chain]" in printed
    out = example.run("hashing", None)
    assert "Miso" in out["agent"][0] and out["agent"][0].endswith("[0]")
    assert "half marathon" in out["agent"][1]
    assert out["rag"] and all(md["user_id"] == "ana" for md in out["rag"])
    assert out["stats"]["turns"] == 2 * (len(example.FIRST_SESSION) + len(example.QUESTIONS) + 1)
    assert (tmp_path / "memory.sqlite3").exists()


def test_example_uses_configured_model(example, monkeypatch):
    calls = []

    def fake_init(name):
        calls.append(name)
        return example.ScriptedChatModel()

    import langchain.chat_models

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", fake_init)
    monkeypatch.setenv("REFLECTIVE_CHAT_MODEL", "openai:gpt-4o-mini")
    assert isinstance(example.chat_model(), example.ScriptedChatModel)
    assert calls == ["openai:gpt-4o-mini"]
