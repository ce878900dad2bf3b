from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["langchain_classic_chain", "langchain_agent", "langchain_rag_chat"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("REFLECTIVE_CHAT_MODEL", raising=False)


def test_classic_chain_example(tmp_path, capsys):
    ex = _load("langchain_classic_chain")
    assert ex.main(["--embedder", "hashing", "--path", str(tmp_path)]) == 0
    assert "Q: What is my cat called?" in capsys.readouterr().out
    assert (tmp_path / "memory.sqlite3").exists()
    out = ex.run("hashing")
    cat, race, work = out["day_2"]
    assert "Miso" in cat and cat.endswith("]") and "[NO_CITE]" not in cat
    assert "half marathon" in race and "nurse" in work
    assert all("[NO_CITE]" in a for a in out["day_1"])  # nothing to remember yet on day 1
    assert out["stats"]["turns"] == 2 * (len(ex.DAY_1) + len(ex.DAY_2))


def test_agent_example_uses_middleware_and_store(tmp_path, capsys):
    ex = _load("langchain_agent")
    assert ex.main(["--embedder", "hashing", "--path", str(tmp_path)]) == 0
    assert "Which city does my sister live in?" in capsys.readouterr().out
    out = ex.run("hashing")
    assert out["day_1"][1] == "Saved: my sister Lea lives in Porto. [NO_CITE]"
    assert out["facts"] == ["fact: my sister Lea lives in Porto."]
    cat, sister, everything = out["day_2"]
    assert "Miso" in cat and cat.endswith("]")
    # the store item or the day-1 turn itself (every turn is searchable at once)
    assert sister in (
        'You told me: "my sister Lea lives in Porto." [0]',
        'You told me: "Remember: my sister Lea lives in Porto." [0]',
        'You told me: "Saved: my sister Lea lives in Porto." [0]',  # the answer, marks stripped
    )
    assert everything.startswith("- my sister Lea lives in Porto.")  # list_facts tool


def test_rag_chat_example(tmp_path, capsys):
    ex = _load("langchain_rag_chat")
    assert ex.main(["--embedder", "hashing", "--path", str(tmp_path)]) == 0
    assert "reranker trained" in capsys.readouterr().out
    out = ex.run("hashing")
    sleep, run, work = out["answers"]
    assert sleep == "Miso loves sleeping on the radiator. [0]"
    assert "18 kilometres" in run and "nurse" in work
    for sources, report in zip(out["sources"], out["feedback"], strict=True):
        assert len(sources) == 3 and all(md["user_id"] == "ana" for md in sources)
        assert "relevance_score" in sources[0] and report.cited == (0,)
    assert out["sources"][1][0]["session_id"] == "2024-03-05"
    assert len(out["today"]) == 2 * len(ex.QUESTIONS)
    assert out["stats"]["open_sessions"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_examples_use_the_configured_model(name, monkeypatch):
    ex = _load(name)
    offline_cls = next(
        getattr(ex, n) for n in ("ScriptedChatModel", "ScriptedAgentModel") if hasattr(ex, n)
    )
    calls = []

    def fake_init(model_name):
        calls.append(model_name)
        return offline_cls()

    import langchain.chat_models

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", fake_init)
    monkeypatch.setenv("REFLECTIVE_CHAT_MODEL", "openai:gpt-4o-mini")
    assert isinstance(ex.chat_model(), offline_cls)
    assert calls == ["openai:gpt-4o-mini"]


def test_classic_chain_runs_on_a_configured_model(monkeypatch):
    ex = _load("langchain_classic_chain")
    prompts = []

    class Recording(ex.ScriptedChatModel):
        def _generate(self, messages, stop=None, **kw):
            prompts.append("\n".join(str(m.text) for m in messages))
            return super()._generate(messages, stop=stop, **kw)

    import langchain.chat_models

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", lambda name: Recording())
    monkeypatch.setenv("REFLECTIVE_CHAT_MODEL", "some:model")
    out = ex.run("hashing")
    assert "Miso" in out["day_2"][0]
    assert len(prompts) == len(ex.DAY_1) + len(ex.DAY_2)
