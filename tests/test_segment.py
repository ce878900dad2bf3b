import json

import numpy as np
import pytest
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.segment import (
    EmbeddingSegmenter,
    FixedWindowSegmenter,
    LLMSegmenter,
    Segmenter,
    TextTilingSegmenter,
    boundaries_to_spans,
    check_spans,
    make_segmenter,
    parse_segmentation,
    unit_spans,
    units_to_turn_spans,
)
from reflective_memory.segment.embedding import (
    FEATURE_NAMES,
    depth_scores,
    gap_features,
    load_weights,
    pick_boundaries,
    window_similarities,
)
from reflective_memory.types import Turn, Usage

TOPICS = [
    [
        "do you like cats?",
        "yes cats are my favourite pet",
        "my cat sleeps all day on the sofa",
        "cats purr when they are happy",
    ],
    [
        "what is your job?",
        "i teach math at a high school",
        "math teaching is hard work",
        "my students do math homework",
    ],
    [
        "have you been to paris?",
        "paris is lovely in spring",
        "we saw the eiffel tower in paris",
        "paris has great bakeries",
    ],
]


def make_turns(texts, roles=None):
    roles = roles or ["user" if i % 2 == 0 else "assistant" for i in range(len(texts))]
    return [
        Turn("u1", "s1", r, t, f"s1:{i}", i)
        for i, (t, r) in enumerate(zip(texts, roles, strict=False))
    ]


def topic_turns():
    return make_turns([t for topic in TOPICS for t in topic])


# ---------------------------------------------------------------- units and helpers


def test_unit_spans_groups_exchanges():
    roles = ["assistant", "user", "assistant", "assistant", "user", "user", "assistant"]
    turns = make_turns(list("abcdefg"), roles)
    assert unit_spans(turns, "exchange") == [(0, 1), (1, 4), (4, 7)]
    assert unit_spans(turns, "turn") == [(i, i + 1) for i in range(7)]
    no_user = make_turns(list("abc"), ["a", "b", "a"])
    assert unit_spans(no_user, "exchange") == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(InvalidInputError):
        unit_spans(turns, "sentence")


def test_boundaries_and_unit_mapping():
    assert boundaries_to_spans([0, 2, 2, -1, 7], 5) == [(0, 2), (2, 5)]
    assert boundaries_to_spans([], 0) == []
    units = [(0, 2), (2, 3), (3, 6)]
    assert units_to_turn_spans([(0, 1), (1, 3)], units) == [(0, 2), (2, 6)]


# ---------------------------------------------------------------- offline segmenters


def test_depth_and_similarity_shapes():
    emb = HashingEmbedder(64).encode(["a b", "a b", "c d", "c d"])
    sims = window_similarities(emb, 1)
    assert sims.shape == (3,)
    assert np.argmin(sims) == 1
    assert depth_scores(np.array([0.9, 0.2, 0.8])).tolist() == pytest.approx([0.0, 1.3, 0.0])
    feats = gap_features(emb, ["a b", "a b", "c d?", "c d"], ["a b", "a b", "c d?", "c d"])
    assert feats.shape == (3, len(FEATURE_NAMES))
    assert feats[1, FEATURE_NAMES.index("question_next")] == 1.0


def test_pick_boundaries_cutoff_and_local_max():
    s = np.array([0.0, 3.0, 2.9, 0.0, 0.0, 2.0, 0.0])
    assert pick_boundaries(s, 0.5) == [2, 6]
    assert pick_boundaries(s, 0.5, local_max=False) == [2, 3, 6]
    assert pick_boundaries(np.ones(5), 0.0) == []


@pytest.mark.parametrize("cls", [TextTilingSegmenter, EmbeddingSegmenter])
def test_offline_segmenters_find_topic_shifts(cls):
    seg = cls(HashingEmbedder(256), unit="turn")
    assert isinstance(seg, Segmenter)
    turns = topic_turns()
    spans = check_spans(seg.segment(turns), len(turns))
    starts = {a for a, _ in spans[1:]}
    assert starts & {4, 8}, spans  # at least one true shift found
    assert len(spans) <= 6


def test_offline_exchange_units_never_split_an_exchange():
    seg = EmbeddingSegmenter(HashingEmbedder(128))
    turns = topic_turns()
    spans = seg.segment(turns)
    check_spans(spans, len(turns))
    assert all(turns[a].role == "user" for a, _ in spans)


def test_offline_edge_cases():
    seg = EmbeddingSegmenter(HashingEmbedder(64), unit="turn")
    assert seg.segment([]) == []
    assert seg.segment(make_turns(["hi"])) == [(0, 1)]
    assert seg.segment(make_turns(["hi", "there"])) == [(0, 2)]
    with pytest.raises(ConfigError):
        EmbeddingSegmenter(HashingEmbedder(64), unit="word")
    with pytest.raises(ConfigError):
        TextTilingSegmenter(HashingEmbedder(64), window=0)


