"""`rmm.turn_learning`: the turn ranker's weights taught by citations, and how they are kept."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.ranker import TurnRanker, load_ranker
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.text_rows import text_rows
from reflective_memory.rmm.turn_learning import (
    GATE_SIGMAS,
    PRIOR_OWNER,
    SHARED_STATE,
    USER_STATE,
    TurnEpisode,
    TurnLearning,
    _decode,
    average_precision,
    gate_t,
    passage_gradient,
)
from reflective_memory.storage.state import FileStateStore

F = len(FEATURES)


def _episode(rng: np.random.Generator, cited=(True, False, False, True)) -> TurnEpisode:
    groups = np.array([0, 0, 1, 2, 2, 3])
    return TurnEpisode(rng.normal(size=(len(groups), F)), groups, tuple(cited))


def _loss(w: np.ndarray, ep: TurnEpisode, update: str) -> float:
    got = passage_gradient(w, ep, update)
    assert got is not None
    return got[0]


@pytest.mark.parametrize("update", ["pairwise", "reinforce", "expected"])
def test_the_gradient_matches_finite_differences(update):
    rng = np.random.default_rng(0)
    ep, w = _episode(rng), rng.normal(size=F) * 0.3
    _, grad = passage_gradient(w, ep, update)
    eps = 1e-6
    numeric = np.array(
        [
            (_loss(w + eps * e, ep, update) - _loss(w - eps * e, ep, update)) / (2 * eps)
            for e in np.eye(F)
        ]
    )
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("update", ["pairwise", "reinforce", "expected"])
def test_a_step_raises_the_cited_passages_over_the_others(update):
    rng = np.random.default_rng(1)
    ep, w = _episode(rng), np.zeros(F)
    _, grad = passage_gradient(w, ep, update)
    scores = lambda v: [  # noqa: E731 - a passage's log-score: logsumexp of its turns
        float(np.log(np.exp(ep.rows[ep.groups == g] @ v).sum())) for g in range(4)
    ]
    before, after = scores(w), scores(w - 0.05 * grad)
    r = np.array([1.0, -1.0, -1.0, 1.0])  # passages 0 and 3 are cited

    def reward(s: list[float]) -> float:  # expected reward under a softmax over the passages
        p = np.exp(np.array(s) - max(s))
        return float(p @ r / p.sum())

    assert reward(after) > reward(before)
    if update != "expected":  # it lifts what is likely; these lift every cited passage
        gap = lambda s: min(s[0], s[3]) - max(s[1], s[2])  # noqa: E731
        assert gap(after) > gap(before)


def test_nothing_to_learn_without_a_contrast():
    rng = np.random.default_rng(2)
    for cited in ((True,) * 4, (False,) * 4):
        assert passage_gradient(np.zeros(F), _episode(rng, cited), "pairwise") is None
    one = TurnEpisode(np.ones((2, F)), np.array([0, 0]), (True,))
    assert passage_gradient(np.zeros(F), one, "reinforce") is None


def test_reinforce_teaches_nothing_on_average_from_random_citations_pairwise_flattens():
    """Citations independent of the passages: REINFORCE's mean step is ~0, pairwise shrinks w."""
    rng = np.random.default_rng(3)
    w = load_ranker().vector
    totals = {"pairwise": np.zeros(F), "reinforce": np.zeros(F)}
    for _ in range(3000):
        rows = rng.normal(size=(5, F)) * 0.5
        cited = tuple(bool(x) for x in rng.random(5) < 0.4)
        ep = TurnEpisode(rows, np.arange(5), cited)
        for update in totals:
            got = passage_gradient(w, ep, update)
            if got is not None:
                totals[update] += got[1]
    # a step is -grad: pairwise moves the weights toward zero, REINFORCE barely at all
    assert float(-totals["pairwise"] @ w) < 0
    assert abs(float(totals["reinforce"] @ w)) < 0.2 * abs(float(totals["pairwise"] @ w))


