import dataclasses
import json

import numpy as np
import pytest
import reflective_memory.rmm.features as features
import reflective_memory.rmm.reranker as rerank
import torch
from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode
from reflective_memory.rmm.features import citation_rewards, rank_prior
from reflective_memory.rmm.reranker import Reranker

#: RMM's paper form: no side features, eta 1e-3, b 0.5 (top-M 5, tau 0.5 and batch 4 are
#: `RerankConfig`'s defaults too, given here so the paper's values are explicit).
PAPER = RerankConfig(
    features=(),
    learning_rate=1e-3,
    baseline=0.5,
    signed_features=False,
    top_m=5,
    tau=0.5,
    batch_size=4,
)


def _cfg(**kw) -> RerankConfig:
    """The paper's constants with some changed."""
    return dataclasses.replace(PAPER, **kw)


def _unit(rng, *shape):
    x = rng.normal(size=shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    return _unit(rng, 16), _unit(rng, 20, 16)


def test_zero_init_keeps_retriever_order(data):
    q, m = data
    r = Reranker(16, PAPER)
    assert r.is_identity
    np.testing.assert_allclose(r.score(q, m), m @ q, atol=1e-6)
    assert r.rerank(q, m).order == [int(i) for i in np.argsort(-(m @ q), kind="stable")]
    # with a prior (another retriever's order) the untrained reranker keeps that order
    retr_order = list(range(20))
    prior = rank_prior((m @ q)[retr_order])
    assert r.rerank(q, m, prior).order == retr_order


def test_rank_prior_equals_dense_for_dense_order(data):
    q, m = data
    order = np.argsort(-(m @ q))
    np.testing.assert_allclose(rank_prior((m @ q)[order]), (m @ q)[order])


def test_exploration_samples_head_and_keeps_all(data):
    q, m = data
    r = Reranker(16, _cfg(seed=3))
    heads = {tuple(r.rerank(q, m, explore=True).order[:5]) for _ in range(30)}
    assert len(heads) > 1
    res = r.rerank(q, m, explore=True)
    assert sorted(res.order) == list(range(20)) and res.sampled
    assert not r.rerank(q, m).sampled


def test_gumbel_sampling_matches_softmax(data):
    q, m = data
    r = Reranker(16, _cfg(top_m=1, seed=0))
    p = r.probabilities(q, m)
    counts = np.bincount([r.rerank(q, m, explore=True).order[0] for _ in range(3000)], minlength=20)
    np.testing.assert_allclose(counts / 3000, p, atol=0.04)


def test_gradient_step_moves_cited_memory_up(data):
    q, m = data
    r = Reranker(16, _cfg(batch_size=1, seed=0))
    base = r.rerank(q, m).order
    target = base[4]  # shown but last
    before = r.score(q, m)
    shown = base[:5]
    r.partial_fit(Episode(q, m, shown, citation_rewards(5, [4])))
    assert r.n_updates_ == 1 and not r.is_identity
    after = r.score(q, m)
    rel_before = before[target] - np.max(np.delete(before, target))
    rel_after = after[target] - np.max(np.delete(after, target))
    assert rel_after > rel_before


def test_on_policy_learning_brings_cited_memory_to_top(data):
    q, m = data
    # plain SGD at the paper's eta (1e-3) moves the maps slowly; 0.1 learns in 50 steps
    r = Reranker(16, _cfg(seed=0, learning_rate=0.1))
    target = r.rerank(q, m).order[8]  # not even in the untrained top-5
    for _ in range(200):
        shown = r.rerank(q, m, explore=True).order[:5]
        cited = [j for j, p in enumerate(shown) if p == target]
        r.partial_fit(Episode(q, m, shown, citation_rewards(5, cited)))
    assert r.n_updates_ == 50
    assert r.rerank(q, m).order.index(target) <= 1


def test_sgd_step_matches_reinforce_direction(data):
    q, m = data
    r = Reranker(16, _cfg(learning_rate=0.5, batch_size=1))
    shown = list(range(5))
    r.partial_fit(Episode(q, m, shown, citation_rewards(5, [3])))
    s = r.score(q, m)
    assert s[3] - (m @ q)[3] > s[0] - (m @ q)[0]


def test_batching_waits_for_full_batch(data):
    q, m = data
    r = Reranker(16, PAPER)
    ep = Episode(q, m, [0, 1], np.array([1.0, -1.0]))
    r.partial_fit([ep, ep, ep])
    assert r.n_updates_ == 0 and len(r.pending_) == 3 and r.is_identity
    r.partial_fit(ep)
    assert r.n_updates_ == 1 and r.pending_ == [] and r.last_fit_.updates == 1
    r.partial_fit(ep, flush=True)
    assert r.n_updates_ == 2 and r.last_fit_.loss is not None


def test_save_load_round_trip(tmp_path, data):
    q, m = data
    r = Reranker(16, _cfg(batch_size=2, seed=0))
    ep = Episode(q, m, [2, 0, 1], citation_rewards(3, [0]), prior=rank_prior(m @ q))
    r.partial_fit([ep, ep, ep])  # one step + one pending
    path = r.save(tmp_path / "user.a.b")
    assert path.name == "user.a.b.json" and (tmp_path / "user.a.b.safetensors").exists()
    r2 = Reranker.load(tmp_path / "user.a.b")
    np.testing.assert_allclose(r2.score(q, m), r.score(q, m), atol=1e-7)
    assert r2.n_updates_ == 1 and len(r2.pending_) == 1 and r2.get_params() == r.get_params()
    np.testing.assert_allclose(r2.pending_[0].prior, ep.prior)
    # optimizer state restored: the next step is identical
    r.partial_fit(ep)
    r2.partial_fit(ep)
    np.testing.assert_allclose(r2.score(q, m), r.score(q, m), atol=1e-6)
    assert not list(tmp_path.glob(".*"))  # no temp files left


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError):
        Reranker.load(tmp_path / "missing")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError):
        Reranker.load(tmp_path / "bad")


