"""Tests of `reflective_memory.denoise`: the offline denoiser and the real llmlingua path on a tiny
model."""

from __future__ import annotations

import math
import os
import random
import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reflective_memory.denoise import (
    DENOISER_KINDS,
    Denoiser,
    FittableDenoiser,
    LLMLinguaDenoiser,
    OfflineDenoiser,
    denoiser_name,
    ensure_tiktoken_cache,
    fitted_on,
    make_denoiser,
)
from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError


def is_subsequence(small: list[str], big: list[str]) -> bool:
    it = iter(big)
    return all(any(tok == b for b in it) for tok in small)


# ---------------------------------------------------------------------------------------------
# Offline denoiser
# ---------------------------------------------------------------------------------------------


def test_protocols():
    d = OfflineDenoiser()
    assert isinstance(d, Denoiser)
    assert isinstance(d, FittableDenoiser)
    lingua = LLMLinguaDenoiser(model="x/bert-base-multilingual-cased")
    assert isinstance(lingua, Denoiser)
    assert not isinstance(lingua, FittableDenoiser)


def test_offline_keeps_rate_and_order():
    text = (
        "um so yeah I think my sister Maria finally moved to Lisbon in March 2021 , "
        "and honestly the new apartment is really close to the ocean"
    )
    tokens = text.split()
    for rate in (0.5, 0.75, 0.9):
        out = OfflineDenoiser(rate=rate).denoise(text)
        kept = out.split()
        assert len(kept) == math.ceil(rate * len(tokens))
        assert is_subsequence(kept, tokens)
    out = OfflineDenoiser(rate=0.5).denoise(text)
    # Content words and numbers survive, fillers and punctuation go first.
    for word in ("Maria", "Lisbon", "March", "2021", "apartment", "ocean"):
        assert word in out.split()
    for word in ("um", "yeah", ",", "honestly", "really"):
        assert word not in out.split()


def test_offline_shape_and_empty_texts():
    d = OfflineDenoiser(rate=0.5)
    assert isinstance(d.denoise("a b c d"), str)
    out = d.denoise(["first text here now", "", "   ", "second one"])
    assert isinstance(out, list) and len(out) == 4
    assert out[1] == "" and out[2] == "   "
    assert d.denoise([]) == []
    assert OfflineDenoiser(rate=1.0).denoise("keep  me\nwhole") == "keep  me\nwhole"


def test_offline_uses_fitted_statistics():
    corpus = ["the recipe needs flour"] * 20 + ["we visited Oslo once"]
    d = OfflineDenoiser(rate=0.5).fit(corpus)
    # 'recipe' and 'flour' are frequent in this user's corpus, 'Oslo' and 'visited' are rare.
    out = d.denoise("recipe flour Oslo visited")
    assert out == "Oslo visited"
    # Unfitted, the statistics of the batch itself are used: the same text alone keeps the
    # first two words (all equally rare, ties go to the earlier word).
    assert OfflineDenoiser(rate=0.5).denoise("recipe flour Oslo visited") == "recipe flour"


def test_offline_keep_numbers_switch():
    text = "the bill was 42 dollars"
    assert "42" in OfflineDenoiser(rate=0.25).denoise(text).split()
    assert OfflineDenoiser(rate=0.2, keep_numbers=False).denoise(text) == "bill"


def test_offline_custom_stopwords():
    text = "assistant says banana split recipe"
    d = OfflineDenoiser(rate=0.6, stopwords=["Assistant", "says"])
    assert d.denoise(text) == "banana split recipe"
    assert "stopwords=2" in d.name


def test_fitted_on_leaves_original_untouched():
    base = OfflineDenoiser(rate=0.5)
    user_a = fitted_on(base, ["alpha beta"] * 5)
    user_b = fitted_on(base, ["gamma delta"] * 5)
    assert base.counts_ is None
    assert user_a is not base and user_b is not base
    assert user_a.counts_["alpha"] == 5 and "alpha" not in user_b.counts_
    # Denoisers without fit come back as they are.
    lingua = LLMLinguaDenoiser(model="x/bert-base-multilingual-cased")
    assert fitted_on(lingua, ["x"]) is lingua


def test_partial_fit_accumulates():
    d = OfflineDenoiser().fit(["a cat"])
    d.partial_fit(["cat dog"])
    assert d.counts_["cat"] == 2 and d.counts_["dog"] == 1 and d.total_ == 4
    d.fit(["dog"])
    assert d.counts_ == {"dog": 1}