def test_shared_and_user_offsets_and_the_pull_back_to_the_shared_weights():
    cfg = RerankConfig(
        save_every=1000, turn_learning_rate=0.1, turn_user_learning_rate=0.1, turn_pull=0.5
    )
    rng = np.random.default_rng(4)
    ep = _episode(rng)
    # a prior that ranks the cited passages (0 and 3) a little below the others, so what the
    # episode teaches ranks them better and the gate opens, whatever the shipped weights are
    cited = np.isin(ep.groups, [0, 3])
    lift = ep.rows[cited].mean(axis=0) - ep.rows[~cited].mean(axis=0)
    prior = TurnRanker(dict(zip(FEATURES, (-0.01 * lift).tolist(), strict=True)))
    learning = TurnLearning(cfg, prior, FileStateStore())
    for _ in range(50):
        learning.learn("u1", ep)
    seen = learning.inspect("u1")
    assert seen["episodes"] == 50 and seen["user_episodes"] == 50
    shared = np.array([seen["shared"][n] for n in FEATURES])
    own = np.array([seen["user"][n] for n in FEATURES])
    # the same gradient at the same rate: the pulled user offsets stay below the shared ones
    assert 0 < np.linalg.norm(own) < np.linalg.norm(shared)
    other = learning.inspect("u2")
    assert not any(other["user"].values())
    assert other["shared_gate"]["serves"] and not other["user_gate"]["serves"]
    np.testing.assert_allclose(
        learning.weights("u2"), learning.prior_vector + shared, rtol=0, atol=1e-12
    )


def test_learning_off_ranks_with_the_prior():
    learning = TurnLearning(RerankConfig(enabled=False), load_ranker(), FileStateStore())
    np.testing.assert_array_equal(learning.weights("u1"), load_ranker().vector)


def test_a_save_adds_to_what_another_process_stored():
    state = FileStateStore()
    cfg = RerankConfig(save_every=1000, turn_learning_rate=0.1, scope="shared")
    a, b = (TurnLearning(cfg, load_ranker(), state) for _ in range(2))
    rng = np.random.default_rng(5)
    ep = _episode(rng)
    a.learn("u1", ep)
    b.learn("u1", ep)
    expected = a.inspect()["shared"]
    a.flush()
    b.flush()
    assert state.version(PRIOR_OWNER, SHARED_STATE) == 2
    c = TurnLearning(cfg, load_ranker(), state).inspect()
    assert c["episodes"] == 2
    for n in FEATURES:
        assert c["shared"][n] == pytest.approx(2 * expected[n], abs=1e-7)
    assert b.inspect()["episodes"] == 2  # a save reads the others' updates too


def test_text_rows_fill_the_columns_a_text_has():
    rows = text_rows(
        "dogs bark", ["cats purr", "dogs bark loudly", "dogs"], np.array([0.1, 0.9, 0.6])
    )
    col = {n: i for i, n in enumerate(FEATURES)}
    assert rows.shape == (3, F)
    assert rows[0, col["log_vote"]] == 0.0 and rows[2, col["log_vote"]] < rows[1, col["log_vote"]]
    assert rows[1, col["cosine_gap"]] == 0.0 and rows[0, col["cosine_gap"]] == pytest.approx(-0.8)
    assert rows[0, col["bm25"]] == 0.0 and max(rows[:, col["bm25"]]) == 1.0
    others = [
        i
        for n, i in col.items()
        if n not in ("log_vote", "own_rank", "cosine", "cosine_gap", "bm25")
    ]
    assert not rows[:, others].any()
    assert text_rows("q", [], np.zeros(0)).shape == (0, F)


def test_average_precision_of_the_cited_passages_among_the_shown_ones():
    col = FEATURES.index("cosine")
    rows = np.zeros((4, F))
    rows[:, col] = [3.0, 2.0, 1.0, 0.5]  # passages 0, 1, 2 (two turns: 1.0 and 0.5)
    w = np.zeros(F)
    w[col] = 1.0
    ep = TurnEpisode(rows, np.array([0, 1, 2, 2]), (True, False, True))
    assert average_precision(w, ep) == pytest.approx((1 / 1 + 2 / 3) / 2)
    assert average_precision(-w, ep) == pytest.approx((1 / 1 + 2 / 3) / 2)  # 2, 1, 0
    assert average_precision(w, TurnEpisode(rows, ep.groups, (False, True, False))) == 0.5
    assert average_precision(w, TurnEpisode(rows, ep.groups, (False,) * 3)) is None


