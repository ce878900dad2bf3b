"""Damaged learned state (issue 29): detected, set aside and relearned with a warning, never used.

The corpus: bit and byte flips at every offset of a real saved reranker state file (store header,
seal, safetensors header and tensor data), the same over the stored blob itself (a store that
checksums nothing, like a database column), truncations, an empty file, and well-sealed state
holding NaN, huge or wrongly shaped weights. Each case ends in a warning and a fresh reranker, or
loads unchanged when the flip is harmless (a digit of the file's version number); none passes
silently, none raises.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ModelLoadError
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.episodes import Episode
from reflective_memory.rmm.personal import UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.rerankers import (
    ADAPTER_STATE,
    PRIOR_OWNER,
    RERANKER_STATE,
    Rerankers,
)
from reflective_memory.rmm.sealed import MAGIC, seal, unseal
from reflective_memory.storage.state import FileStateStore, StateStore
from safetensors.torch import save as save_bytes

DIM = 16
CFG = RerankConfig(
    features=("cost", "overlap"),
    batch_size=2,
    learning_rate=0.05,
    feature_learning_rate=0.05,
    user_learning_rate=0.2,
    signed_features=False,
)
RM = "reflective_memory"


def _episode(rng: np.random.Generator) -> Episode:
    cand = rng.normal(size=(6, DIM)).astype(np.float32)
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    feats = np.zeros((6, 2), np.float32)
    feats[:, 0] = [0.5, 3.0, 0.7, 2.5, 0.4, 3.2]
    r = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
    return Episode(cand[0], cand, [0, 1, 2, 3], r, np.sort(cand @ cand[0])[::-1].copy(), feats)


def _train(state: StateStore) -> Rerankers:
    """Rerankers with a learned prior (3 steps, 1 episode buffered) and user offsets."""
    rr = Rerankers(CFG, DIM, state)
    rng = np.random.default_rng(0)
    for _ in range(7):
        rr.learn("u1", _episode(rng))
    prior = rr.prior()
    assert not prior.is_identity and prior.n_updates_ == 3 and len(prior.pending_) == 1
    assert not rr.adapter("u1").is_zero
    return rr


def _same(a: Reranker, b: Reranker) -> bool:
    return (
        all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b), strict=True))
        and a.n_updates_ == b.n_updates_
        and len(a.pending_) == len(b.pending_)
    )


def _weights(r: Reranker) -> list[torch.Tensor]:
    return [r.w_q_.detach(), r.w_m_.detach(), r.w_f_.detach()]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _outcome(
    state: StateStore, original: Reranker, caplog: pytest.LogCaptureFixture, owner: str
) -> str:
    """Load the prior as a new process would: "fresh" (warned, untrained) or "unchanged"."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=RM):
        rr = Rerankers(CFG, DIM, state)
        prior = rr.prior()
        warned = _warnings(caplog)
        if not warned:
            assert _same(prior, original), "changed state loaded without a warning"
            return "unchanged"
        assert prior.is_identity and prior.n_updates_ == 0 and not prior.pending_
        assert any("damaged learned state" in w and repr(owner) in w for w in warned), warned
        caplog.clear()
        again = Rerankers(CFG, DIM, state).prior()  # set aside: not found (nor warned) again
        assert again.is_identity and not _warnings(caplog)
    return "fresh"


def _flips(data: bytes) -> list[tuple[str, bytes]]:
    """Every byte inverted, and one bit flipped at every offset (bit = offset mod 8)."""
    cases = []
    for i in range(len(data)):
        for label, mask in (("byte", 0xFF), ("bit", 1 << (i % 8))):
            bad = bytearray(data)
            bad[i] ^= mask
            cases.append((f"{label}@{i}", bytes(bad)))
    return cases


