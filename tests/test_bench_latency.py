import gzip
import json

import numpy as np
import pytest
from reflective_bench.latency import (
    exact_topk,
    format_latency_table,
    load_texts,
    main,
    run_latency_bench,
    synthetic_corpus,
)
from reflective_bench.retrieval import _mode_kwargs
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import InvalidInputError
from reflective_memory.storage.index import AnnSettings


def _data(tmp_path, n_items=3):
    items = []
    for q in range(n_items):
        sessions = [
            [
                {
                    "role": "user",
                    "content": f"conversation {q} turn {t} about topic {t % 7} and more",
                }
                for t in range(20)
            ]
        ]
        items.append({"question": f"what about topic {q}?", "haystack_sessions": sessions})
    path = tmp_path / "lme.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(items, fh)
    return path


def test_load_texts_and_errors(tmp_path):
    texts, questions = load_texts(_data(tmp_path), 25, seed=1)
    assert len(texts) == 25 and len(set(texts)) == 25 and len(questions) == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InvalidInputError):
        load_texts(bad, 10)
    with pytest.raises(InvalidInputError):
        load_texts(tmp_path / "missing.json", 10)


def test_synthetic_corpus_is_normalised_and_near_its_base():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(50, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    x = synthetic_corpus(base, 1000, seed=2)
    assert x.shape == (1000, 32) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    # Every row stays close to some real embedding (w >= 0.5 on one of them).
    assert np.min((x @ base.T).max(axis=1)) > 0.5
    assert np.array_equal(x, synthetic_corpus(base, 1000, seed=2))
    with pytest.raises(InvalidInputError):
        synthetic_corpus(base, 0)


def test_exact_topk_matches_argsort():
    rng = np.random.default_rng(1)
    c = rng.normal(size=(500, 8)).astype(np.float32)
    q = rng.normal(size=(4, 8)).astype(np.float32)
    expect = np.argsort(-(q @ c.T), axis=1)[:, :5]
    assert np.array_equal(exact_topk(c, q, 5), expect)


def test_run_latency_bench_small_exact_and_ivf():
    emb = HashingEmbedder(32)
    base = emb.encode([f"text number {i} about {i % 5}" for i in range(200)])
    rows = run_latency_bench(
        base,
        ["what about 3?", "tell me 4"],
        emb,
        sizes=[300, 3000],
        n_queries=6,
        k=5,
        ann=AnnSettings(threshold=1000, nprobe=8),
        progress=False,
    )
    assert [r["index"] for r in rows] == ["exact", "ivf"]
    assert "ann_recall_at_k" not in rows[0] and 0 <= rows[1]["ann_recall_at_k"] <= 1
    for r in rows:
        assert set(r["methods"]) == {"topk", "familiarity", "recollection", "rfmem"}
        m = r["methods"]["recollection"]
        assert m["recollection_share"] == 1.0
        assert m["p50_ms"] >= m["p50_ms_no_embed"] >= 0
        assert r["methods"]["familiarity"]["recollection_share"] == 0.0
    table = format_latency_table(rows)
    assert "| 3,000 | ivf | rfmem |" in table
    with pytest.raises(InvalidInputError):
        run_latency_bench(base, ["q"], emb, sizes=[10], methods=["bogus"])


def test_cli_entry_with_hashing_embedder(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code = main(
        [
            "--data",
            str(_data(tmp_path)),
            "--sizes",
            "500",
            "--queries",
            "3",
            "--embedder",
            "hashing",
            "--base-texts",
            "30",
            "--methods",
            "topk,rfmem",
            "--recall",
            '{"tau": 0.5}',
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    assert rows[0]["size"] == 500 and set(rows[0]["methods"]) == {"topk", "rfmem"}
    assert "| 500 | exact | topk |" in capsys.readouterr().out


def test_bench_retrieval_mode_suffix():
    assert _mode_kwargs("dense", {}) == ("dense", {})
    base, kw = _mode_kwargs("hybrid:recollection", {"recall": {"alpha": 0.3}})
    assert base == "hybrid" and kw == {"recall": {"alpha": 0.3, "mode": "recollection"}}