def test_offline_is_deterministic_and_fast():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(3000)] + ["the", "and", "um", "really", "42"]
    texts = [" ".join(rng.choice(vocab) for _ in range(100)) for _ in range(500)]
    d = OfflineDenoiser(rate=0.75).fit(texts)
    start = time.perf_counter()
    first = d.denoise(texts)
    elapsed = time.perf_counter() - start
    assert first == OfflineDenoiser(rate=0.75).fit(texts).denoise(texts)
    assert elapsed < 5.0, f"50k words took {elapsed:.2f}s"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet="ab c,.!1\n", min_size=0, max_size=60),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([0.1, 0.5, 0.75, 0.9]),
)
def test_offline_properties(texts, rate):
    out = OfflineDenoiser(rate=rate).denoise(texts)
    assert len(out) == len(texts)
    for src, key in zip(texts, out, strict=True):
        tokens = src.split()
        if not tokens:
            assert key == src
            continue
        kept = key.split()
        assert len(kept) == max(1, math.ceil(rate * len(tokens) - 1e-9))
        assert is_subsequence(kept, tokens)


def test_bad_inputs():
    d = OfflineDenoiser()
    with pytest.raises(InvalidInputError):
        d.denoise(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        d.denoise(["ok", None])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        d.fit([1, 2])  # type: ignore[list-item]
    for rate in (0, -0.1, 1.5, True, "0.5"):
        with pytest.raises(ConfigError):
            OfflineDenoiser(rate=rate)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            LLMLinguaDenoiser(model="m/xlm-roberta-large", rate=rate)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        LLMLinguaDenoiser(model="")
    with pytest.raises(ConfigError):
        LLMLinguaDenoiser(model="m/xlm-roberta-large", max_chunk_tokens=600)


def test_serialisation_round_trip():
    d = OfflineDenoiser(rate=0.6, keep_numbers=False, stopwords=["foo"])
    back = OfflineDenoiser.from_dict(d.to_dict())
    assert back.to_dict() == d.to_dict()
    assert d.to_dict()["type"] == "reflective_memory.denoise.offline.OfflineDenoiser"
    lingua = LLMLinguaDenoiser(model="m/xlm-roberta-large", rate=0.5, force_tokens=["\n"])
    assert LLMLinguaDenoiser.from_dict(lingua.to_dict()).to_dict() == lingua.to_dict()


def test_make_denoiser():
    assert make_denoiser(None) is None
    assert make_denoiser("none") is None
    off = make_denoiser("offline", rate=0.5)
    assert isinstance(off, OfflineDenoiser) and off.rate == 0.5
    lingua = make_denoiser("llmlingua", model="m/xlm-roberta-large", rate=0.6)
    assert isinstance(lingua, LLMLinguaDenoiser) and lingua.rate == 0.6
    assert lingua._compressor is None  # lazy

    class Upper:
        def denoise(self, texts):
            return texts.upper() if isinstance(texts, str) else [t.upper() for t in texts]

    custom = Upper()
    assert make_denoiser(custom) is custom
    assert denoiser_name(custom) == "Upper"
    assert denoiser_name(None) == "none"
    assert set(DENOISER_KINDS) == {"none", "offline", "llmlingua"}
    with pytest.raises(ConfigError):
        make_denoiser("gzip")
    with pytest.raises(ConfigError):
        make_denoiser(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# LLMLingua-2 through the real llmlingua package, on a tiny random model built here
# ---------------------------------------------------------------------------------------------

UNITS = [
    "I adopted a beagle named Rex last week . He loves the park near our flat .",
    "My sister Maria moved to Lisbon in March ; she teaches chemistry at a school there .",
    "Could you suggest a vegetarian recipe with lentils , spinach and coconut milk ?",
    "We booked a cabin by the lake for the summer holiday and rented two kayaks .",
]
LONG = " ".join(
    f"Sentence {i} talks about gardens , tomatoes and rainy weekends in the valley ."
    for i in range(12)
)


def _basic_tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("llmlingua")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for text in [*UNITS, LONG]:
        for tok in _basic_tokens(text):
            if tok not in vocab:
                vocab.append(tok)
    folder = tmp_path_factory.mktemp("models") / "tiny-bert-base-multilingual-cased"
    folder.mkdir()
    tokenizer = transformers.BertTokenizerFast(
        vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=False
    )
    tokenizer.save_pretrained(str(folder))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=512,
        num_labels=2,
        architectures=["BertForTokenClassification"],
    )
    torch.manual_seed(0)
    transformers.BertForTokenClassification(config).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def lingua(tiny_model):
    return LLMLinguaDenoiser(model=tiny_model, rate=0.5, device="cpu").warm_up()


def _oai_len(text: str) -> int:
    import tiktoken

    return len(tiktoken.get_encoding("cl100k_base").encode(text))


def test_llmlingua_keeps_ids_and_order(lingua):
    ids = [f"mem-{i}" for i in range(len(UNITS))]
    keys = dict(zip(ids, lingua.denoise(UNITS), strict=True))
    assert list(keys) == ids
    for mem_id, src in zip(ids, UNITS, strict=True):
        key = keys[mem_id]
        assert key != src
        # Each key is an ordered selection of its own unit's tokens (units share few words,
        # so a key attached to the wrong id would fail this).
        assert is_subsequence(_basic_tokens(key), _basic_tokens(src)), (key, src)
        assert 0 < len(_basic_tokens(key)) < len(_basic_tokens(src))


@pytest.mark.parametrize("rate", [0.5, 0.75])
def test_llmlingua_rate_within_tolerance(tiny_model, rate):
    d = LLMLinguaDenoiser(model=tiny_model, rate=rate)
    texts = [*UNITS, LONG]
    out = d.denoise(texts)
    achieved = sum(_oai_len(k) for k in out) / sum(_oai_len(t) for t in texts)
    assert abs(achieved - rate) <= 0.15, achieved


def test_llmlingua_chunks_long_units_without_gluing_words(tiny_model):
    d = LLMLinguaDenoiser(model=tiny_model, rate=0.6, max_chunk_tokens=20)
    key = d.denoise(LONG)
    assert isinstance(key, str)
    vocab = set(_basic_tokens(LONG))
    assert all(tok in vocab for tok in _basic_tokens(key)), key
    assert is_subsequence(_basic_tokens(key), _basic_tokens(LONG))
    assert len(d._chunks(d._compressor.tokenizer, LONG)) >= 6


def test_llmlingua_shape_blank_and_single_word(lingua):
    assert lingua.denoise(["", "  "]) == ["", "  "]
    out = lingua.denoise(["park", UNITS[0], ""])
    # A unit that would compress to nothing keeps its text as key.
    assert out[0] == "park" and out[2] == ""
    assert isinstance(lingua.denoise(UNITS[1]), str)
    assert lingua.denoise(UNITS) == lingua.denoise(UNITS)  # deterministic


def test_llmlingua_load_keeps_global_rng(tiny_model):
    random.seed(123)
    np.random.seed(123)
    expected = (random.random(), np.random.rand())
    random.seed(123)
    np.random.seed(123)
    LLMLinguaDenoiser(model=tiny_model).warm_up()  # llmlingua seeds every RNG with 42 inside
    assert (random.random(), np.random.rand()) == expected


def test_llmlingua_missing_model_gives_instructions(tmp_path):
    missing = tmp_path / "no-such-xlm-roberta-large"
    d = LLMLinguaDenoiser(model=str(missing), model_config={"local_files_only": True})
    with pytest.raises(ModelLoadError) as err:
        d.denoise("some text to compress")
    msg = str(err.value)
    assert "not on this machine" in msg and "denoiser_model=" in msg and "offline" in msg
    assert "\n" not in msg  # one line for the CLI


def test_llmlingua_unrecognised_model_name():
    with pytest.raises(ModelLoadError, match="bert-base-multilingual-cased"):
        LLMLinguaDenoiser(model="some/other-model").warm_up()


def test_tiktoken_cache_from_llama_index(monkeypatch):
    pytest.importorskip("llama_index.core")
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    folder = ensure_tiktoken_cache()
    assert folder is not None and os.path.isdir(folder)
    assert os.environ["TIKTOKEN_CACHE_DIR"] == folder
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/somewhere/else")
    assert ensure_tiktoken_cache() == "/somewhere/else"


# ---------------------------------------------------------------------------------------------
# Engine wiring
# ---------------------------------------------------------------------------------------------

from reflective_memory.config import MemoryConfig  # noqa: E402
from reflective_memory.embed import HashingEmbedder  # noqa: E402
from reflective_memory.engine import ReflectiveMemory  # noqa: E402

SESSION = [
    ("user", "um so yeah I finally adopted a beagle named Rex last week"),
    ("assistant", "That is wonderful news! Beagles are really friendly and curious dogs."),
    ("user", "honestly my sister Maria moved to Lisbon in March 2021 , she teaches chemistry"),
    ("assistant", "Lisbon is a lovely city. I hope she enjoys teaching there."),
]


def _fill(mem: ReflectiveMemory, user: str = "ana", session: str = "s1", turns=SESSION):
    for role, text in turns:
        mem.add_turn(user, session, role, text, timestamp="2023/05/21 (Sun) 11:54")
    return mem.end_session(user, session)


def _engine(tmp_path=None, **cfg):
    return ReflectiveMemory(
        tmp_path,
        embedder=HashingEmbedder(),
        config=MemoryConfig(
            units={"granularities": ("turn", "segment")},
            segment={"kind": "fixed", "window": 2},
        ).replace(**cfg),
    )


def test_engine_offline_denoises_keys_only():
    with _engine(denoise={"kind": "offline", "rate": 0.5}) as mem:
        mems = _fill(mem)
        turns = mem.turns("ana", "s1")
        assert len(mems) == 6
        for m in mems:
            src = [t for t in turns if t.turn_id in m.turn_ids]
            raw_key = "\n".join(f"{t.role}: {t.text}" for t in src)  # speakers lead the lines
            assert m.key != raw_key
            assert is_subsequence(m.key.split(), raw_key.split())
            assert len(m.key.split()) == math.ceil(0.5 * len(raw_key.split()))
            for t in src:  # the text stays raw
                assert f"{t.role}: {t.text}" in m.text
            assert m.metadata["key_denoiser"] == "offline(rate=0.5)"
        hits = mem.retrieve("ana", "Where did Maria move?", k=2).hits
        assert hits and "Lisbon" in hits[0].memory.text


def test_engine_constructor_object_is_fitted_per_user():
    seen: list[list[str]] = []

    class Recording(OfflineDenoiser):
        def fit(self, corpus):
            seen.append(list(corpus))
            return super().fit(corpus)

    shared_denoiser = Recording(rate=0.75)
    mem = ReflectiveMemory(
        embedder=HashingEmbedder(),
        config=MemoryConfig(units={"granularities": ("turn",)}),
        denoiser=shared_denoiser,
    )
    _fill(mem, "ana")
    _fill(mem, "bob", turns=[("user", "I collect vintage cameras from Tokyo flea markets")])
    assert shared_denoiser.counts_ is None  # the object itself never holds a user's stats
    assert len(seen) == 2
    assert "Rex" in " ".join(seen[0]) and "cameras" not in " ".join(seen[0])
    assert "Rex" not in " ".join(seen[1])
    assert mem.memories("bob")[0].metadata["key_denoiser"] == "offline(rate=0.75)"
    mem.close()


def test_engine_failing_denoiser_keeps_raw_keys(caplog):
    class Broken:
        name = "broken"

        def denoise(self, texts):
            raise RuntimeError("boom")

    class Short:
        def denoise(self, texts):
            return ["x"]  # wrong length

    for bad in (Broken(), Short()):
        mem = ReflectiveMemory(
            embedder=HashingEmbedder(),
            config=MemoryConfig(units={"granularities": ("turn",)}),
            denoiser=bad,
        )
        mems = _fill(mem)
        assert [m.key for m in mems] == [f"{r}: {t}" for r, t in SESSION]  # raw, with speakers
        assert all(m.metadata["key_denoiser"] == "none" for m in mems)
        assert mem.retrieve("ana", "beagle", k=1).hits
        mem.close()


def test_engine_redenoise_rekeys_and_reembeds(tmp_path):
    with _engine(tmp_path) as mem:
        before = {m.id: m for m in _fill(mem)}
        assert all(m.metadata["key_denoiser"] == "none" for m in before.values())
    # Reopen with a new denoiser: old memories keep their raw keys until redenoise.
    with _engine(tmp_path, denoise={"kind": "offline", "rate": 0.5}) as mem:
        assert {m.id: m.key for m in mem.memories("ana")} == {i: m.key for i, m in before.items()}
        assert mem.redenoise("ana") == len(before)
        after = {m.id: m for m in mem.memories("ana")}
        assert set(after) == set(before)
        for mid, m in after.items():
            old = before[mid]
            assert m.text == old.text and m.turn_ids == old.turn_ids
            assert m.created_at == old.created_at
            assert m.key != old.key and is_subsequence(m.key.split(), old.key.split())
            assert m.metadata["key_denoiser"] == "offline(rate=0.5)"
            assert m.metadata["positions"] == old.metadata["positions"]
        ids, keys, blobs, models = mem.store.embeddings("ana")
        emb = HashingEmbedder()
        for mid, key, blob in zip(ids, keys, blobs, strict=True):
            assert key == after[mid].key
            assert np.allclose(np.frombuffer(blob, dtype=np.float32), emb.encode(key))
        index = mem.indexes.get("ana")
        assert sorted(index.keys) == sorted(m.key for m in after.values())
        assert mem.redenoise("ana", only_stale=True) == 0
        assert mem.redenoise("nobody") == 0
    # Switching back to no denoising restores the raw keys exactly.
    with _engine(tmp_path) as mem:
        assert mem.redenoise("ana", only_stale=True) == len(before)
        assert {m.id: m.key for m in mem.memories("ana")} == {i: m.key for i, m in before.items()}


def test_engine_llmlingua_end_to_end(tiny_model):
    turns = [("user", UNITS[0]), ("assistant", UNITS[2]), ("user", UNITS[1])]
    cfg = MemoryConfig(
        units={"granularities": ("turn",)},
        denoise={"kind": "llmlingua", "model": tiny_model, "rate": 0.5},
    )
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        assert isinstance(mem.denoiser, LLMLinguaDenoiser)
        mems = _fill(mem, turns=turns)
        for m, (_, text) in zip(mems, turns, strict=True):
            assert m.key != text
            assert is_subsequence(_basic_tokens(m.key), _basic_tokens(text))
            assert m.text.endswith(text)
            assert m.metadata["key_denoiser"].startswith("llmlingua(")
        assert mem.retrieve("ana", "sister Lisbon", k=1).hits


def test_config_denoiser_validation():
    for bad in (
        {"denoise": {"kind": "zip"}},
        {"denoise": {"rate": 0}},
        {"denoise": {"rate": 2}},
        {"denoise": {"model": ""}},
        {"denoise": {"device": ""}},
    ):
        with pytest.raises(ConfigError):
            MemoryConfig(**bad)
    cfg = MemoryConfig(denoise={"kind": "offline", "rate": 0.9})
    assert MemoryConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError):
        ReflectiveMemory(embedder=HashingEmbedder(), denoiser=object())  # type: ignore[arg-type]