def _cuts(data: bytes) -> list[tuple[str, bytes]]:
    ends = {0, 1, 7, 8, len(MAGIC), 40, 41, len(data) // 3, len(data) // 2, len(data) - 1}
    return [(f"cut@{n}", data[:n]) for n in sorted(ends) if n < len(data)]


# ------------------------------------------------------------------ the seal
def test_seal_round_trip_and_every_damage_is_a_typed_error():
    blob = seal(b"payload")
    assert unseal(blob) == (b"payload", True)
    assert unseal(b"\x10\x00\x00\x00\x00\x00\x00\x00{}") == (
        b"\x10\x00\x00\x00\x00\x00\x00\x00{}",
        False,
    )
    cuts = [(label, bad) for label, bad in _cuts(blob) if len(bad) >= len(MAGIC)]
    for label, bad in _flips(blob)[2 * len(MAGIC) :] + cuts:
        with pytest.raises(ModelLoadError):
            unseal(bad)
            pytest.fail(label)


def test_from_bytes_reads_sealed_state_and_checks_the_seal():
    r = Reranker(DIM, CFG)
    r.partial_fit(_episode(np.random.default_rng(3)))
    assert _same(Reranker.from_bytes(seal(r.to_bytes())), r)
    ad = UserAdapter(CFG)
    assert UserAdapter.from_bytes(seal(ad.to_bytes())).features == CFG.features
    for blob, load in (
        (seal(r.to_bytes()), Reranker.from_bytes),
        (seal(ad.to_bytes()), UserAdapter.from_bytes),
    ):
        with pytest.raises(ModelLoadError, match="checksum"):
            load(blob[:-1] + bytes([blob[-1] ^ 1]))


def test_saved_reranker_files_carry_a_checksum_that_load_verifies(tmp_path):
    r = Reranker(DIM, CFG)
    r.partial_fit(_episode(np.random.default_rng(3)))
    r.save(tmp_path / "r")
    assert _same(Reranker.load(tmp_path / "r"), r)
    st = tmp_path / "r.safetensors"
    good = st.read_bytes()
    for i in range(len(good) - 1, 0, -97):  # one flip at a time, tensor data and header
        st.write_bytes(good[:i] + bytes([good[i] ^ 0x10]) + good[i + 1 :])
        with pytest.raises(ModelLoadError, match="checksum"):
            Reranker.load(tmp_path / "r")
    st.write_bytes(good)
    assert _same(Reranker.load(tmp_path / "r"), r)


# ------------------------------------------------------------ file corpus
def test_flips_and_cuts_of_a_saved_state_file_warn_and_start_fresh_or_change_nothing(
    tmp_path, caplog
):
    state = FileStateStore(tmp_path)
    original = _train(state).prior()
    path = state._path(PRIOR_OWNER, RERANKER_STATE)
    good = path.read_bytes()
    header_end = good.index(b"\n", good.index(b"\n") + 1) + 1
    flips = _flips(good)  # every offset of the headers, every third one of the data
    cases = flips[: 2 * header_end + 600] + flips[2 * header_end + 600 :: 5]
    cases += _cuts(good) + [("empty", b"")]
    results: dict[str, list[str]] = {"fresh": [], "unchanged": []}
    for label, bad in cases:
        path.write_bytes(bad)
        results[_outcome(state, original, caplog, PRIOR_OWNER)].append(label)
        for aside in tmp_path.rglob("*.damaged-*"):
            aside.unlink()
        path.write_bytes(good)
    logging.getLogger(__name__).info("file corpus: %d cases, %s", len(cases), results)
    # harmless flips only touch the file's version number (the data is checked by its hash)
    head = json.loads(good[good.index(b"\n") + 1 : header_end])
    version_at = good.index(b'"version": ') + len('"version": ')
    digits = range(version_at, version_at + len(str(head["version"])))
    for label in results["unchanged"]:
        assert int(label.split("@")[1]) in digits, label
    assert len(results["fresh"]) >= len(cases) - 2 * len(digits)
    assert len(cases) > 1500
    assert len(good) > 2000 and header_end < 400  # header and tensor data are both covered


def test_the_state_file_is_set_aside_not_deleted(tmp_path, caplog):
    state = FileStateStore(tmp_path)
    _train(state)
    path = state._path(PRIOR_OWNER, RERANKER_STATE)
    good = path.read_bytes()
    path.write_bytes(good[:-30] + bytes(30))
    with caplog.at_level(logging.WARNING, logger=RM):
        assert Rerankers(CFG, DIM, state).prior().is_identity
    (aside,) = path.parent.glob(f"{path.name}.damaged-*")
    assert aside.read_bytes() == good[:-30] + bytes(30) and not path.exists()
    assert "set aside as" in caplog.text and "checksum mismatch" in caplog.text
    assert state.delete(PRIOR_OWNER, RERANKER_STATE) is False and not aside.exists()


# ------------------------------------------------------------ blob corpus
def _put(state: StateStore, owner: str, name: str, data: bytes) -> None:
    state.update(owner, name, lambda _v, _d: data)


def test_flips_and_cuts_of_a_stored_blob_are_caught_by_its_seal(tmp_path, caplog):
    """The store's own checksum is valid here (the damage came before it, as in a database)."""
    state = FileStateStore(tmp_path)
    original = _train(state).prior()
    blob = state.get(PRIOR_OWNER, RERANKER_STATE)[1]
    assert blob.startswith(MAGIC)
    cases = _flips(blob)[::7] + _cuts(blob)
    for label, bad in cases:
        _put(state, PRIOR_OWNER, RERANKER_STATE, bad)
        assert _outcome(state, original, caplog, PRIOR_OWNER) == "fresh", label
        assert state.version(PRIOR_OWNER, RERANKER_STATE) == 0
        for aside in tmp_path.rglob("*.damaged-*"):
            aside.unlink()


def _sealed_prior(change) -> bytes:
    r = Reranker(DIM, CFG)
    r.partial_fit(_episode(np.random.default_rng(1)))
    tensors, config = r._snapshot()
    change(tensors, config)
    return seal(bytes(save_bytes(tensors, metadata={"config": json.dumps(config)})))


def _set(name: str, index: tuple[int, ...], value: float):
    def change(tensors, _config):
        tensors[name][index] = value

    return change


def _shape(name: str, shape: tuple[int, ...]):
    def change(tensors, _config):
        tensors[name] = torch.zeros(shape)

    return change


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_set("w_q", (0, 0), float("nan")), "NaN"),
        (_set("w_m", (3, 2), float("inf")), "infinite"),
        (_set("w_m", (1, 2), 1.7e38), "beyond the bound"),
        (_set("w_f", (1,), -5e3), "beyond the bound"),
        (_set("pending.0.candidates", (2, 2), float("nan")), "NaN"),
        (_set("pending.0.query", (1,), 3e9), "beyond the bound"),
        (_shape("w_q", (DIM,)), "shape"),  # would broadcast over every row
        (_shape("w_m", (1, DIM)), "shape"),
        (_shape("w_q", (DIM - 1, DIM)), "shape"),
        (_shape("w_f", (3,)), "shape"),
        (_shape("pending.0.candidates", (6, DIM + 1)), "episode shapes"),
    ],
)
def test_well_sealed_state_with_bad_values_or_shapes_starts_fresh(tmp_path, caplog, change, reason):
    state = FileStateStore(tmp_path)
    _put(state, PRIOR_OWNER, RERANKER_STATE, _sealed_prior(change))
    with caplog.at_level(logging.WARNING, logger=RM):
        prior = Rerankers(CFG, DIM, state).prior()
    assert prior.is_identity and prior.n_updates_ == 0
    assert reason in caplog.text and "set aside as" in caplog.text
    assert state.version(PRIOR_OWNER, RERANKER_STATE) == 0


