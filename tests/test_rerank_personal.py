"""Per-user reranking: side features, prior + per-user offsets, state bytes, erasure, noise."""

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ConfigError, ModelLoadError
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode
from reflective_memory.rmm.features import FEATURES, Candidates, candidate_features
from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.rerankers import ADAPTER_STATE, PRIOR_OWNER, RERANKER_STATE
from reflective_memory.types import Memory

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


def _rc(**kw) -> RerankConfig:
    """Reranker settings with unsigned features unless said otherwise."""
    return RerankConfig(**{"signed_features": False, **kw})


def _mem(i, text, granularity="turn", turns=1, when=None):
    t = T0 + timedelta(days=i) if when is None else when
    tids = tuple(f"s{i}:{j}" for j in range(turns))
    return Memory(f"m{i}", "u", f"s{i}", granularity, text, text, tids, t, t, t, t)


# ------------------------------------------------------------------ features
def test_each_feature_on_realistic_candidates():
    keys = [
        "I adopted a beagle called Rex last week",
        "Do you like dogs?\nWhat breed?",
        "We talked about the weather and the traffic and the long drive home again",
    ]
    mems = [
        _mem(0, keys[0]),
        _mem(5, keys[1], granularity="segment", turns=2),
        _mem(2, keys[2], granularity="topic", turns=7),
    ]
    c = Candidates(
        keys,
        query="what is my beagle called",
        dense=np.array([0.6, 0.5, 0.2], np.float32),
        scores=[{"dense": 0.6, "lexical": 4.0}, {"dense": 0.5}, {"lexical": 1.0}],
        memories=mems,
    )
    col = {name: FEATURES[name](c) for name in FEATURES}
    assert np.allclose(col["cost"], np.log1p([8, 6, 14]))
    assert col["overlap"][0] == pytest.approx(2 / 2) and col["overlap"][2] == 0  # beagle, call
    assert col["dense"][0] > col["dense"][1] > col["dense"][2] and abs(col["dense"].mean()) < 1e-6
    assert np.allclose(col["lexical"], [1.0, 0.0, 0.25])
    assert np.allclose(col["rank"], [0.0, 0.5, 1.0])
    assert np.allclose(col["both"], [1, 0, 0])
    assert np.allclose(col["recency"], [0.0, 1.0, 0.5])  # day 0, day 5, day 2
    assert np.allclose(col["size"], np.log1p([1, 2, 7]))
    assert np.allclose(col["question"], [0, 1, 0])
    assert np.allclose(col["derived"], [0, 0, 1])
    m = candidate_features(list(FEATURES), c)
    assert m.shape == (3, len(FEATURES)) and np.all(np.isfinite(m))


def test_overlap_from_the_bm25_postings_equals_tokenizing_the_keys():
    """The stage reads query-word overlap off the BM25 index: same numbers, no re-tokenizing."""
    from reflective_memory.storage.index import LexicalIndex

    keys = [
        "I adopted a beagle called Rex last week, he's calling for walks all day",
        "Do you like dogs?\nWhat breed would you get?",
        "We talked about the weather and the traffic",
        "",
        "Rex the beagle chewed my running shoes",
    ]
    lex = LexicalIndex(keys)
    for query in ("what is my beagle called", "running with the dog", "the", "Rex's walks"):
        head = [4, 0, 2, 3, 1]
        slow = FEATURES["overlap"](Candidates([keys[p] for p in head], query=query))
        fast = lex.overlap(query, head)
        assert np.allclose(fast, slow), query
        given = Candidates([keys[p] for p in head], query=query, overlap=fast)
        assert np.allclose(FEATURES["overlap"](given), slow)
    assert lex.overlap("beagle", []).shape == (0,)


def test_features_are_neutral_when_inputs_are_missing():
    """Only keys known (a framework adapter's view): what cannot be computed is zero/flat."""
    c = Candidates(["a short one", "a much longer memory text here"])
    for name in ("overlap", "dense", "lexical", "both", "size", "derived"):
        assert not np.any(FEATURES[name](c)), name
    assert np.allclose(FEATURES["recency"](c), 0.5)
    broken = [None, object()]  # memories the store no longer has, or foreign objects
    c2 = Candidates(["x", "y"], memories=broken)
    assert np.allclose(FEATURES["recency"](c2), 0.5) and not np.any(FEATURES["size"](c2))


