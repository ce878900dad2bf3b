import json
from pathlib import Path

import pytest
from reflective_bench.segmentation import evaluate_segmenter, load_dialogues
from reflective_memory.cli import main
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import InvalidInputError
from reflective_memory.segment import FixedWindowSegmenter, LabeledDialogue, TextTilingSegmenter

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "segmentation"


def write(tmp_path, name, content):
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return p


def test_load_tiage(tmp_path):
    p = write(
        tmp_path,
        "t.json",
        {"1": [["hi", "-1"], ["a", "0"], ["b", "1"], ["c", "0"]], "2": [["x", "-1"], ["y", "0"]]},
    )
    d = load_dialogues(p)
    assert [x.spans for x in d] == [((0, 2), (2, 4)), ((0, 2),)]
    assert d[0].utterances == ("hi", "a", "b", "c")


def test_load_superdialseg(tmp_path):
    text = "call_id_0\n0 hello there\n0 hi\n1 new topic\ncall_id_1\n3 only one\n3 two\n"
    d = load_dialogues(write(tmp_path, "s.txt", text))
    assert [x.spans for x in d] == [((0, 2), (2, 3)), ((0, 2),)]
    assert d[0].utterances[0] == "hello there"
    with pytest.raises(InvalidInputError):
        load_dialogues(write(tmp_path, "bad.txt", "0 no header\n"))


def test_load_our_list_format(tmp_path):
    p = write(
        tmp_path,
        "o.json",
        [
            {
                "utterances": ["a", "b", "c"],
                "segments": [1, 2],
                "roles": ["user", "assistant", "user"],
            }
        ],
    )
    d = load_dialogues(p)
    assert d[0].spans == ((0, 1), (1, 3)) and d[0].roles == ("user", "assistant", "user")
    assert [t.role for t in d[0].turns()] == ["user", "assistant", "user"]
    for bad in ([{"utterances": ["a"], "segments": [2]}], [{"utterances": ["a"]}], 5):
        with pytest.raises(InvalidInputError):
            load_dialogues(write(tmp_path, "b.json", bad))
    with pytest.raises(InvalidInputError):
        load_dialogues(tmp_path / "missing.json")


def test_evaluate_segmenter_perfect_and_fixed():
    dlg = LabeledDialogue.from_starts(["a", "b", "c", "d"], [2])
    scores, facts = evaluate_segmenter(FixedWindowSegmenter(2), [dlg])
    assert (scores.pk, scores.wd, scores.f1, scores.score) == (0.0, 0.0, 1.0, 1.0)
    assert facts["mean_pred_segments"] == 2
    with pytest.raises(InvalidInputError):
        evaluate_segmenter(FixedWindowSegmenter(2), [])


def test_cli_bench_segmentation_and_segment(tmp_path, capsys):
    p = write(
        tmp_path,
        "o.json",
        [{"utterances": ["cats purr", "cats nap", "tax forms", "tax dues"], "segments": [2, 2]}],
    )
    assert (
        main(
            [
                "bench",
                "segmentation",
                "--data",
                str(p),
                "--embedder",
                "hashing",
                "--segmenter",
                "fixed",
                "--window",
                "2",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["score"] == 1.0 and rows[0]["segmenter"] == "fixed"
    conv = write(
        tmp_path,
        "c.json",
        {
            "format": "reflective-memory/v1",
            "sessions": [
                {
                    "user_id": "u",
                    "session_id": "s",
                    "turns": [
                        {"role": "user", "text": "do you like cats?"},
                        {"role": "assistant", "text": "yes"},
                    ],
                }
            ],
        },
    )
    assert main(["segment", str(conv), "--embedder", "hashing", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["segments"] == [{"start": 0, "end": 2, "turn_ids": ["s:0", "s:1"]}]


@pytest.mark.skipif(not (DATA / "tiage_dev.json").exists(), reason="dev data not available")
def test_tiage_dev_smoke_with_hashing_embedder():
    dialogues = load_dialogues(DATA / "tiage_dev.json")[:20]
    scores, _ = evaluate_segmenter(
        TextTilingSegmenter(HashingEmbedder(128), unit="turn"), dialogues
    )
    assert 0.0 <= scores.pk <= 1.0 and scores.n == 20