def test_bad_config_and_inputs(data):
    q, m = data
    for dim in (0, -1, 2.0, True):
        with pytest.raises(ConfigError):
            Reranker(dim, PAPER)
    with pytest.raises(ConfigError):
        Reranker(4, {"tau": 0.5})  # a RerankConfig, which validates its own fields
    for kw in ({"tau": 0}, {"batch_size": 0}, {"top_m": 0}, {"learning_rate": 0}):
        with pytest.raises(ConfigError):
            _cfg(**kw)
    r = Reranker(16, PAPER)
    with pytest.raises(InvalidInputError):
        r.score(q[:8], m)
    with pytest.raises(InvalidInputError):
        r.partial_fit(Episode(q, m, [0, 0], np.array([1.0, 1.0])))
    with pytest.raises(InvalidInputError):
        r.partial_fit(Episode(q, m, [0, 1], np.array([1.0])))


def test_defaults_come_from_rerank_config():
    r = Reranker(16)
    assert r.config == RerankConfig()
    assert r.features == RerankConfig().features and r.n_features == len(r.features)
    assert r.get_params()["config"]["learning_rate"] == RerankConfig().learning_rate


def test_all_exports():
    for name in rerank.__all__:
        assert hasattr(rerank, name)


def _old_format(tmp_path, r: Reranker, name: str, **extra) -> None:
    """Save `r` as a reranker saved before 0.2: flat parameters, Adam state, a bias vector."""
    from safetensors.torch import save_file

    path = r.save(tmp_path / name)
    doc = json.loads(path.read_text())
    del doc["safetensors_sha256"]  # files saved before 0.2 carry no checksum
    params = {"dim": r.dim, **doc["init_parameters"]["config"]}
    params.update({"optimizer": "adam", "weight_decay": 0.01, "memory_bias": False, **extra})
    doc["init_parameters"] = params
    doc["state"]["optimizer"] = {"0.step": 3}
    tensors = {
        "w_q": r.w_q_.detach().clone(),
        "w_m": r.w_m_.detach().clone(),
        "w_f": r.w_f_.detach().clone(),
        "b_m": torch.full((r.dim,), 0.5 if params["memory_bias"] else 0.0),
        "opt.0.exp_avg": torch.ones(r.dim, r.dim),
    }
    text = json.dumps(doc)
    save_file(tensors, str(tmp_path / f"{name}.safetensors"), metadata={"config": text})
    path.write_text(text)