def test_features_work_for_any_granularity():
    """A session-level passage and a turn compare by size and cost, not by kind names."""
    keys = ["short turn", "\n".join(f"line {i} of a long passage" for i in range(30))]
    c = Candidates(keys, memories=[_mem(0, keys[0]), _mem(1, keys[1], "session", turns=30)])
    m = candidate_features(("cost", "size", "derived"), c)
    assert m[1, 0] > m[0, 0] and m[1, 1] > m[0, 1] and not np.any(m[:, 2])


# --------------------------------------------------------- prior + per-user
def _episodes(rng, n, dim=8, k=10, signal=True, cite_rate=0.3):
    """Synthetic feedback: the cited memories are the short ones (feature 0 low)."""
    out = []
    for _ in range(n):
        q = rng.normal(size=dim).astype(np.float32)
        cand = rng.normal(size=(k, dim)).astype(np.float32)
        feats = rng.normal(size=(k, 2)).astype(np.float32)
        shown = rng.permutation(k)[:5].tolist()
        if signal:
            r = np.where(feats[shown, 0] < -0.3, 1.0, -1.0).astype(np.float32)
        else:
            r = np.where(rng.random(5) < cite_rate, 1.0, -1.0).astype(np.float32)
        out.append(Episode(q, cand, shown, r, None, feats))
    return out


def test_adapter_learns_the_cited_kind_and_decays_toward_prior():
    rng = np.random.default_rng(0)
    ad = UserAdapter(_rc(features=("cost", "overlap"), user_learning_rate=0.1, user_decay=0.5))
    for ep in _episodes(rng, 40):
        ad.update(ep, np.zeros(len(ep.candidates)))
    assert ad.delta_[0] < -0.2 and abs(ad.delta_[1]) < abs(ad.delta_[0]) / 2
    learned = ad.delta_.copy()
    flat = Episode(
        np.ones(8, np.float32),
        np.ones((4, 8), np.float32),
        [0, 1],
        np.array([1.0, 1.0], np.float32),  # all cited: no contrast, nothing learned
        None,
        np.ones((4, 2), np.float32),
    )
    assert ad.update(flat, np.zeros(4)) == 0.0 and np.array_equal(ad.delta_, learned)


def test_adapter_gradient_matches_autograd_of_reranker_policy():
    """The offsets follow the same REINFORCE rule as the prior's feature weights."""
    rng = np.random.default_rng(3)
    ep = _episodes(rng, 1)[0]
    rr = Reranker(8, _rc(features=("cost", "overlap"), baseline="episode"))
    lp = rr.log_prob(ep)
    r = ep.rewards - ep.rewards.mean()
    (-(lp * __import__("torch").from_numpy(r)).sum()).backward()
    ad = UserAdapter(_rc(features=("cost", "overlap")))
    base = rr.score(ep.query, ep.candidates, None, ep.features)
    assert np.allclose(ad.gradient(ep, base), -rr.w_f_.grad.numpy(), atol=1e-4)


def _cfg(**kw):
    base = MemoryConfig(
        units={"granularities": ("turn",)},
        search={"mode": "dense"},
        rerank={"top_k": 8, "top_m": 3},
        denoise={"kind": "none"},
    )
    return base.replace(**kw)


def _stage_episode(dim, rng, short_cited=True):
    cand = rng.normal(size=(6, dim)).astype(np.float32)
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    feats = np.zeros((6, 2), np.float32)
    feats[:, 0] = [0.5, 3.0, 0.7, 2.5, 0.4, 3.2]  # cost: short, long, short, ...
    shown = [0, 1, 2, 3]
    cited = [0, 2] if short_cited else [1, 3]
    r = np.array([1.0 if i in cited else -1.0 for i in shown], np.float32)
    return Episode(cand[0], cand, shown, r, np.sort(cand @ cand[0])[::-1].copy(), feats)


