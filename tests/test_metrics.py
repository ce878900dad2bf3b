import random

import pytest
from reflective_memory.errors import InvalidInputError
from reflective_memory.segment.metrics import (
    boundary_f1,
    evaluate_segmentations,
    labels_to_spans,
    pk,
    score_dialogue,
    segment_score,
    spans_to_labels,
    window_diff,
    window_size,
)


def test_labels_round_trip():
    spans = [(0, 2), (2, 3), (3, 5)]
    assert spans_to_labels(spans) == [0, 1, 1, 0, 0]
    assert labels_to_spans([0, 1, 1, 0, 0]) == spans
    assert labels_to_spans([0, 0, 1]) == [(0, 3)]  # a 1 on the last unit means nothing


def test_perfect_segmentation():
    ref = [(0, 3), (3, 5), (5, 9)]
    s = score_dialogue(ref, ref)
    assert (s.pk, s.wd, s.f1, s.score) == (0.0, 0.0, 1.0, 1.0)


def test_shifted_boundary_hand_computed():
    # ref labels 001000, hyp 010000, k = max(2, round(6/2/2)) = 2, 5 windows.
    ref = [(0, 3), (3, 6)]
    hyp = [(0, 2), (2, 6)]
    assert window_size(ref) == 2
    assert pk(ref, hyp) == pytest.approx(2 / 5)
    assert window_diff(ref, hyp) == pytest.approx(2 / 5)
    assert boundary_f1(ref, hyp) == 0.0
    assert score_dialogue(ref, hyp).score == pytest.approx((0 + 0.6 + 0.6) / 4)


def test_extra_boundary_pk_and_wd_differ():
    # ref 001000, hyp 011000: window 0 differs for both, window 1 has 1 vs 2 boundaries.
    ref = [0, 0, 1, 0, 0, 0]
    hyp = [0, 1, 1, 0, 0, 0]
    assert pk(ref, hyp) == pytest.approx(1 / 5)
    assert window_diff(ref, hyp) == pytest.approx(2 / 5)
    assert boundary_f1(ref, hyp) == pytest.approx(2 / 3)
    assert score_dialogue(ref, hyp).score == pytest.approx((4 / 3 + 0.8 + 0.6) / 4)


def test_no_boundaries_anywhere_f1_is_zero():
    s = score_dialogue([(0, 4)], [(0, 4)])
    assert (s.pk, s.wd, s.f1) == (0.0, 0.0, 0.0)
    assert s.score == 0.5


def test_window_size_rounding_and_bounds():
    assert window_size([(0, 5), (5, 10)]) == 2  # 2.5 rounds to even
    assert window_size([(0, 6), (6, 12)]) == 3
    assert window_size([(0, 1)]) == 1
    assert window_size([(0, 2)]) == 2


def test_explicit_k_and_segment_score():
    ref = [0, 0, 1, 0, 0, 0]
    hyp = [0, 0, 0, 0, 0, 0]
    # k=3: windows [0:3],[1:4],[2:5],[3:6] -> ref has a boundary in the first three.
    assert pk(ref, hyp, k=3) == pytest.approx(3 / 4)
    assert segment_score(0.2, 0.4, 0.5) == pytest.approx((1.0 + 0.8 + 0.6) / 4)


def test_corpus_mean_and_errors():
    res = evaluate_segmentations([([(0, 3), (3, 6)], [(0, 3), (3, 6)]), ([(0, 4)], [(0, 4)])])
    assert res.n == 2
    assert res.f1 == pytest.approx(0.5)
    assert res.score == pytest.approx(0.75)
    with pytest.raises(InvalidInputError):
        evaluate_segmentations([])
    with pytest.raises(InvalidInputError):
        pk([(0, 3)], [(0, 2)])  # hypothesis does not cover the dialogue
    with pytest.raises(InvalidInputError):
        pk([0, 2, 0], [0, 0, 0])


def test_matches_nltk_reference_implementation():
    nltk_seg = pytest.importorskip("nltk.metrics.segmentation")
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(3, 25)
        ref = [int(rng.random() < 0.3) for _ in range(n)]
        hyp = [int(rng.random() < 0.3) for _ in range(n)]
        ref[-1] = hyp[-1] = 0
        k = window_size(ref)
        r, h = "".join(map(str, ref)), "".join(map(str, hyp))
        assert pk(ref, hyp) == pytest.approx(nltk_seg.pk(r, h, k=k))
        assert window_diff(ref, hyp) == pytest.approx(nltk_seg.windowdiff(r, h, k))
