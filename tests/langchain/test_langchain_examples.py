from __future__ import annotations

import importlib.util
import re
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


# What each example's LLM reads at the adapters' default settings (issue 27): for every question
# the example asks, the turn that answers it is among the numbered memories in the prompt.
CLASSIC_EVIDENCE = {
    "What is my cat called?": ("I just adopted a grey cat named Miso",),
    "Which race am I training for?": ("training for the Lyon half marathon in April",),
    "Remind me where I work?": ("I started as a nurse at the city hospital",),
}
AGENT_EVIDENCE = {
    "What is my cat called?": ("I just adopted a grey cat named Miso",),
    "Which city does my sister live in?": ("my sister Lea lives in Porto",),
    "What do you know about me?": (
        "I just adopted a grey cat named Miso",
        "my sister Lea lives in Porto",
        "training for the Lyon half marathon in April",
    ),
}
RAG_EVIDENCE = {
    "Where does my cat love to sleep?": ("Miso loves sleeping on the radiator",),
    "How long is my long run on Sunday?": ("My long run this Sunday is 18 kilometres",),
    "Where do I work now?": ("I now work as a nurse at the city hospital",),
}


def _record_prompts(monkeypatch, ex, model_name: str) -> list[list]:
    """Swap the example's offline model for one that keeps every prompt (its messages)."""
    prompts: list[list] = []

    class Recording(getattr(ex, model_name)):
        def _generate(self, messages, stop=None, **kw):
            prompts.append(list(messages))
            return super()._generate(messages, stop=stop, **kw)

    monkeypatch.setattr(ex, model_name, Recording)
    return prompts


def _asked(messages: list) -> str:
    """The question of a prompt: its last human message (the classic chain's last `Human:`)."""
    last = str([m for m in messages if m.type == "human"][-1].text)
    templated = re.findall(r"^Human: (.*)$", last, re.M)
    return templated[-1] if templated else last


#: Memory lines in the user's own words (a said turn, a saved fact).
_SAID = ("user: ", "fact: ")


def _missing_evidence(prompts: list[list], evidence: dict[str, tuple[str, ...]]) -> dict:
    """Per question, the evidence not said by the user in the memories of its first prompt.

    Only the user's (or a saved fact's) own lines count: an assistant line that quoted a memory
    back on an earlier question is not the evidence.
    """
    from _offline import numbered_memories  # the examples' own reader (examples/ on sys.path)

    missing = {}
    for question, needed in evidence.items():
        prompt = next(p for p in prompts if _asked(p) == question)
        memories = numbered_memories("\n".join(str(m.text) for m in prompt))
        said = [ln for lines in memories.values() for ln in lines if ln.startswith(_SAID)]
        lost = [e for e in needed if not any(e in ln for ln in said)]
        if lost:
            missing[question] = {"missing": lost, "memories read": memories}
    return missing


# example -> (its offline model, the module constant holding its questions, the evidence); each
# runs on the bundled MiniLM embedder with its adapter (ReflectiveChatMemory, the agent's
# ReflectiveMemoryMiddleware, ReflectiveRetriever) at its default k and budget
EVIDENCE_RUNS = {
    "langchain_classic_chain": ("ScriptedChatModel", "DAY_2", CLASSIC_EVIDENCE),
    "langchain_agent": ("ScriptedAgentModel", "DAY_2", AGENT_EVIDENCE),
    "langchain_rag_chat": ("ScriptedChatModel", "QUESTIONS", RAG_EVIDENCE),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(EVIDENCE_RUNS))
def test_llm_reads_the_evidence_at_the_default(name, monkeypatch):
    model_name, questions, evidence = EVIDENCE_RUNS[name]
    ex = _load(name)
    assert set(evidence) == set(getattr(ex, questions))  # every question the example asks
    prompts = _record_prompts(monkeypatch, ex, model_name)
    ex.run()
    assert _missing_evidence(prompts, evidence) == {}