def test_learning_on_one_user_does_not_change_another_users_own_part(tmp_path):
    cfg = _cfg(
        rerank={"features": ("cost", "overlap"), "batch_size": 1000, "user_learning_rate": 0.2}
    )
    dim = HashingEmbedder().dim
    rng = np.random.default_rng(1)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        ep = _stage_episode(dim, rng)
        before_u2 = stage.reranker("u2").score(ep.query, ep.candidates, ep.prior, ep.features)
        for _ in range(10):
            stage.rerankers.learn("u1", _stage_episode(dim, rng))
        u1, u2 = stage.reranker("u1"), stage.reranker("u2")
        assert isinstance(u1, PersonalReranker) and u1.adapter.delta_[0] < 0
        assert u2.adapter.is_zero and u2.is_identity
        after_u2 = u2.score(ep.query, ep.candidates, ep.prior, ep.features)
        assert np.array_equal(before_u2, after_u2)  # u2 ranks exactly as before
        s1 = u1.score(ep.query, ep.candidates, ep.prior, ep.features)
        assert s1[0] - s1[1] > after_u2[0] - after_u2[1]  # u1 now prefers the short memory
        state = stage.rerankers.state  # every episode is stored as it is learned
        assert state.names("u1") == [ADAPTER_STATE] and state.names("u2") == []
        assert len(state.get("u1", ADAPTER_STATE)[1]) < 1000  # tiny per-user state


def test_prior_learns_across_users_and_new_users_inherit_it(tmp_path):
    cfg = _cfg(
        rerank={
            "features": ("cost", "overlap"),
            "batch_size": 2,
            "feature_learning_rate": 0.05,
            "user_learning_rate": 0.0,
        }
    )
    dim = HashingEmbedder().dim
    rng = np.random.default_rng(2)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        for n in range(20):
            stage.rerankers.learn(f"user{n % 4}", _stage_episode(dim, rng))
        w = stage.rerankers.prior().w_f_.detach().numpy().copy()
        assert w[0] < 0 and stage.rerankers.prior().n_updates_ == 10
        newcomer = stage.reranker("someone-new")
        assert newcomer.adapter.is_zero and not newcomer.is_identity
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        assert np.allclose(again.rerank_stage.rerankers.prior().w_f_.detach().numpy(), w)


def test_user_state_bytes_round_trip_and_erase(tmp_path):
    cfg = _cfg(rerank={"features": ("cost", "overlap"), "user_learning_rate": 0.2})
    dim = HashingEmbedder().dim
    rng = np.random.default_rng(4)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        assert stage.rerankers.user_state("u1") is None  # nothing learned, nothing to keep
        for _ in range(5):
            stage.rerankers.learn("u1", _stage_episode(dim, rng))
        blob = stage.rerankers.user_state("u1")
        assert isinstance(blob, bytes) and len(blob) < 1000
        delta = stage.rerankers.adapter("u1").delta_.copy()
        assert stage.rerankers.state.names("u1") == [ADAPTER_STATE]
        stage.forget("u1")
        assert stage.rerankers.state.names("u1") == []
        assert stage.rerankers.adapter("u1").is_zero
        stage.rerankers.restore_user_state("u1", blob)
        assert np.array_equal(stage.rerankers.adapter("u1").delta_, delta)
        prior_blob = stage.rerankers.prior_state()
        with pytest.raises(ModelLoadError):
            stage.rerankers.restore_user_state("u1", b"not a state")
        # delete_user erases the user's reranker state along with the memories
        mem.add_turn("u1", "s", "user", "hello there")
        mem.end_session("u1", "s")
        mem.delete_user("u1")
        assert stage.rerankers.adapter("u1").is_zero and stage.rerankers.state.names("u1") == []
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        assert again.rerank_stage.rerankers.adapter("u1").is_zero
        again.rerank_stage.rerankers.restore_prior_state(prior_blob)


def test_delete_user_drops_its_buffered_episodes_from_the_prior(tmp_path):
    """Scope `user`: the prior's buffer holds query and memory vectors; they go with the user."""
    cfg = _cfg(rerank={"features": ("cost", "overlap"), "batch_size": 16})
    dim = HashingEmbedder().dim
    rng = np.random.default_rng(6)
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        for user in ("u1", "u2", "u1"):
            stage.rerankers.learn(user, _stage_episode(dim, rng))
        assert len(stage.rerankers.prior().pending_) == 3
        mem.add_turn("u1", "s", "user", "hello there")
        mem.delete_user("u1")
        assert len(stage.rerankers.prior().pending_) == 1  # u2's stays
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as again:
        assert len(again.rerank_stage.rerankers.prior().pending_) == 1  # the file was rewritten too