def test_rerankers_saved_before_0_2_still_load(tmp_path, data):
    """optimizer / weight_decay are ignored (plain SGD from now on); a learned bias refuses."""
    q, m = data
    r = Reranker(16, _cfg(batch_size=1, learning_rate=0.5))
    r.partial_fit(Episode(q, m, [0, 1, 2], citation_rewards(3, [1])))
    _old_format(tmp_path, r, "old")
    back = Reranker.load(tmp_path / "old")
    assert back.config == r.config and back.n_updates_ == 1
    np.testing.assert_allclose(back.score(q, m), r.score(q, m), atol=1e-7)
    ep = Episode(q, m, [0, 1, 2], citation_rewards(3, [2]))
    r.partial_fit(ep)
    back.partial_fit(ep)  # SGD: no optimizer state to carry over, the step is the same
    np.testing.assert_allclose(back.score(q, m), r.score(q, m), atol=1e-6)
    _old_format(tmp_path, r, "biased", memory_bias=True)
    with pytest.raises(ModelLoadError, match="memory_bias"):
        Reranker.load(tmp_path / "biased")


_TEXTS = [
    "I moved to Lisbon in March.",
    "Here is a long overview of relocation logistics, visas, housing markets, schools, "
    "transport passes, neighbourhood guides and a checklist for your first month abroad.",
    "My sister lives in Porto.",
    "Sure! Moving countries involves many steps; first research the local rental market, then "
    "compare the cost of living, then look into residence permits and tax registration.",
]


def test_cost_features_are_log_words():
    f = features.cost_features(["one two three", "", "a"])
    np.testing.assert_allclose(f[:, 0], np.log1p([3, 0, 1]), rtol=1e-6)
    r = Reranker(16, _cfg(features=("cost",)))
    assert r.n_features == 1 and r.feature_matrix(_TEXTS).shape == (4, 1)
    assert Reranker(16, PAPER).feature_matrix(_TEXTS) is None


def test_features_are_required_exactly_when_configured(data):
    q, m = data
    r = Reranker(16, _cfg(features=("cost",)))
    with pytest.raises(InvalidInputError, match="pass features"):
        r.rerank(q, m)
    with pytest.raises(InvalidInputError, match="shape"):
        r.score(q, m, features=np.zeros((3, 1), np.float32))
    with pytest.raises(InvalidInputError, match="shape"):
        r.score(q, m, features=np.full((20, 1), np.nan, np.float32))
    with pytest.raises(InvalidInputError, match="no features"):
        Reranker(16, PAPER).score(q, m, features=np.zeros((20, 1), np.float32))
    with pytest.raises(InvalidInputError, match="features"):
        Episode(q, m, [0], np.ones(1, np.float32), None, np.zeros(20, np.float32)).checked(16)
    for bad in (("length",), ("cost", "cost"), 3):
        with pytest.raises(ConfigError):
            _cfg(features=bad)
    # Untrained, the feature weight is zero: the retriever's order is kept.
    feats = r.feature_matrix([f"w {'x ' * i}" for i in range(20)])
    assert r.rerank(q, m, m @ q, features=feats).order == list(np.argsort(-(m @ q), kind="stable"))


