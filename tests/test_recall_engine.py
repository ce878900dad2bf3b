import numpy as np
import pytest
from reflective_memory import MemoryConfig, RecallConfig, ReflectiveMemory
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.recall import as_vector_index, recall
from reflective_memory.storage.index import AnnSettings, build_dense_index

TOPICS = [
    "my dog Pixel loves the beach and chasing seagulls",
    "I started learning the violin last spring",
    "we booked a trip to Lisbon for the summer holidays",
    "my sister Mara works as a nurse in Boston",
    "I am allergic to peanuts and shellfish",
    "the garden tomatoes finally turned red this week",
    "I switched my job to a data engineering role",
    "our book club is reading a novel about lighthouses",
]


def _memory(users=("ana", "bob"), **cfg):
    mem = ReflectiveMemory(
        embedder=HashingEmbedder(64), config=MemoryConfig(units={"granularities": ("turn",)}, **cfg)
    )
    for u in users:
        for s in range(3):
            for i, t in enumerate(TOPICS):
                # a few words of its own, so no note is too short to stand alone
                mem.add_turn(u, f"{u}-s{s}", "user", f"{u} says: {t} (note {s}-{i}, n{s}x{i})")
            mem.end_session(u, f"{u}-s{s}")
    return mem


@pytest.mark.parametrize("path", ["familiarity", "recollection"])
@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_retrieve_runs_rfmem_and_reports_diagnostics(path, mode):
    with _memory() as mem:
        r = mem.retrieve(
            "ana", "which instrument am I learning", k=10, mode=mode, recall={"mode": path}
        )
        d = r.diagnostics
        assert d["path"] == path and d["mode"] == mode
        assert d["mean_score"] is not None and d["entropy"] is not None
        assert isinstance(d["hits_per_round"], list)
        assert (d["rounds"] > 0) == (path == "recollection")
        assert d["recall"]["ms"]["total"] >= 0
        ids = [h.memory.id for h in r.hits]
        assert len(ids) == len(set(ids)) == 10
        # Recollection never leaves the user's own memories.
        assert all(h.memory.user_id == "ana" for h in r.hits)


def test_rfmem_gate_switches_on_thresholds():
    with _memory() as mem:
        q = "which instrument am I learning"
        assert mem.retrieve(
            "ana", q, recall={"mode": "rfmem", "theta_high": -1.0, "theta_low": -1.0}
        ).diagnostics["path"] == ("familiarity")
        lo = mem.retrieve("ana", q, recall={"mode": "rfmem", "theta_low": 1.0, "theta_high": 1.0})
        assert lo.diagnostics["path"] == "recollection"


def test_recall_config_on_memory_config_and_per_call():
    assert MemoryConfig().recall.mode == "familiarity"
    cfg = MemoryConfig(recall={"mode": "recollection", "alpha": 0.3})
    assert isinstance(cfg.recall, RecallConfig) and cfg.recall.alpha == 0.3
    assert MemoryConfig.from_dict(cfg.to_dict()).recall == cfg.recall
    with pytest.raises(ConfigError):
        MemoryConfig(recall={"alpha": 3})
    with pytest.raises(ConfigError):
        MemoryConfig(index={"ann_kind": "lsh"})
    with _memory(users=("ana",), recall={"mode": "recollection"}) as mem:
        r = mem.retrieve("ana", "peanut allergy", k=3)
        assert r.diagnostics["path"] == "recollection"
        r = mem.retrieve("ana", "peanut allergy", k=3, recall=RecallConfig(mode="familiarity"))
        assert r.diagnostics["path"] == "familiarity"
        with pytest.raises(InvalidInputError):
            mem.retrieve("ana", "peanut allergy", recall="fast")
        with pytest.raises(ConfigError):
            mem.retrieve("ana", "peanut allergy", recall={"beam": 0})


def test_lexical_mode_and_unknown_user():
    with _memory(users=("ana",)) as mem:
        r = mem.retrieve("ana", "violin", mode="lexical")
        assert r.diagnostics["path"] == "lexical" and "recall" not in r.diagnostics
        assert mem.retrieve("zoe", "violin").hits == []


def test_familiarity_equals_plain_dense_search():
    with _memory(users=("ana",), passages={"enabled": False}) as mem:  # the ranked units
        r = mem.retrieve("ana", "trip to Lisbon", k=8, mode="dense", recall={"mode": "familiarity"})
        idx = mem.indexes.get("ana")
        q = mem.embedder.encode("trip to Lisbon")
        _, p = idx.dense.search(q, 8)
        assert [h.memory.id for h in r.hits] == [idx.ids[i] for i in p[0]]


# ---------------------------------------------------------------- ANN switch
def _vecs(n, d=32, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(20, d))
    x = centers[rng.integers(0, 20, n)] + 0.3 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_ann_switch_above_threshold(kind):
    x = _vecs(3000)
    small = build_dense_index(x[:500], AnnSettings(threshold=1000, kind=kind))
    assert small.kind == "exact"
    big = build_dense_index(x, AnnSettings(threshold=1000, kind=kind, nprobe=8))
    assert big.kind == kind and big.ntotal == 3000
    exact = build_dense_index(x)
    q = x[:50] + 0.1
    _, pe = exact.search(q, 10)
    _, pa = big.search(q, 10)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(pa, pe, strict=True)])
    assert overlap > 0.8
    # RF-Mem runs over the ANN index, using its stored vectors.
    res = recall(big, q[0], 10, mode="recollection")
    assert len(set(res.positions.tolist())) == 10
    np.testing.assert_allclose(as_vector_index(big).vectors(np.array([5])), x[5:6])
    assert build_dense_index(x, AnnSettings(threshold=None, kind=kind)).kind == "exact"


def test_ann_index_persists_and_reloads(tmp_path):
    cfg = MemoryConfig(
        units={"granularities": ("turn",)}, index={"ann_threshold": 10, "ann_probe": 4}
    )
    with ReflectiveMemory(
        tmp_path,
        embedder=HashingEmbedder(64),
        config=cfg,
    ) as mem:
        for i, t in enumerate(TOPICS * 3):
            mem.add_turn("ana", "s1", "user", f"{t} #{i}")
        mem.end_session("ana", "s1")
        first = mem.retrieve("ana", "violin lessons", k=5)
        assert first.diagnostics["ann"] == "ivf"
    with ReflectiveMemory(
        tmp_path,
        embedder=HashingEmbedder(64),
        config=cfg,
    ) as mem:
        again = mem.retrieve("ana", "violin lessons", k=5)
        assert again.diagnostics["ann"] == "ivf"
        assert [h.memory.id for h in again.hits] == [h.memory.id for h in first.hits]
    # A changed threshold rebuilds the exact index instead of trusting the file.
    with ReflectiveMemory(
        tmp_path,
        embedder=HashingEmbedder(64),
        config=MemoryConfig(units={"granularities": ("turn",)}),
    ) as mem:
        assert mem.retrieve("ana", "violin lessons", k=5).diagnostics["ann"] == "exact"


def test_ann_settings_validation():
    with pytest.raises(ConfigError):
        AnnSettings(kind="lsh")
    with pytest.raises(ConfigError):
        AnnSettings(nprobe=0)
    assert AnnSettings(threshold=5).kind_for(5) == "exact"
    assert AnnSettings(threshold=5).kind_for(6) == "ivf"