def test_reranker_bytes_round_trip_and_errors():
    rng = np.random.default_rng(5)
    rr = Reranker(8, _rc(features=("cost", "overlap"), feature_learning_rate=0.1, batch_size=2))
    eps = _episodes(rng, 3)
    rr.partial_fit(eps)  # one step plus one buffered episode
    blob = rr.to_bytes()
    back = Reranker.from_bytes(blob)
    assert back.n_updates_ == 1 and len(back.pending_) == 1
    assert back.config == rr.config and back.config.feature_learning_rate == 0.1
    for a, b in ((rr.w_f_, back.w_f_), (rr.w_m_, back.w_m_), (rr.w_q_, back.w_q_)):
        assert np.array_equal(a.detach().numpy(), b.detach().numpy())
    ep = eps[0]
    assert np.allclose(
        rr.score(ep.query, ep.candidates, None, ep.features),
        back.score(ep.query, ep.candidates, None, ep.features),
    )
    for bad in (b"", b"12345678", blob[:40]):
        with pytest.raises(ModelLoadError):
            Reranker.from_bytes(bad)
    ad = UserAdapter(_rc(features=("cost",), user_learning_rate=0.3))
    ad.delta_[:] = [0.25]
    back_ad = UserAdapter.from_bytes(ad.to_bytes())
    assert np.array_equal(back_ad.delta_, ad.delta_) and back_ad.get_params() == ad.get_params()
    other = UserAdapter.from_bytes(ad.to_bytes(), _rc(features=("overlap",)))
    assert other.is_zero  # saved for other features: starts again from the prior
    with pytest.raises(ConfigError):
        UserAdapter({"features": ("cost",)})  # a RerankConfig, which validates its fields
    with pytest.raises(ConfigError):
        _rc(features=("cost",), user_learning_rate=1.0, user_decay=1.0)


def test_user_states_saved_before_0_2_still_load():
    """Flat parameters under the adapter's old names; a memory-credit table is ignored."""
    old = {
        "type": "reflective_memory.rmm.personal.UserAdapter",
        "format_version": 1,
        "init_parameters": {
            "features": ["cost", "overlap"],
            "learning_rate": 0.2,
            "decay": 0.5,
            "tau": 0.5,
            "baseline": "episode",
        },
        "state": {
            "delta": [-0.25, 0.5],
            "credit": {"m1": 0.1},
            "n_episodes": 7,
            "n_updates": 5,
        },
    }
    ad = UserAdapter.from_bytes(json.dumps(old).encode())
    assert ad.config.user_learning_rate == 0.2 and ad.config.user_decay == 0.5
    assert ad.delta_.tolist() == [-0.25, 0.5] and ad.n_updates_ == 5
    assert b"credit" not in ad.to_bytes()


def test_pure_noise_feedback_keeps_offsets_small():
    """Random citations: the offsets random-walk but the decay keeps them near the prior."""
    rng = np.random.default_rng(6)
    ad = UserAdapter(_rc(features=("cost", "overlap"), user_learning_rate=0.05, user_decay=0.1))
    for ep in _episodes(rng, 60, signal=False):
        ad.update(ep, np.zeros(len(ep.candidates)))
    noisy = np.abs(ad.delta_).max()
    sig = UserAdapter(_rc(features=("cost", "overlap"), user_learning_rate=0.05, user_decay=0.1))
    for ep in _episodes(np.random.default_rng(6), 60):
        sig.update(ep, np.zeros(len(ep.candidates)))
    assert noisy < abs(sig.delta_[0]) / 2


def test_config_validates_new_rerank_fields():
    for bad in (
        {"rerank": {"scope": "team"}},
        {"rerank": {"user_learning_rate": -1}},
        {"rerank": {"user_decay": -0.1}},
        {"rerank": {"feature_learning_rate": 0}},
        {"rerank": {"features": ("length",)}},
    ):
        with pytest.raises(ConfigError):
            MemoryConfig(**bad)
    assert MemoryConfig(rerank={"scope": "isolated"}).rerank.scope == "isolated"


