import argparse
import gzip
import json
from datetime import datetime, timezone

from reflective_bench.conditional import coverage_at, main, register
from reflective_memory.types import Memory

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)


def mem(mid, gran, text, turn_ids, source=None):
    meta = {"source_turn_id": source} if source else {}
    return Memory(mid, "u", "s", gran, text, text, tuple(turn_ids), NOW, NOW, metadata=meta)


def test_coverage_at_packs_by_words_and_credits_note_source_only():
    mems = [
        mem("n", "note", "one two three", ["s:2", "s:1"], source="s:2"),  # 3 words
        mem("g", "segment", " ".join(["w"] * 10), ["s:0", "s:1"]),  # 10 words
        mem("h", "segment", "x y", ["s:5"]),  # 2 words
    ]
    evidence = {"s:1", "s:2", "s:5"}
    # budget 5: note (3) fits, segment (10) skipped, last segment (2) fits
    assert coverage_at(mems, evidence, [5, 15]) == [2 / 3, 1.0]
    assert coverage_at(mems, evidence, [2]) == [1 / 3]  # only the 2-word unit fits
    assert coverage_at(mems[:1], evidence, [100]) == [1 / 3]  # context turn s:1 not credited


def _question(qid):
    sessions = [
        [
            {
                "role": "user",
                "content": "I adopted a beagle named Max last week.",
                "has_answer": True,
            },
            {"role": "assistant", "content": "Congratulations on Max!"},
        ],
        [
            {"role": "user", "content": "What is the capital of Peru?"},
            {"role": "assistant", "content": "Lima."},
        ],
    ]
    return {
        "question_id": qid,
        "question": "What is my dog called?",
        "haystack_dates": ["2023/05/21 (Sun) 11:54", "2023/05/22 (Mon) 10:00"],
        "haystack_session_ids": ["a", "a"],  # repeated ids happen in the data
        "answer_session_ids": ["a"],
        "haystack_sessions": sessions,
    }


def test_bench_runs_end_to_end_on_tiny_data(tmp_path, capsys):
    path = tmp_path / "tiny.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump([_question("q1"), _question("q2")], fh)
    out = tmp_path / "res.json"
    assert (
        main(["--data", str(path), "--embedder", "hashing", "--cache", "none", "--json", str(out)])
        == 0
    )
    res = json.loads(out.read_text())
    m = res["memorize"]
    assert m["turns"] == 8 and m["user_turns"] == 4 and m["notes"] == 2
    assert m["evidence_user_turns"] == m["evidence_user_turns_kept"] == 2
    assert m["llm_calls_per_session"] == 1.0
    cov = res["coverage"]
    assert cov["questions"] == 2
    assert cov["coverage"]["note"][0] == 1.0
    assert "| note+segment |" in capsys.readouterr().out


def test_register_adds_subcommand():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub)
    args = parser.parse_args(["conditional", "--data", "x", "--skip-coverage"])
    assert args.skip_coverage and callable(args.func)