def test_a_huge_dim_in_the_metadata_is_refused_before_allocating(tmp_path, caplog):
    def change(_tensors, config):
        config["init_parameters"]["dim"] = 10**9

    with pytest.raises(ModelLoadError, match="shape"):
        Reranker.from_bytes(unseal(_sealed_prior(change))[0])


def test_damaged_user_offsets_start_fresh_with_a_warning_naming_the_user(tmp_path, caplog):
    state = FileStateStore(tmp_path)
    _train(state)
    blob = state.get("u1", ADAPTER_STATE)[1]
    doc = json.loads(unseal(blob)[0])
    bad_docs = []
    for delta in ([float("nan"), 0.0], [1e300, 0.0], [0.1, 0.2, 0.3]):
        doc["state"]["delta"] = delta
        bad_docs.append(seal(json.dumps(doc).encode()))
    for bad in bad_docs + [bad for _, bad in _flips(blob)[::5]]:
        _put(state, "u1", ADAPTER_STATE, bad)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=RM):
            ad = Rerankers(CFG, DIM, state).adapter("u1")
        assert ad.is_zero and ad.n_episodes_ == 0
        assert "damaged learned state 'rmm.user_adapter' of 'u1'" in caplog.text
        for aside in tmp_path.rglob("*.damaged-*"):
            aside.unlink()


def test_damage_found_while_learning_is_set_aside_and_learning_goes_on(tmp_path, caplog):
    state = FileStateStore(tmp_path)
    rr = _train(state)
    _put(state, PRIOR_OWNER, RERANKER_STATE, b"\x00" * 100)  # another process wrote garbage
    with caplog.at_level(logging.WARNING, logger=RM):
        rr.learn("u1", _episode(np.random.default_rng(5)))
    assert "damaged learned state 'rmm.reranker' of '__shared__'" in caplog.text
    assert len(list(tmp_path.rglob("*.damaged-*"))) == 1
    assert rr.prior().n_episodes_ == 1  # relearning from scratch, stored sealed
    assert state.get(PRIOR_OWNER, RERANKER_STATE)[1].startswith(MAGIC)


# ------------------------------------------------------- unsealed (old) state
def test_unsealed_state_loads_once_and_is_stored_sealed(tmp_path, caplog):
    state = FileStateStore(tmp_path)
    original = _train(state).prior()
    _put(state, PRIOR_OWNER, RERANKER_STATE, original.to_bytes())  # as written before seals
    adapter = UserAdapter.from_bytes(unseal(state.get("u1", ADAPTER_STATE)[1])[0], CFG)
    _put(state, "u1", ADAPTER_STATE, adapter.to_bytes())
    with caplog.at_level(logging.WARNING, logger=RM):
        rr = Rerankers(CFG, DIM, state)
        assert _same(rr.prior(), original)
        assert np.array_equal(rr.adapter("u1").delta_, adapter.delta_)
    assert not _warnings(caplog)
    for owner, name in ((PRIOR_OWNER, RERANKER_STATE), ("u1", ADAPTER_STATE)):
        assert state.get(owner, name)[1].startswith(MAGIC)
    assert unseal(state.get(PRIOR_OWNER, RERANKER_STATE)[1])[0] == original.to_bytes()