def test_signed_weights_never_invert_retriever_evidence():
    """Pure-noise feedback may sharpen the retriever's evidence features, never invert them."""
    from reflective_memory.rmm.features import sign_vector

    names = ("overlap", "rank")
    signs = sign_vector(names)
    assert list(signs) == [1, -1]
    rng = np.random.default_rng(7)
    rr = Reranker(8, _rc(features=names, feature_learning_rate=0.5, signed_features=True))
    ad = UserAdapter(_rc(features=names, user_learning_rate=0.5, user_decay=0.0))
    for ep in _episodes(rng, 80, signal=False, cite_rate=0.5):
        rr.partial_fit(ep)
        w = rr.w_f_.detach().numpy()
        assert w[0] >= 0 and w[1] <= 0
        base = rr.score(ep.query, ep.candidates, None, ep.features)
        ad.update(ep, base, w, signs)
        total = w + ad.delta_
        assert total[0] >= -1e-9 and total[1] <= 1e-9
    free = Reranker(8, _rc(features=names, feature_learning_rate=0.5, signed_features=False))
    for ep in _episodes(np.random.default_rng(7), 80, signal=False, cite_rate=0.5):
        free.partial_fit(ep)
    assert free.w_f_.detach().numpy()[0] < 0 or free.w_f_.detach().numpy()[1] > 0


def test_reranker_files_from_before_0_2_move_into_the_state_store(tmp_path):
    """`<dir>/rerankers/shared.*`, `user-<hash>.delta.json`, `user-<hash>.safetensors`."""
    import hashlib

    def base(user: str) -> Path:
        return tmp_path / "rerankers" / f"user-{hashlib.sha1(user.encode()).hexdigest()[:24]}"

    cfg = _cfg(rerank={"features": ("cost", "overlap"), "batch_size": 2})
    dim = HashingEmbedder().dim
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        for user in ("u1", "u2", "gone"):
            mem.add_turn(user, "s", "user", f"hello from {user}")
            mem.end_session(user, "s")
    # what 0.1 left in the directory: the prior (one step, one buffered episode) and offsets
    prior = Reranker(dim, cfg.rerank)
    prior.partial_fit(_episodes(np.random.default_rng(8), 3, dim=dim, k=6))
    prior.save(tmp_path / "rerankers" / "shared")
    ad = UserAdapter(cfg.rerank)
    ad.delta_[:] = [-0.5, 0.25]
    base("u1").with_suffix(".delta.json").write_bytes(ad.to_bytes())
    base("gone").with_suffix(".delta.json").write_bytes(ad.to_bytes())
    iso = Reranker(dim, dataclasses.replace(cfg.rerank, batch_size=1))
    iso.partial_fit(_episodes(np.random.default_rng(9), 1, dim=dim, k=6))
    iso.save(base("u2"))
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=cfg) as mem:
        stage = mem.rerank_stage
        assert stage.reranker("u1").adapter.delta_.tolist() == [-0.5, 0.25]
        assert (
            stage.rerankers.prior().n_updates_ == 1 and len(stage.rerankers.prior().pending_) == 1
        )
        assert stage.rerankers.state.names(PRIOR_OWNER) == [RERANKER_STATE]
        assert stage.rerankers.state.names("u1") == [ADAPTER_STATE]
        left = {p.name for p in (tmp_path / "rerankers").iterdir() if p.suffix != ".state"}
        assert not any(n.startswith("shared") for n in left)  # moved, then deleted
        assert not base("u1").with_suffix(".delta.json").exists()
        # a user whose old files were never read: delete_user erases them too
        mem.delete_user("gone")
        assert not base("gone").with_suffix(".delta.json").exists()
        assert stage.rerankers.state.names("gone") == []
    isolated = cfg.replace(rerank={"scope": "isolated"})
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(), config=isolated) as mem:
        rr = mem.rerank_stage.reranker("u2")
        assert rr.n_updates_ == 1 and np.array_equal(
            rr.w_q_.detach().numpy(), iso.w_q_.detach().numpy()
        )
        assert not base("u2").with_suffix(".safetensors").exists()
        assert not base("u2").with_suffix(".json").exists()
        assert mem.rerank_stage.rerankers.state.names("u2") == [RERANKER_STATE]
