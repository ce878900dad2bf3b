import argparse
import gzip
import json

import numpy as np
import pytest
import reflective_bench.feedback as bench
from reflective_memory.config import MemoryConfig
from reflective_memory.errors import ConfigError
from reflective_memory.types import Hit, Memory, Retrieval


def _mem(mid, text, turn_ids):
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return Memory(mid, "u", "s", "turn", text, text, tuple(turn_ids), now, now)


def test_coverage_counts_evidence_turns_among_returned_passages():
    hits = [
        Hit(_mem("a", "word " * 300, ["s:0", "s:1"]), 1.0, 0),
        Hit(_mem("b", "word " * 100, ["s:3"]), 0.9, 1),
    ]
    r = Retrieval("u", "q", hits)
    assert bench.coverage(r, {"s:0", "s:2"}) == 0.5  # s:0 returned, s:2 not
    assert bench.coverage(r, {"s:1", "s:3"}) == 1.0
    assert bench.coverage(r, set()) == 0.0


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


def test_plot_writes_png(tmp_path):
    path = bench.plot_curves(
        {"a": [(0, 50.0), (10, 55.0)], "b": [(0, 50.0)]}, tmp_path / "c.png", "t", "y"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _locomo_file(tmp_path, users=3, questions=6):
    """A tiny LoCoMo-style file: per user, short facts (evidence) among long chatter."""
    data = []
    pets = ["cat", "dog", "parrot", "hamster", "turtle", "rabbit", "goldfish", "ferret"]
    for u in range(users):
        conv = {"speaker_a": "Ann", "speaker_b": "Bob"}
        qa = []
        for s in range(questions):
            turns = [
                {
                    "speaker": "Ann",
                    "dia_id": f"D{s + 1}:1",
                    "text": f"my {pets[s]} is named Tom{u}{s}",
                },
                {
                    "speaker": "Bob",
                    "dia_id": f"D{s + 1}:2",
                    "text": f"so many people talk about a {pets[s]} and what a {pets[s]} eats and "
                    "where it sleeps and how long it lives and which toys it likes best ok",
                },
                {"speaker": "Ann", "dia_id": f"D{s + 1}:3", "text": "ok see you later then"},
            ]
            conv[f"session_{s + 1}"] = turns
            conv[f"session_{s + 1}_date_time"] = f"10:0{s} am on {s + 1} May, 2023"
            qa.append(
                {
                    "question": f"what is my {pets[s]} called?",
                    "answer": f"Tom{u}{s}",
                    "evidence": [f"D{s + 1}:1"],
                    "category": 1,
                }
            )
        data.append({"sample_id": f"chat{u}", "conversation": conv, "qa": qa})
    f = tmp_path / "chats.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump(data, fh)
    return f


def test_make_splits_per_user_and_across_users(tmp_path):
    from reflective_memory.io import load_conversations

    convs = load_conversations(_locomo_file(tmp_path, users=2, questions=4))
    protocol, (s0, s1) = bench.make_splits(convs, [0, 1])
    assert protocol == "per user"
    # split 0: file order, first half teaches; teaching interleaves the users
    assert [(it.user, it.question.question) for it in s0.train] == [
        ("chat0", "what is my cat called?"),
        ("chat1", "what is my cat called?"),
        ("chat0", "what is my dog called?"),
        ("chat1", "what is my dog called?"),
    ]
    assert {it.question.question for it in s0.test} == {
        "what is my parrot called?",
        "what is my hamster called?",
    }
    for sp in (s0, s1):  # a user's test questions are never among its teaching questions
        for u in ("chat0", "chat1"):
            tr = {it.question.question for it in sp.train if it.user == u}
            te = {it.question.question for it in sp.test if it.user == u}
            assert len(tr) == len(te) == 2 and not tr & te
    one = [type(c)(c.user_id, c.sessions, c.questions[:1]) for c in convs]
    protocol, (sp,) = bench.make_splits(one, [3])
    assert protocol == "across users" and len(sp.train) == len(sp.test) == 1
    assert sp.train[0].user != sp.test[0].user


def test_tiny_run_end_to_end(tmp_path, capsys):
    f = _locomo_file(tmp_path)
    args = bench._arguments_parser().parse_args(
        [
            "--data",
            str(f),
            "--store",
            str(tmp_path / "store"),
            "--embedder",
            "hashing",
            "--cache",
            str(tmp_path / "vectors.sqlite"),
            "--granularity",
            "turn",
            "--denoiser",
            "none",
            "--splits",
            "2",
            "--checkpoints",
            "2",
            "--plot",
            str(tmp_path / "p.png"),
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "protocol: per user" in out and "scope=user" in out
    for cond in bench.CONDITIONS:
        assert f"| **{cond}, change** |" in out
    none_change = next(ln for ln in out.splitlines() if ln.startswith("| **none, change**"))
    assert [float(c) for c in none_change.split("|")[2:7]] == [0.0] * 5  # nothing learned
    assert "| citations, worst split |" in out
    for u in ("chat0", "chat1", "chat2"):  # one row per user and condition
        assert f"| {u} | before |" in out
        none_u = next(ln for ln in out.splitlines() if ln.startswith(f"| {u} | none, change"))
        assert none_u.count("+0.00 (+0.00)") == 5
    assert "feedback:" in out and "ms per episode" in out
    assert (tmp_path / "vectors.sqlite").exists()  # vectors went through the cache
    res = json.loads((tmp_path / "c.json").read_text())
    assert [r["split"] for r in res] == [0, 1]
    assert set(res[0]["before_by_user"]) == set(res[0]["runs"]["noise"]["test_by_user"])
    assert len(res[0]["runs"]["citations"]["curve"]) == 3 and (tmp_path / "p.png").exists()
    assert not (tmp_path / "store" / "rerankers").exists()  # learned state cleaned up
    # the gates after teaching: nothing cited teaches nothing, so nothing is judged or ranks
    gates = res[0]["runs"]["none"]["gates"]
    assert gates["shared"] == {"judged": 0, "mean_gain": 0.0, "t": 0.0, "serves": False}
    assert gates["users"] == 3 and gates["users_serving"] == 0
    assert "Gates after teaching" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("| 0 | ") and "judged" in ln)
    assert row.count("judged") == len(bench.CONDITIONS)


def test_per_user_table_mean_and_worst_split():
    from reflective_bench.feedback_report import _per_user

    def split(before, after):
        run = bench._Run([], {}, {}, [], [], test_by_user=after)
        return {"before_by_user": before, "runs": {"citations": run}}

    per_split = [
        split({"a": {250: 60.0}, "b": {250: 50.0}}, {"a": {250: 61.0}, "b": {250: 49.0}}),
        split({"a": {250: 70.0}, "b": {250: 50.0}}, {"a": {250: 70.0}, "b": {250: 50.5}}),
    ]
    lines = _per_user(per_split, ["citations"], [250])
    assert "| a | before | 65.0 |" in lines and "| b | before | 50.0 |" in lines
    assert "| a | citations, change | +0.50 (+0.00) |" in lines
    assert "| b | citations, change | -0.25 (-1.00) |" in lines


def test_register_adds_parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    bench.register(sub)
    ns = p.parse_args(["feedback", "--data", "x.json"])
    assert ns.func is bench.run and ns.granularity == "default" and ns.denoiser == "default"
    assert ns.cache.endswith("bench-embeddings.sqlite") and ns.splits == 5
    assert ns.conditions == bench.CONDITIONS and ns.epochs == 1
    cfg = bench._config(ns)  # nothing given: the library's turn-learning defaults
    d = MemoryConfig()
    for name in ("scope", "turn_update", "turn_learning_rate", "turn_user_learning_rate"):
        assert getattr(cfg.rerank, name) == getattr(d.rerank, name)
    assert (cfg.rerank.turn_pull, cfg.rerank.turn_prior_pull) == (
        d.rerank.turn_pull,
        d.rerank.turn_prior_pull,
    )
    assert cfg.units.granularities == d.units.granularities
    with pytest.raises(SystemExit):
        p.parse_args(["feedback", "--data", "x.json", "--conditions", "loud"])
    bad = p.parse_args(["feedback", "--data", "x.json", "--turn-lr", "-1"])
    with pytest.raises(ConfigError, match="turn_learning_rate"):
        bench._config(bad)


@pytest.mark.parametrize(
    "option",
    [
        ["--lr", "1e-4"],
        ["--feature-lr", "1e-3"],
        ["--user-lr", "1e-3"],
        ["--user-decay", "1"],
        ["--batch-size", "4"],
        ["--baseline", "0.5"],
        ["--features", "none"],
    ],
)
def test_the_removed_head_reranker_options_are_refused(option, capsys):
    """Options of the head reranker (removed) acted on nothing: argparse refuses them now."""
    with pytest.raises(SystemExit) as info:
        bench._arguments_parser().parse_args(["--data", "x.json", *option])
    assert info.value.code == 2
    assert f"unrecognized arguments: {' '.join(option)}" in capsys.readouterr().err


def test_every_option_reaches_the_run(tmp_path, capsys, monkeypatch):
    """Each turn-learning option is in the config of every memory the run opens, and in its
    report; the run's own options shape what it does."""
    opened: list[MemoryConfig] = []

    class Recorded(bench.ReflectiveMemory):
        def __init__(self, *args, config, **kw):
            opened.append(config)
            super().__init__(*args, config=config, **kw)

    monkeypatch.setattr(bench, "ReflectiveMemory", Recorded)
    f = _locomo_file(tmp_path, users=3, questions=4)
    argv = ["--data", str(f), "--store", str(tmp_path / "store"), "--embedder", "hashing"]
    argv += ["--cache", str(tmp_path / "v.sqlite"), "--granularity", "turn", "--denoiser", "none"]
    argv += ["--seeds", "3", "--conditions", "citations", "--epochs", "2", "--limit", "2"]
    argv += ["--scope", "shared", "--top-k", "60", "--start", "cosine", "--plot", ""]
    argv += ["--turn-update", "pairwise", "--turn-lr", "0.2", "--turn-user-lr", "0.01"]
    argv += ["--turn-pull", "0.3", "--turn-prior-pull", "0.02"]
    assert bench.run(bench._arguments_parser().parse_args(argv)) == 0
    out = capsys.readouterr().out
    # ingest, the untrained evaluation and one condition of split 3
    assert len(opened) == 3 and [c.rerank.seed for c in opened] == [0, 3, 3]
    for cfg in opened:
        rr = cfg.rerank
        assert (rr.scope, rr.top_k, rr.turn_update) == ("shared", 60, "pairwise")
        assert (rr.turn_learning_rate, rr.turn_user_learning_rate) == (0.2, 0.01)
        assert (rr.turn_pull, rr.turn_prior_pull) == (0.3, 0.02)
        assert cfg.units.granularities == ("turn",) and cfg.passages.budget_unit == "words"
        assert cfg.passages.ranker.endswith("store-cosine-ranker.json")
    assert "(2 users; protocol: per user; per split 4 teaching / 4 test questions)" in out
    assert "start cosine, scope=shared, update=pairwise, lr=0.2, user lr=0.01" in out
    assert "pull=0.3, prior pull=0.02" in out and "epochs=2, splits=[3]" in out
    assert "| **citations, change** |" in out and "| **noise, change** |" not in out
    assert not (tmp_path / "p.png").exists()


def test_all_exports():
    for name in bench.__all__:
        assert hasattr(bench, name)


def test_start_rankers_prior_cosine_or_a_file(tmp_path):
    from reflective_bench.feedback import start_ranker
    from reflective_memory.retrieval.ranker import load_ranker

    assert start_ranker("prior", tmp_path / "store") == "learned"
    path = start_ranker("cosine", tmp_path / "store")
    weights = load_ranker(path).weights
    assert weights["cosine"] == load_ranker().weights["cosine"]
    assert all(w == 0.0 for n, w in weights.items() if n != "cosine")
    assert start_ranker("/some/ranker.json", tmp_path / "store") == "/some/ranker.json"


def test_feedback_cost_measures_learned_episodes():
    from reflective_bench.feedback_cost import measure
    from reflective_memory import HashingEmbedder, ReflectiveMemory

    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        got = measure(mem, sessions=6, rounds=20)
    assert got["learned"] == 20
    assert 0 < got["feedback_p50"] <= got["feedback_p95"] <= got["feedback_max"]
    assert got["retrieve_p50"] > 0