def test_issue_29_a_pre_0_2_file_with_flipped_tensor_bytes_is_not_used(tmp_path, caplog):
    """The report: 30 bytes of `rerankers/shared.safetensors` flipped loaded weights of 1.7e38."""
    files = tmp_path / "rerankers"
    original = _train(FileStateStore(tmp_path / "trained")).prior()
    original.save(files / "shared")
    st = files / "shared.safetensors"
    data = bytearray(st.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start = 8 + n + json.loads(data[8 : 8 + n])["w_m"]["data_offsets"][0]
    for i in range(30):  # the high byte of 30 float32 weights of w_m
        data[start + 4 * i + 3] ^= 0x7F
    st.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=RM):
        prior = Rerankers(CFG, DIM, FileStateStore(files), legacy=files).prior()
    assert prior.is_identity and "beyond the bound" in caplog.text
    assert not st.exists() and len(list(files.rglob("*.damaged-*"))) == 1


# ------------------------------------------------------ through the engine
def _cfg() -> MemoryConfig:
    return MemoryConfig(
        units={"granularities": ("turn",)},
        passages={"enabled": False},
        search={"mode": "dense"},
        rerank={
            "top_k": 8,
            "top_m": 4,
            "batch_size": 1,
            "learning_rate": 0.5,
            "feature_learning_rate": 0.5,
            "user_learning_rate": 0.0,
        },
        denoise={"kind": "none"},
    )


WORDS = "apple river violin garden harbor winter pepper candle meadow copper lantern".split()
QUERIES = [f"{w} note" for w in WORDS[:6]]


def _ranked(directory: Path) -> list[list[str]]:
    with ReflectiveMemory(directory, embedder=HashingEmbedder(64), config=_cfg()) as mem:
        return [[h.memory.id for h in mem.retrieve("u", q, k=4).hits] for q in QUERIES]


def test_retrieval_with_a_damaged_prior_equals_an_untrained_reranker(tmp_path, caplog):
    store = tmp_path / "store"
    with ReflectiveMemory(store, embedder=HashingEmbedder(64), config=_cfg()) as mem:
        for i in range(10):
            text = f"note {i} about {WORDS[i]} and {WORDS[(i + 3) % 11]} in a long sentence " * (
                1 + i % 3
            )
            mem.add_turn("u", "s", "user", text)
        mem.end_session("u", "s")
        for _ in range(3):
            for q in QUERIES:
                r = mem.retrieve("u", q, k=4)
                mem.feedback(r, cited=[len(r.hits) - 1])
        assert not mem.rerank_stage.rerankers.prior().is_identity
    untrained = tmp_path / "untrained"
    shutil.copytree(store, untrained)
    shutil.rmtree(untrained / "rerankers")
    expected = _ranked(untrained)
    trained = _ranked(store)
    path = FileStateStore(store / "rerankers")._path(PRIOR_OWNER, RERANKER_STATE)
    data = bytearray(path.read_bytes())
    for i in range(30):
        data[len(data) - 4 * i - 1] ^= 0x7F
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=RM):
        damaged = _ranked(store)
    assert "damaged learned state 'rmm.reranker' of '__shared__'" in caplog.text
    assert damaged == expected
    assert trained != expected  # the learned state mattered, so the test can fail


# ------------------------------------------------------------- PostgreSQL
def test_database_state_store_blobs_are_checked_and_deleted_when_damaged(pg_dsn, caplog):
    from pg_cluster import pg_schema
    from reflective_memory.storage.postgres import PostgresStore

    store = PostgresStore(pg_dsn, schema=pg_schema())
    try:
        state = store.state
        original = _train(state).prior()
        blob = state.get(PRIOR_OWNER, RERANKER_STATE)[1]
        assert blob.startswith(MAGIC)
        cases = _flips(blob)[:: max(1, len(blob) // 40)] + _cuts(blob)
        for label, bad in cases:
            _put(state, PRIOR_OWNER, RERANKER_STATE, bad)
            assert _outcome(state, original, caplog, PRIOR_OWNER) == "fresh", label
            assert state.version(PRIOR_OWNER, RERANKER_STATE) == 0  # deleted
        _put(state, PRIOR_OWNER, RERANKER_STATE, original.to_bytes())  # unsealed: resealed
        assert _outcome(state, original, caplog, PRIOR_OWNER) == "unchanged"
        assert state.get(PRIOR_OWNER, RERANKER_STATE)[1].startswith(MAGIC)
    finally:
        store.close()