def test_bundled_weights_are_small_and_consistent(tmp_path):
    data = load_weights()
    assert data["features"] == list(FEATURE_NAMES)
    bad = tmp_path / "w.json"
    bad.write_text(json.dumps({"features": ["x"], "coef": [1.0]}))
    with pytest.raises(ConfigError):
        EmbeddingSegmenter(HashingEmbedder(64), weights=bad)
    with pytest.raises(ConfigError):
        load_weights(tmp_path / "missing.json")


def test_make_segmenter():
    emb = HashingEmbedder(64)
    assert isinstance(make_segmenter("embedding", embedder=emb), EmbeddingSegmenter)
    assert isinstance(make_segmenter("texttiling", embedder=emb), TextTilingSegmenter)
    assert isinstance(make_segmenter("fixed", window=3), FixedWindowSegmenter)
    with pytest.raises(ConfigError):
        make_segmenter("magic")


# ---------------------------------------------------------------- LLM answer parsing


def jl(*segs, tag=True):
    lines = [
        json.dumps(
            {
                "segment_id": i,
                "start_exchange_number": a,
                "end_exchange_number": b,
                "num_exchanges": b - a + 1,
            }
        )
        for i, (a, b) in enumerate(segs)
    ]
    body = "\n".join(lines)
    return f"<segmentation>\n{body}\n</segmentation>" if tag else body


def test_parse_valid():
    out = parse_segmentation(jl((0, 3), (4, 7), (8, 11)), 12)
    assert out.status == "valid" and out.starts == [0, 4, 8] and out.covered == 12


@pytest.mark.parametrize(
    "answer,n,starts,status",
    [
        ("Sure!\n```json\n" + jl((0, 1), (2, 5)) + "\n```\nDone.", 6, [0, 2], "valid"),
        (jl((0, 1), (2, 5), tag=False), 6, [0, 2], "repaired"),  # no tags
        (jl((1, 2), (3, 6)), 6, [0, 2], "repaired"),  # one-based
        (jl((0, 3), (2, 5)), 6, [0, 2, 4], "repaired"),  # overlap
        (jl((0, 1), (4, 5)), 6, [0, 2, 4], "repaired"),  # gap
        (jl((0, 2), (3, 40)), 6, [0, 3], "repaired"),  # out of range
        (
            "<segmentation>{'start_exchange_number': 0, 'end_exchange_number': 2,}\n"
            "{start: 3, end: 5}</segmentation>",
            6,
            [0, 3],
            "repaired",
        ),
        ("<segmentation>\nSegment A covers exchanges 0-2, segment B 3-5", 6, [0, 3], "repaired"),
    ],
)
def test_parse_repairs(answer, n, starts, status):
    out = parse_segmentation(answer, n)
    assert out.starts == starts
    assert out.status == status


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   ",
        "I cannot do that.",
        "<segmentation></segmentation>",
        '<segmentation>{"topic": "cats"}</segmentation>',
    ],
)
def test_parse_unusable(answer):
    assert parse_segmentation(answer, 5).status == "unusable"


def test_parse_partial_reports_coverage():
    out = parse_segmentation(jl((0, 2), (3, 4)), 10)
    assert out.covered == 5 and out.starts == [0, 3]


# ---------------------------------------------------------------- LLM segmenter


class ScriptedLLM:
    def __init__(self, answers):
        self.answers = list(answers)
        self.prompts = []

    def complete(self, prompt):
        self.prompts.append(prompt)
        ans = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(ans, Exception):
            raise ans
        return ans


class RecordingFallback:
    def __init__(self, starts):
        self.starts = starts
        self.calls = 0

    def segment(self, turns):
        self.calls += 1
        return boundaries_to_spans(self.starts, len(turns))


SCRIPTED = {
    "valid": jl((0, 3), (4, 7), (8, 11)),
    "fenced": "```\n" + jl((0, 3), (4, 7), (8, 11)) + "\n```",
    "partial": jl((0, 3), (4, 5)),
    "overlapping": jl((0, 5), (4, 11)),
    "out_of_range": jl((0, 3), (4, 99)),
    "non_json": "The conversation has three topics: cats, jobs and Paris.",
    "empty": "",
    "raises": RuntimeError("model down"),
}


