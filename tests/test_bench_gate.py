"""`bench fit-gate`: per-question table, folds, cross-validation and the command end to end."""

from __future__ import annotations

import gzip
import json

import numpy as np
from reflective_bench.gate import (
    GateRow,
    collect_rows,
    cross_validate,
    folds_of,
    summarize,
)
from reflective_memory import HashingEmbedder
from reflective_memory.io import load_conversations
from reflective_memory.recall import fitted_gate

CHATS = [
    (
        "Chat_A_Ines_Tom",
        "Ines",
        "Tom",
        [
            [
                ("Ines", "hey!! finally moved into the new flat in Porto lol"),
                ("Tom", "omg congrats, is it the one near the river?"),
                ("Ines", "yes two blocks from the river, tiny balcony but the light is amazing"),
                ("Tom", "we need a housewarming"),
            ],
            [
                ("Tom", "started cello lessons on tuesday, my fingers hurt so bad"),
                ("Ines", "cello?? since when do you play music"),
                ("Tom", "since my aunt gave me her old one, teacher is called Marta"),
                ("Ines", "haha ok Yo-Yo Ma"),
            ],
            [
                ("Ines", "my cat Pixel knocked the plant off the balcony again"),
                ("Tom", "that cat is a menace"),
                ("Ines", "vet says she is just bored, need more toys"),
            ],
        ],
        [
            ("Where did Ines move to?", ["D1:1", "D1:3"]),
            ("What instrument is Tom learning?", ["D2:1", "D2:3"]),
            ("What is the name of Ines's cat?", ["D3:1"]),
        ],
    ),
    (
        "Chat_B_Ana_Lu",
        "Ana",
        "Lu",
        [
            [
                ("Ana", "booked the train to Lisbon for the 12th, so excited"),
                ("Lu", "nice! how long are you staying"),
                ("Ana", "five days, staying with my cousin Rita"),
            ],
            [
                ("Lu", "got the job at the bakery!!"),
                ("Ana", "noooo way congrats, the one on main street?"),
                ("Lu", "yep, I start at 5am every day though, rip my sleep"),
            ],
        ],
        [
            ("Who is Ana staying with in Lisbon?", ["D1:3"]),
            ("Where does Lu work now?", ["D2:1", "D2:3"]),
            ("What time does Lu start work?", ["D2:3"]),
        ],
    ),
]


def _locomo() -> list[dict]:
    out = []
    for sample, a, b, sessions, qa in CHATS:
        conv: dict = {"speaker_a": a, "speaker_b": b}
        for s, turns in enumerate(sessions, start=1):
            conv[f"session_{s}_date_time"] = f"7:00 pm on {s + 1} May, 2024"
            conv[f"session_{s}"] = [
                {"speaker": who, "dia_id": f"D{s}:{i}", "text": text}
                for i, (who, text) in enumerate(turns, start=1)
            ]
        qas = [{"question": q, "answer": "-", "evidence": ev, "category": 1} for q, ev in qa]
        out.append({"sample_id": sample, "conversation": conv, "qa": qas})
    return out


def _row(data: str, group: str, m: float, h: float, fam: float, rec: float) -> GateRow:
    return GateRow(data, group, f"q {group} {m}", "1", m, h, fam, rec, 20.0, 40.0)


def test_folds_leave_one_conversation_out_or_five_by_question() -> None:
    chats = [_row("realtalk", f"chat{i % 3}", 0.3, 1.0, 0.5, 0.5) for i in range(9)]
    haystacks = [_row("lme", f"q{i}", 0.3, 1.0, 0.5, 0.5) for i in range(12)]
    folds = folds_of([*chats, *haystacks])
    assert folds[:9].tolist() == [0, 1, 2] * 3
    assert folds[9:].tolist() == [3 + i % 5 for i in range(12)]


def test_cross_validation_routes_held_out_questions_by_the_others_fit() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(300):
        m = float(rng.uniform(0.15, 0.65))
        gain = 0.1 if m < 0.3 else -0.03
        rows.append(_row("lme", f"q{i}", m, float(rng.uniform(0.5, 2.3)), 0.6, 0.6 + gain))
    routed = cross_validate(rows)
    s = summarize(rows, routed)
    assert 0.15 <= s["share_routed"] <= 0.3 and s["routed_gain"] > 0.05
    assert s["coverage_gated"] > s["coverage_familiarity"]
    assert s["p50_ms_familiarity"] == 20.0 and s["p50_ms_gated"] == 20.0
    nothing = summarize(rows, np.zeros(len(rows), dtype=bool))
    assert nothing["routed"] == 0 and nothing["routed_gain"] is None


def test_collect_rows_asks_each_question_down_both_paths(tmp_path) -> None:
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(_locomo()))
    rows = collect_rows(load_conversations(path), HashingEmbedder(64), "chats.json", progress=False)
    assert [r.question for r in rows] == [q for *_, qa in CHATS for q, _ in qa]
    assert {r.group for r in rows} == {"Chat_A_Ines_Tom", "Chat_B_Ana_Lu"}
    for r in rows:
        assert 0.0 <= r.familiarity <= 1.0 and 0.0 <= r.recollection <= 1.0
        assert np.isfinite(r.mean_score) and r.entropy >= 0.0
        assert r.ms_familiarity > 0 and r.ms_recollection > 0
    # the whole history fits in 500 words: both paths cover every evidence turn
    assert all(r.familiarity == r.recollection == 1.0 for r in rows)


def test_fit_gate_command_caches_the_table_and_writes_the_fit(tmp_path, capsys, gate_file) -> None:
    from reflective_memory.cli import main

    data = tmp_path / "chats.json"
    data.write_text(json.dumps(_locomo()))
    args = ["bench", "fit-gate", "--data", str(data), "--embedder", "hashing", "--cache", "none"]
    args += ["--tables", str(tmp_path / "tables"), "--json", str(tmp_path / "fit.json"), "--write"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "gate for hashing:256" in out and "| chats.json cross-validated | 6 |" in out
    table = tmp_path / "tables" / "gate-chats.json.gz"
    with gzip.open(table, "rt") as fh:
        cached = json.load(fh)
    assert cached["key"]["embedder"] == "hashing:256" and len(cached["rows"]) == 6
    cal, reason = fitted_gate("hashing:256", 10, 20.0)
    assert cal is not None, reason
    measured = json.loads(gate_file.read_text())["embedders"]["hashing:256"]["measured"]
    assert measured["cross_validated"]["questions"] == 6
    # A second run reads the cached table: rows changed in it are what the fit sees.
    cached["rows"] = [{**r, "recollection": 0.0} for r in cached["rows"]]
    with gzip.open(table, "wt") as fh:
        json.dump(cached, fh)
    assert main(args) == 0
    assert json.loads((tmp_path / "fit.json").read_text())["gate"]["recollection_rate"] == 0.0