def _consistent(rng: np.random.Generator, n: int, *, noise: bool = False) -> list[TurnEpisode]:
    """Episodes whose cited passage has a high value of one feature (or cited at random)."""
    col = FEATURES.index("bm25")
    out = []
    for _ in range(n):
        rows = rng.normal(size=(6, F)) * 0.3
        good = int(rng.integers(4))
        rows[good, col] += 2.0
        cited = [False] * 4
        cited[int(rng.integers(4)) if noise else good] = True
        out.append(TurnEpisode(rows, np.array([0, 1, 2, 3, 3, 0]), tuple(cited)))
    return out


def test_learned_offsets_rank_only_once_they_beat_the_weights_they_replace():
    """A prequential gate: what citations teach serves once it ranks later citations better."""
    cfg = RerankConfig(save_every=1000, turn_learning_rate=0.2, turn_user_learning_rate=0.2)
    prior = load_ranker()
    learning = TurnLearning(cfg, prior, FileStateStore())
    episodes = _consistent(np.random.default_rng(6), 60)
    first = learning.learn("u1", episodes[0])
    assert not first.serving  # one episode proves nothing: the prior still ranks
    np.testing.assert_array_equal(learning.weights("u1"), prior.vector)
    fits = [learning.learn("u1", ep) for ep in episodes[1:]]
    assert fits[-1].serving
    seen = learning.inspect("u1")
    assert seen["shared_gate"]["serves"] and seen["shared_gate"]["mean_gain"] > 0
    assert seen["shared_gate"]["judged"] == 59  # zero offsets are not judged
    assert seen["shared_gate"]["t"] > GATE_SIGMAS  # what `inspect` shows is what the gate read
    w = np.array([seen["weights"][n] for n in FEATURES])
    assert w[FEATURES.index("bm25")] > prior.vector[FEATURES.index("bm25")]


def test_random_citations_leave_the_prior_ranking():
    cfg = RerankConfig(save_every=1000, turn_learning_rate=0.2, turn_user_learning_rate=0.2)
    prior = load_ranker()
    learning = TurnLearning(cfg, prior, FileStateStore())
    for ep in _consistent(np.random.default_rng(7), 200, noise=True):
        learning.learn("u1", ep)
    seen = learning.inspect("u1")
    assert seen["episodes"] == 200 and any(seen["shared"].values())  # it learned ...
    assert not seen["shared_gate"]["serves"] and not seen["user_gate"]["serves"]
    np.testing.assert_array_equal(learning.weights("u1"), prior.vector)  # ... and serves none


def test_the_gate_is_stored_with_the_offsets(tmp_path):
    cfg = RerankConfig(save_every=1000, turn_learning_rate=0.2, turn_user_learning_rate=0.2)
    state = FileStateStore(tmp_path)
    a = TurnLearning(cfg, load_ranker(), state)
    for ep in _consistent(np.random.default_rng(6), 40):
        a.learn("u1", ep)
    a.flush()
    b = TurnLearning(cfg, load_ranker(), FileStateStore(tmp_path))
    assert b.inspect("u1")["user_gate"] == a.inspect("u1")["user_gate"]
    np.testing.assert_allclose(b.weights("u1"), a.weights("u1"))
    assert state.get("u1", USER_STATE) is not None


# ------------------------------------------------- a deletion anywhere wins (issue 51)
USERS = ("ana", "bo")
PROCS = st.integers(0, 1)