def test_engine_unloadable_llmlingua_falls_back_and_logs(tmp_path, caplog):
    cfg = MemoryConfig(
        units={"granularities": ("turn",)},
        denoise={
            "kind": "llmlingua",
            "model": str(tmp_path / "absent-bert-base-multilingual-cased"),
        },
    )
    with ReflectiveMemory(embedder=HashingEmbedder(), config=cfg) as mem:
        with caplog.at_level("ERROR", logger="reflective_memory.engine"):
            mems = _fill(mem)
        assert [m.key for m in mems] == [f"{r}: {t}" for r, t in SESSION]
        assert any("indexing raw keys" in r.getMessage() for r in caplog.records)
        assert len(mem.turns("ana", "s1")) == len(SESSION)


def test_cli_redenoise(tmp_path, capsys, monkeypatch):
    import reflective_memory.engine as engine_mod
    from reflective_memory.cli import main

    db = tmp_path / "db"
    with ReflectiveMemory(db, embedder=HashingEmbedder(), denoiser="none") as mem:
        raw = {m.id: m.key for m in _fill(mem)}
    # The CLI opens the store with the default embedder; keep the test offline and fast.
    monkeypatch.setattr(engine_mod, "default_embedder", HashingEmbedder)
    code = main(["redenoise", "--db", str(db), "--user", "ana", "--rate", "0.5"])
    assert code == 0 and "re-keyed" in capsys.readouterr().out
    with ReflectiveMemory(db, embedder=HashingEmbedder()) as mem:
        after = {m.id: m.key for m in mem.memories("ana")}
    assert set(after) == set(raw)
    assert all(after[i] != raw[i] for i in raw)
    assert main(["redenoise", "--db", str(db), "--user", "ana", "--rate", "2"]) == 2