@pytest.mark.parametrize("case", sorted(SCRIPTED))
def test_llm_segmenter_always_returns_a_valid_tiling(case):
    turns = topic_turns()
    fb = RecordingFallback([4, 8])
    seg = LLMSegmenter(ScriptedLLM([SCRIPTED[case]]), fallback=fb, unit="turn")
    usage = Usage()
    out = seg.segment_detailed(turns, usage=usage)
    spans = check_spans(out.spans, len(turns))
    assert sum(b - a for a, b in spans) == len(turns)  # no exchange lost
    assert usage.llm_calls == 1
    status = out.windows[0][2]
    if case in ("valid", "fenced"):
        assert spans == [(0, 4), (4, 8), (8, 12)] and status == "valid" and fb.calls == 0
    elif case in ("non_json", "empty", "raises"):
        assert status == "fallback" and spans == [(0, 4), (4, 8), (8, 12)] and fb.calls == 1
        assert usage.failures == 1
    elif case == "partial":
        # LLM covered 0..5, the tail from 6 goes to the fallback (which cuts at 8).
        assert spans == [(0, 4), (4, 6), (6, 8), (8, 12)] and status == "repaired"
    elif case == "overlapping":
        assert spans == [(0, 4), (4, 6), (6, 12)]
    elif case == "out_of_range":
        assert spans == [(0, 4), (4, 12)]


def test_llm_prompt_numbers_exchanges_and_uses_rubric():
    from reflective_memory.segment import Rubric

    roles = ["user", "assistant"] * 3
    turns = make_turns([f"utterance {i}" for i in range(6)], roles)
    llm = ScriptedLLM([jl((0, 0), (1, 2))])
    rubric = Rubric(items=["Cut when the subject changes."], examples=["example one"])
    seg = LLMSegmenter(llm, fallback=RecordingFallback([]), rubric=rubric)
    spans = seg.segment(turns)
    assert spans == [(0, 2), (2, 6)]  # exchange 1 starts at turn 2
    prompt = llm.prompts[0]
    assert prompt.startswith("# Segmentation rubric")
    assert "Cut when the subject changes." in prompt and "example one" in prompt
    assert "[Exchange 0]:\n[user]: utterance 0\n[assistant]: utterance 1" in prompt
    assert "[Exchange 2]" in prompt and "[Exchange 3]" not in prompt
    assert "<segmentation>" in prompt


def test_llm_windows_overlap_and_stitch():
    n = 25
    turns = make_turns([f"u{i}" for i in range(n)])
    seg = LLMSegmenter(
        lambda p: "", fallback=RecordingFallback([]), unit="turn", window=10, overlap=4
    )
    wins = seg.windows(n)
    assert wins == [(0, 10), (6, 16), (12, 22), (18, 25)]
    assert seg.windows(10) == [(0, 10)]

    # Each window answers with cuts at local positions 3 and 8 (global ws+3, ws+8).
    def answer(prompt):
        count = prompt.count("[Exchange ") - 1  # minus the one in the instructions' example text
        return jl((0, 2), (3, 7), (8, count - 1)) if count > 8 else jl((0, 2), (3, count - 1))

    seg = LLMSegmenter(answer, fallback=RecordingFallback([]), unit="turn", window=10, overlap=4)
    out = seg.segment_detailed(turns)
    assert out.usage.llm_calls == 4
    starts = [a for a, _ in out.spans]
    # window 0 owns [0, 8): cuts 3; window 1 owns [8, 14): 6+3=9, (6+8=14 is not owned);
    # window 2 owns [14, 20): 12+3=15; window 3 owns [20, 25): 18+3=21.
    assert starts == [0, 3, 9, 15, 21]
    check_spans(out.spans, n)


def test_llm_windows_without_overlap_force_a_cut():
    seg = LLMSegmenter(
        lambda p: jl((0, 4)), fallback=RecordingFallback([]), unit="turn", window=5, overlap=0
    )
    spans = seg.segment(make_turns([f"u{i}" for i in range(12)]))
    assert spans == [(0, 5), (5, 10), (10, 12)]


def test_llm_segmenter_config_errors():
    with pytest.raises(ConfigError):
        LLMSegmenter(None)
    with pytest.raises(ConfigError):
        LLMSegmenter(lambda p: "", window=10, overlap=5)
    with pytest.raises(ConfigError):
        LLMSegmenter(lambda p: "", unit="word")


def test_llm_segmenter_short_sessions_skip_the_llm():
    llm = ScriptedLLM([""])
    seg = LLMSegmenter(llm, fallback=RecordingFallback([]))
    assert seg.segment([]) == []
    assert seg.segment(make_turns(["hello"])) == [(0, 1)]
    assert llm.prompts == []


def test_llm_segmenter_default_fallback_is_offline_embedding():
    seg = LLMSegmenter(lambda p: "no idea", embedder=HashingEmbedder(64), unit="turn")
    turns = topic_turns()
    out = seg.segment_detailed(turns)
    check_spans(out.spans, len(turns))
    assert isinstance(seg.fallback, EmbeddingSegmenter)
    assert out.windows[0][2] == "fallback"
