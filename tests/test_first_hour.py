"""Issue 18: honest feedback, documented scores, offline-only loading, quiet runs, ingest bench."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from reflective_bench.ingest import TimedEmbedder, format_result, run_ingest_bench
from reflective_memory import (
    FeedbackResult,
    HashingEmbedder,
    MemoryConfig,
    ModelLoadError,
    ReflectiveMemory,
)
from reflective_memory.denoise import LLMLinguaDenoiser
from reflective_memory.embed import _MODEL_CACHE, SentenceTransformerEmbedder
from reflective_memory.io import load_conversations
from reflective_memory.rmm.citations import build_answer_prompt, echoes_instructions
from reflective_memory.types import LEXICAL_HALF_RELEVANCE, Hit, Memory

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "shared" / "reflective_memory" / "data" / "demo_conversation.json"


# -- the embedder: one embedding per distinct text ----------------------------------------------
class CountingModel:
    """Stands in for a SentenceTransformer: deterministic vectors, records every text encoded."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.inner = HashingEmbedder(32)

    def get_sentence_embedding_dimension(self) -> int:
        return 32

    def encode(self, texts, **kw):
        self.seen.extend(texts)
        return self.inner.encode(list(texts))


@pytest.fixture
def counting(monkeypatch):
    model = CountingModel()
    monkeypatch.setitem(_MODEL_CACHE, ("fake-model", "cpu"), model)
    return model


def test_identical_texts_are_embedded_once_and_recent_ones_not_again(counting) -> None:
    emb = SentenceTransformerEmbedder("fake-model", cache_size=3)
    a = emb.encode(["hello there", "my dog", "hello there"])
    assert counting.seen == ["hello there", "my dog"]
    np.testing.assert_array_equal(a[0], a[2])
    b = emb.encode(["my dog", "new text"])
    assert counting.seen[2:] == ["new text"]
    np.testing.assert_array_equal(b[0], a[1])
    assert emb.counts == {"requested": 5, "embedded": 3}
    emb.encode("my dog")  # a query is always embedded (latency stays real)
    assert counting.seen[-1] == "my dog"
    emb.encode(["a", "b", "c"])  # evicts older entries (cache_size=3)
    emb.encode(["hello there"])
    assert counting.seen[-1] == "hello there"
    off = SentenceTransformerEmbedder("fake-model", cache_size=0)
    off.encode(["x", "x"])
    off.encode(["x"])
    assert counting.seen[-2:] == ["x", "x"]


# -- Hit.score and Hit.relevance -------------------------------------------------------------------
def _hit(scores: dict[str, float]) -> Hit:
    from datetime import datetime

    now = datetime(2025, 1, 1)
    mem = Memory("m", "u", "s", "turn", "t", "t", ("s:0",), now, now)
    return Hit(mem, 0.016, 0, scores)


def test_relevance_is_in_unit_range() -> None:
    assert _hit({"dense": 0.42, "fused": 0.016}).relevance == pytest.approx(0.42)
    assert _hit({"dense": -0.3}).relevance == 0.0
    assert _hit({"dense": 1.2}).relevance == 1.0
    s = 7.5
    assert _hit({"lexical": s}).relevance == pytest.approx(s / (s + LEXICAL_HALF_RELEVANCE))
    assert _hit({}).relevance == 0.0


@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
def test_engine_hits_carry_a_relevance_comparable_across_queries(mode) -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        mem.add_turn("ana", "s1", "user", "Tax forms are due in April.")
        mem.end_session("ana", "s1")
        close = mem.retrieve("ana", "dog Pixel beach", k=2, mode=mode).hits
        far = mem.retrieve("ana", "quantum chromodynamics lecture", k=2, mode=mode).hits
    assert all(0.0 <= h.relevance <= 1.0 for h in close + far)
    assert close[0].memory.text.endswith("beach.")
    assert close[0].relevance > max([h.relevance for h in far] + [0.0])