class DeletionMachine(RuleBasedStateMachine):
    """Two processes' learning on one state directory: learn, rank, save, delete users.

    Each `TurnLearning` has its own `FileStateStore` on the directory (no shared caches). The
    model says what each save writes: a process's unsaved user episodes are added to the
    stored state only when it is the generation they were learned on; a deletion (`forget`,
    what `delete_user` calls) erases the state, so what any process learned before it is
    never stored again. The shared offsets keep every episode, as in-process deletion does.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rm-deletion-"))
        cfg = RerankConfig(save_every=10**6, turn_learning_rate=0.1, turn_user_learning_rate=0.1)
        self.procs = [
            TurnLearning(cfg, load_ranker(), FileStateStore(self.dir), clock=lambda: 0.0)
            for _ in range(2)
        ]
        self.episode = _episode(np.random.default_rng(9))
        self.generations = itertools.count(1)
        self.stored: dict[str, tuple[int, int] | None] = dict.fromkeys(USERS)  # (gen, episodes)
        # per process and user: (generation it rests on or None, unsaved user episodes)
        self.cache: list[dict[str, tuple[int | None, int]]] = [{}, {}]
        self.shared_pending, self.shared_stored = [0, 0], 0

    def _rest(self, p: int, user: str) -> tuple[int | None, int]:
        """The process's offsets of the user, read from the store when it holds none."""
        if user not in self.cache[p]:
            got = self.stored[user]
            self.cache[p][user] = (None if got is None else got[0], 0)
        return self.cache[p][user]

    @rule(p=PROCS, user=st.sampled_from(USERS))
    def rank(self, p: int, user: str) -> None:
        self.procs[p].weights(user)
        self._rest(p, user)

    @rule(p=PROCS, user=st.sampled_from(USERS))
    def learn(self, p: int, user: str) -> None:
        assert self.procs[p].learn(user, self.episode) is not None
        gen, pending = self._rest(p, user)
        if gen is None:  # the state is stored before a first step is learned on it
            if self.stored[user] is None:
                self.stored[user] = (next(self.generations), 0)
            gen = self.stored[user][0]
        self.cache[p][user] = (gen, pending + 1)
        self.shared_pending[p] += 1

    @rule(p=PROCS)
    def flush(self, p: int) -> None:
        self.procs[p].flush()
        for user, (gen, pending) in list(self.cache[p].items()):
            if not pending:
                del self.cache[p][user]
                continue
            got = self.stored[user]
            if got is not None and got[0] == gen:
                self.stored[user] = (gen, got[1] + pending)
                self.cache[p][user] = (gen, 0)
            else:  # learned on a state erased since: dropped
                self.cache[p][user] = (None if got is None else got[0], 0)
        self.shared_stored += self.shared_pending[p]
        self.shared_pending[p] = 0

    @rule(p=PROCS, user=st.sampled_from(USERS))
    def delete(self, p: int, user: str) -> None:
        self.procs[p].forget(user)
        self.cache[p].pop(user, None)
        self.stored[user] = None

    @invariant()
    def the_store_holds_what_the_model_says(self) -> None:
        state = FileStateStore(self.dir)
        for user in USERS:
            got, want = state.get(user, USER_STATE), self.stored[user]
            assert (got is None) == (want is None), user
            assert got is None or _decode(got[1]).episodes == want[1], user
        shared = state.get(PRIOR_OWNER, SHARED_STATE)
        assert (0 if shared is None else _decode(shared[1]).episodes) == self.shared_stored

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


TestDeletionMachine = DeletionMachine.TestCase
TestDeletionMachine.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_gate_t_is_the_mean_gain_in_standard_errors_with_one_worst_case_episode():
    """`gate_t`: n gains of sum `total`, sum of squares `squares`; spread padded by variance 1."""
    gains = [0.5, 0.25, 0.5, 0.0, 0.5, 0.25]
    n, total, squares = len(gains), sum(gains), sum(g * g for g in gains)
    sample_var = (squares - total * total / n + 1.0) / n
    assert gate_t(n, total, squares) == pytest.approx((total / n) / np.sqrt(sample_var / n))
    # equal gains alone would have no spread at all; the worst-case episode keeps t finite
    assert gate_t(4, 2.0, 1.0) == pytest.approx(0.5 / np.sqrt(0.25 / 4))
    assert gate_t(1, 1.0, 1.0) == 0.0 and gate_t(0, 0.0, 0.0) == 0.0
    assert gate_t(10, -2.0, 1.0) < 0  # a learned ranking cited less shows as negative