def test_cost_weight_learns_that_short_memories_get_cited():
    """Citing the short memories of one query lifts short memories for an unrelated query."""
    rng = np.random.default_rng(5)
    dim = 16
    r = Reranker(dim, _cfg(top_m=2, batch_size=1, features=("cost",), seed=0))
    texts = _TEXTS * 3
    feats = r.feature_matrix(texts)
    short = [i for i, t in enumerate(texts) if len(t.split()) < 8]
    for _ in range(60):
        q, m = _unit(rng, dim), _unit(rng, len(texts), dim)
        res = r.rerank(q, m, features=feats, explore=True)
        shown = res.order[:2]
        r.partial_fit(
            Episode(
                q,
                m,
                shown,
                citation_rewards(2, [j for j, p in enumerate(shown) if p in short]),
                None,
                feats,
            )
        )
    assert float(r.w_f_.detach()[0]) < -0.05  # longer -> lower score
    q, m = _unit(rng, dim), _unit(rng, len(texts), dim)
    top = r.rerank(q, m, features=feats).order[: len(short)]
    base = list(np.argsort(-(m @ q), kind="stable"))[: len(short)]
    assert len(set(top) & set(short)) > len(set(base) & set(short))


def test_episode_baseline_learns_only_from_contrast(data):
    """Equal rewards teach nothing under the episode baseline; a constant baseline moves."""
    q, m = data
    feats = np.log1p(np.arange(20, dtype=np.float32)).reshape(-1, 1)
    for rewards in (np.full(5, -1.0, np.float32), np.ones(5, np.float32)):
        ep = Episode(q, m, [0, 1, 2, 3, 4], rewards, None, feats)
        ep_r = Reranker(16, _cfg(batch_size=1, baseline="episode", features=("cost",)))
        const = Reranker(16, _cfg(batch_size=1, baseline=0.5, features=("cost",)))
        ep_r.partial_fit(ep)
        const.partial_fit(ep)
        assert ep_r.is_identity and not const.is_identity
    ep_r = Reranker(16, _cfg(batch_size=1, baseline="episode", learning_rate=0.1))
    ep_r.partial_fit(Episode(q, m, [0, 1, 2], citation_rewards(3, [2])))
    s = ep_r.score(q, m) - m @ q
    assert s[2] > s[0] and s[2] > s[1]  # the cited one rose against the uncited ones
    for bad in ("mean", True, None):
        with pytest.raises(ConfigError):
            _cfg(baseline=bad)


def test_features_round_trip_with_pending_episodes(tmp_path, data):
    q, m = data
    feats = np.log1p(np.arange(20, dtype=np.float32)).reshape(-1, 1)
    r = Reranker(16, _cfg(batch_size=2, features=("cost",), baseline="episode", seed=0))
    ep = Episode(q, m, [3, 0, 1], citation_rewards(3, [0]), m @ q, feats)
    r.partial_fit([ep, ep, ep])  # one step, one episode pending
    r.save(tmp_path / "f")
    r2 = Reranker.load(tmp_path / "f")
    assert r2.features == ("cost",) and r2.config.baseline == "episode" and len(r2.pending_) == 1
    np.testing.assert_array_equal(r2.pending_[0].features, feats)
    np.testing.assert_allclose(r2.score(q, m, features=feats), r.score(q, m, features=feats))
    # A reranker saved without features, loaded with them: the new weight starts at zero.
    plain = Reranker(16, _cfg(batch_size=1, seed=0))
    plain.partial_fit(Episode(q, m, [0, 1], citation_rewards(2, [1])))
    plain.save(tmp_path / "p")
    grown = Reranker.load(tmp_path / "p", _cfg(features=("cost",)))
    assert float(grown.w_f_.detach()[0]) == 0.0
    np.testing.assert_allclose(grown.score(q, m, features=feats), plain.score(q, m), atol=1e-6)


def test_docstring_examples_run():
    import doctest

    import reflective_memory.rmm.text_rows
    import reflective_memory.types

    for module in (rerank, reflective_memory.rmm.text_rows, reflective_memory.types):
        assert doctest.testmod(module).failed == 0