# -- citations: only the answer teaches ------------------------------------------------------------
def test_an_answer_that_echoes_the_prompt_teaches_nothing() -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)}, rerank={"batch_size": 1})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as mem:
        for i, text in enumerate(["My dog Pixel loves the beach.", "I work as a nurse.", "x y z"]):
            mem.add_turn("ana", "s1", "user", text, turn_id=f"t{i}")
        mem.end_session("ana", "s1")
        r = mem.retrieve("ana", "Where does Pixel like to go?", k=3)
        prompt = build_answer_prompt(r.query, r.hits)
        assert echoes_instructions(prompt)
        echoed = mem.feedback(r, prompt + " [0]")  # a model that repeats its input
        assert isinstance(echoed, FeedbackResult)
        assert not echoed.learned and "echoes" in echoed.reason and echoed.cited == ()
        assert mem.retrieve("ana", "dog", k=1).diagnostics["rerank"]["updates"] == 0
        real = mem.feedback(r, "Pixel loves the beach. [0]")
        assert real.learned and real.cited == (0,) and real.updates == 1
    assert not echoes_instructions("You play the cello. [1]")
    assert not echoes_instructions("Cite me later [0]")


# -- offline means offline -------------------------------------------------------------------------
def test_llmlingua_missing_hub_model_fails_fast_without_network(monkeypatch) -> None:
    import socket

    def no_network(*a, **kw):
        raise AssertionError("tried the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    d = LLMLinguaDenoiser("nobody/not-cached-xlm-roberta-large")
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="not on this machine"):
        d.warm_up()
    assert time.perf_counter() - t0 < 5.0
    assert d.to_dict()["init_parameters"]["allow_download"] is False


def test_end_session_still_falls_back_when_llmlingua_is_missing(caplog) -> None:
    cfg = MemoryConfig(
        units={"granularities": ("turn",)},
        denoise={"kind": "llmlingua", "model": "/nope/xlm-roberta-large"},
    )
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=cfg) as mem:
        mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        (m,) = mem.end_session("ana", "s1")  # turns are never lost to a denoiser
        assert m.key == "user: My dog Pixel loves the beach."
        assert m.metadata["key_denoiser"] == "none"
        with pytest.raises(ModelLoadError):
            mem.redenoise("ana")  # but asking for it explicitly is an error


# -- quiet by default ----------------------------------------------------------------------------
@pytest.mark.integration
def test_model_loading_is_quiet_unless_verbose() -> None:
    code = (
        "import logging, sys\n"
        "if sys.argv[1] == 'verbose':\n"
        "    logging.basicConfig(level=logging.INFO)\n"
        "from reflective_memory.embed import SentenceTransformerEmbedder\n"
        "SentenceTransformerEmbedder().encode(['hello'])\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", code, "quiet"], cwd=ROOT, capture_output=True, text=True
    )
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    loud = subprocess.run(
        [sys.executable, "-c", code, "verbose"], cwd=ROOT, capture_output=True, text=True
    )
    assert "Loading weights" in loud.stderr and "loaded embedder" in loud.stderr


# -- bench ingest ------------------------------------------------------------------------------
def test_bench_ingest_measures_both_rates_and_stages() -> None:
    convs = load_conversations(DEMO)
    inner = HashingEmbedder(64)
    res = run_ingest_bench(
        convs,
        embedder=inner,
        bare_embedder=HashingEmbedder(64),
        message_embedder=HashingEmbedder(64),
        peers={"noop": lambda texts: None},
        progress=False,
    )
    assert res.turns == convs[0].n_turns and res.sessions == 7 and res.memories > 0
    assert res.bare_seconds > 0 and res.ingest_seconds > 0 and 0 < res.ratio
    assert set(res.stages) == {
        "embed_segmenter",
        "embed_keys",
        "segment",
        "denoise",
        "store",
        "other",
    }
    assert res.stages["embed_keys"] > 0
    assert sum(res.stages.values()) == pytest.approx(res.ingest_seconds, rel=0.05)
    # the turns are embedded once, at add_turns; end_session reuses their vectors
    assert res.embed_calls == res.sessions and res.embed_texts == res.turns
    # the per-message pattern: one add_turn timed per turn, one single-text embedding per turn
    assert len(res.add_turn_ms) == len(res.single_ms) == res.turns and res.message_seconds > 0
    s = res.summary()
    assert s["message_ratio"] > 0 and s["add_turn_ms"]["p95"] >= s["add_turn_ms"]["p50"]
    assert set(s["peers"]) == {"noop"}
    report = format_result(res)
    assert "turns/s" in report and "x bare" in report and "per message" in report
    assert "add_turn p50" in report and "noop:" in report
    timed = TimedEmbedder(inner)
    timed.encode(["a", "b"])
    assert timed.calls == 1 and timed.texts == 2 and timed.dim == 64
