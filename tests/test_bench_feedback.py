import argparse
import gzip
import json

import numpy as np
import pytest
import reflective_memory.bench.feedback as bench
from reflective_memory.config import MemoryConfig
from reflective_memory.errors import ConfigError
from reflective_memory.types import Hit, Memory, Retrieval


def _mem(mid, text, turn_ids):
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return Memory(mid, "u", "s", "turn", text, text, tuple(turn_ids), now, now)


def test_coverage_packs_in_rank_order_and_skips_too_long():
    hits = [
        Hit(_mem("a", "word " * 300, ["s:0"]), 1.0, 0),
        Hit(_mem("b", "word " * 100, ["s:1"]), 0.9, 1),
        Hit(_mem("c", "word " * 200, ["s:2"]), 0.8, 2),
    ]
    r = Retrieval("u", "q", hits)
    cov = bench.coverage(r, {"s:0", "s:2"}, (250, 400))
    assert cov[250] == 0.0  # a does not fit, b fits but is no evidence, c no longer fits
    assert cov[400] == 0.5


def test_simulated_citations_follow_evidence_and_noise():
    hits = [Hit(_mem(str(i), "x", [f"s:{i}"]), 1.0, i) for i in range(5)]
    r = Retrieval("u", "q", hits)
    rng = np.random.default_rng(0)
    counts = np.zeros(5)
    for _ in range(2000):
        for i in bench.simulated_citations(r, {"s:0"}, rng, p_false=0.05):
            counts[i] += 1
    assert abs(counts[0] / 2000 - bench.RECALL) < 0.03
    assert abs(counts[1:].mean() / 2000 - 0.05) < 0.02
    noisy = [
        bench.simulated_citations(r, {"s:0"}, rng, p_false=0, noise_only=True, cite_rate=0.5)
        for _ in range(500)
    ]
    assert abs(sum(0 in c for c in noisy) / 500 - 0.5) < 0.08


def test_sessions_dedupe_and_distractor_cap():
    q = {
        "question_id": "0123abcd",
        "haystack_session_ids": ["x", "y", "x", "ans", "z"],
        "haystack_dates": ["2023/05/21 (Sun) 11:54"] * 5,
        "haystack_sessions": [[{"role": "user", "content": "a"}]] * 3
        + [[{"role": "user", "content": "b", "has_answer": True}]]
        + [[{"role": "user", "content": "c"}]],
        "answer_session_ids": ["ans"],
    }
    ids = [s for s, _, _ in bench._sessions(q)]
    assert ids == ["x", "y", "x#1", "ans", "z"]
    kept = [s for s, _, _ in bench._sessions(q, distractors=2, seed=0)]
    assert "ans" in kept and len(kept) == 3
    assert bench._evidence(q) == {"ans:0"}


def test_plot_writes_png(tmp_path):
    path = bench.plot_curves(
        {"a": [(0, 50.0), (10, 55.0)], "b": [(0, 50.0)]}, tmp_path / "c.png", "t", "y"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_run_end_to_end(tmp_path, monkeypatch, capsys):
    data = []
    for n in range(4):
        sessions = [
            [
                {
                    "role": "user",
                    "content": f"my pet number {n} is a cat named Tom{n}",
                    "has_answer": True,
                },
                {"role": "assistant", "content": "nice"},
            ],
            [
                {"role": "user", "content": f"random chatter {n} about weather"},
                {"role": "assistant", "content": "ok"},
            ],
        ]
        data.append(
            {
                "question_id": f"{n:08x}",
                "question": "what is my pet called?",
                "haystack_session_ids": [f"e{n}", f"d{n}"],
                "haystack_dates": ["2023/05/21 (Sun) 11:54", "2023/05/22 (Mon) 11:54"],
                "haystack_sessions": sessions,
                "answer_session_ids": [f"e{n}"],
            }
        )
    f = tmp_path / "d.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump(data, fh)
    args = argparse.Namespace(
        data=str(f),
        store=str(tmp_path / "store"),
        granularity="turn",
        embedder="hashing",
        cache=str(tmp_path / "vectors.sqlite"),
        denoiser="none",
        top_k=20,
        weight_decay=0.01,
        memory_bias=True,
        epochs=2,
        eval_every=1,
        k_eval=10,
        optimizer="adam",
        lr=1e-3,
        baseline="episode",
        features=("cost",),
        seed=0,
        limit=None,
        distractors=None,
        plot=str(tmp_path / "p.png"),
        json=str(tmp_path / "c.json"),
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "| citations, before | 0 |" in out and "| pure noise, after | 4 |" in out
    assert "unit=turn" in out and "memory bias=True" in out and "weight decay=0.01" in out
    assert "features=['cost']" in out and "b=episode" in out
    ceiling = next(line for line in out.splitlines() if line.startswith("| reference: top"))
    before = next(line for line in out.splitlines() if line.startswith("| citations, before"))
    cells = [float(c) for c in ceiling.split("|")[3:8]]
    assert all(c >= float(b) for c, b in zip(cells, before.split("|")[3:8], strict=True))
    assert (tmp_path / "vectors.sqlite").exists()  # vectors went through the cache
    curves = json.loads((tmp_path / "c.json").read_text())
    assert len(curves["citations"]) == 3 and (tmp_path / "p.png").exists()


def test_register_adds_parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    bench.register(sub)
    ns = p.parse_args(["feedback", "--data", "x.json"])
    assert ns.func is bench.run and ns.granularity == "turn"
    assert ns.denoiser == "none" and ns.cache.endswith("bench-embeddings.sqlite")
    d = MemoryConfig()
    assert ns.weight_decay == d.rerank_weight_decay and ns.memory_bias is False and ns.top_k == 20
    assert (ns.optimizer, ns.lr) == (d.rerank_optimizer, d.rerank_learning_rate)
    assert ns.baseline == d.rerank_baseline and ns.features == d.rerank_features
    paper = p.parse_args(
        ["feedback", "--data", "x.json", "--baseline", "0.5", "--features", "none"]
    )
    assert paper.baseline == 0.5 and paper.features == ()
    two = p.parse_args(["feedback", "--data", "x.json", "--features", "cost, cost"])
    assert two.features == ("cost", "cost")  # MemoryConfig rejects the repeat at run time
    with pytest.raises(ConfigError):
        MemoryConfig(rerank_features=two.features)


def test_all_exports():
    for name in bench.__all__:
        assert hasattr(bench, name)
