from __future__ import annotations

from datetime import datetime, timezone

from reflective_bench.retrieval import (
    coverage_at_budget,
    format_table,
    run_retrieval_bench,
    session_recall,
)
from reflective_memory import HashingEmbedder
from reflective_memory.io import Conversation, Question, SessionData
from reflective_memory.types import Hit, Memory, Retrieval

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _hit(i: int, text: str, turn_ids: tuple[str, ...], session: str) -> Hit:
    m = Memory(f"m{i}", "u", session, "turn", text, text, turn_ids, NOW, NOW)
    return Hit(m, 1.0 - i / 10, i)


def test_coverage_packs_in_rank_order_and_skips_what_does_not_fit() -> None:
    r = Retrieval(
        "u",
        "q",
        [
            _hit(0, "one two three", ("a",), "s1"),
            _hit(1, "w " * 10, ("b",), "s2"),
            _hit(2, "four five", ("c",), "s1"),
        ],
    )
    assert coverage_at_budget(r, {"a", "c"}, 5) == (1.0, 5)
    assert coverage_at_budget(r, {"b"}, 5) == (0.0, 5)
    assert coverage_at_budget(r, {"a", "b"}, 13) == (1.0, 13)
    assert coverage_at_budget(r, {"a", "b", "c"}, 3) == (1 / 3, 3)
    assert session_recall(r, {"s2"}, 1) == (0.0, 0.0)
    assert session_recall(r, {"s1", "s2"}, 2) == (1.0, 1.0)


def test_bench_runs_end_to_end_on_a_small_conversation() -> None:
    sessions = [
        SessionData(
            "s1",
            [
                {"role": "user", "text": "I play the cello in an orchestra.", "turn_id": "t1"},
                {"role": "assistant", "text": "Nice, which pieces?", "turn_id": "t2"},
            ],
        ),
        SessionData(
            "s2", [{"role": "user", "text": "My flat in Porto has a balcony.", "turn_id": "t3"}]
        ),
    ]
    conv = Conversation(
        "u",
        sessions,
        [
            Question(
                "Which instrument do I play, the cello?", evidence=["t1"], evidence_sessions=["s1"]
            )
        ],
    )
    res = run_retrieval_bench(
        [conv],
        embedder=HashingEmbedder(64),
        units=("turn", "session"),
        budgets=(10, 16, 100),
        progress=False,
    )
    s = res.summary()
    # every unit starts with its date (turns without one are stamped when stored): 5 words
    assert s["coverage"]["turn/hybrid/16"] == 1.0
    assert s["coverage"]["session/dense/100"] == 1.0
    assert s["coverage"]["session/dense/10"] == 0.0  # the session unit is longer than 10 words
    assert s["session_recall"]["turn/dense/any@5"] == 1.0
    table = format_table(res, (10, 100))
    assert "| turn | hybrid | 1.000 |" in table


def test_bench_command_accepts_a_locomo_file(tmp_path, capsys) -> None:
    import json

    from reflective_memory.cli import main

    from tests.test_formats import LOCOMO

    f = tmp_path / "locomo.json"
    f.write_text(json.dumps(LOCOMO))
    out_json = tmp_path / "summary.json"
    rc = main(
        [
            "bench",
            "retrieval",
            "--data",
            str(f),
            "--embedder",
            "hashing",
            "--cache",
            "none",
            "--units",
            "turn",
            "--budgets",
            "5,50",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| turn | hybrid |" in printed and "(1 conversations)" in printed
    summary = json.loads(out_json.read_text())
    assert summary["questions"] == 2 and summary["skipped_no_evidence"] == 1
    assert summary["coverage"]["turn/hybrid/50"] == 1.0


def test_cached_embedder_embeds_each_text_once_and_bypasses_queries(tmp_path) -> None:
    import numpy as np
    from reflective_memory.embed import CachedEmbedder

    calls: list[list[str]] = []

    class Counting(HashingEmbedder):
        def encode(self, texts):
            calls.append([texts] if isinstance(texts, str) else list(texts))
            return super().encode(texts)

    inner = Counting(32)
    cache = CachedEmbedder(inner, tmp_path / "c.sqlite")
    first = cache.encode(["alpha beta", "gamma", "alpha beta"])
    assert len(calls) == 1 and sorted(calls[0]) == ["alpha beta", "gamma"]  # once each
    again = CachedEmbedder(inner, tmp_path / "c.sqlite").encode(["gamma", "alpha beta"])
    assert len(calls) == 1  # served from disk by a new instance
    assert np.allclose(again, first[[1, 0]]) and np.allclose(first[0], first[2])
    q = cache.encode("gamma")
    assert calls[-1] == ["gamma"] and q.shape == (32,)  # a query is always computed
    assert cache.name == inner.name and cache.encode([]).shape == (0, 32)


def test_bench_retrieval_dsn_does_not_go_with_units(tmp_path):
    import pytest
    from reflective_bench.retrieval import _run
    from reflective_memory.cli import build_parser
    from reflective_memory.errors import ConfigError

    args = build_parser().parse_args(
        ["bench", "retrieval", "--data", str(tmp_path / "x.json"), "--units", "turn",
         "--dsn", "postgresql://nobody@127.0.0.1:1/none"]
    )  # fmt: skip
    with pytest.raises(ConfigError, match="--units"):
        _run(args)


def test_bench_chat_times_retrieval_after_a_write_on_both_backends(tmp_path, pg_dsn) -> None:
    import json

    from reflective_bench.chat import format_chat_table, run_chat_bench

    from tests.test_formats import LOCOMO

    f = tmp_path / "locomo.json"
    f.write_text(json.dumps(LOCOMO))
    for dsn in (None, pg_dsn):
        rows = run_chat_bench(
            str(f), [30], HashingEmbedder(64), questions=3, progress=False, dsn=dsn
        )
        assert [r["system"] for r in rows] == ["default · retrieve()", "plain turn dense top-5"]
        assert all(r["size"] == 30 and r["after_write"][0] > 0 for r in rows)
        assert "| 30 | default · retrieve() |" in format_chat_table(rows)


def test_a_timed_query_is_embedded_for_real_after_an_untimed_one() -> None:
    from reflective_bench.systems import RepeatQuery

    seen: list[object] = []

    class Counting(HashingEmbedder):
        def encode(self, texts):  # type: ignore[no-untyped-def]
            seen.append(texts)
            return super().encode(texts)

    rep = RepeatQuery(Counting(32))
    first = rep.encode("where do I live")
    assert rep.encode("where do I live") is first and len(seen) == 1  # a repeat reuses it
    rep.forget()
    assert len(seen) == 2 and seen[-1] != "where do I live"  # the untimed primer
    again = rep.encode("where do I live")
    assert len(seen) == 3 and again is not first  # the timed call embeds for real
