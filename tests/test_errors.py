from __future__ import annotations

import pytest
from reflective_memory import (
    ConfigError,
    HashingEmbedder,
    InvalidInputError,
    MemoryConfig,
    ReflectiveMemory,
    ReflectiveMemoryError,
    StoreClosedError,
    UnknownSessionError,
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("u", "s", "user", ""), "text must not be empty"),
        (("u", "s", "user", "   \n\t"), "text must not be empty"),
        (("u", "s", "user", 42), "text must be a str"),
        (("", "s", "user", "hi"), "user_id must not be empty"),
        ((None, "s", "user", "hi"), "user_id must be a str"),
        (("u", 7, "user", "hi"), "session_id must be a str"),
        (("u", "s", "", "hi"), "role must not be empty"),
    ],
)
def test_bad_turns_are_rejected_with_a_named_problem(mem, args, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        mem.add_turn(*args)
    assert mem.users() == []


def test_errors_share_one_hierarchy() -> None:
    for exc in (InvalidInputError, UnknownSessionError, StoreClosedError, ConfigError):
        assert issubclass(exc, ReflectiveMemoryError)
    assert issubclass(InvalidInputError, ValueError)


def test_bad_timestamp_and_duplicate_turn_id(mem) -> None:
    with pytest.raises(InvalidInputError, match="no known format"):
        mem.add_turn("u", "s", "user", "hi", timestamp="next tuesday-ish")
    mem.add_turn("u", "s", "user", "hi", turn_id="t1")
    with pytest.raises(InvalidInputError, match="turn_id 't1' already exists"):
        mem.add_turn("u", "s", "user", "again", turn_id="t1")
    assert len(mem.turns("u")) == 1


def test_batch_is_all_or_nothing(mem) -> None:
    with pytest.raises(InvalidInputError):
        mem.add_turns(
            [
                {"user_id": "u", "session_id": "s", "role": "user", "text": "fine"},
                {"user_id": "u", "session_id": "s", "role": "user", "text": ""},
            ]
        )
    with pytest.raises(InvalidInputError, match="unknown turn fields"):
        mem.add_turns([{"user_id": "u", "session_id": "s", "role": "user", "text": "x", "y": 1}])
    assert mem.turns("u") == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a positive integer"),
        ({"k": "3"}, "k must be a positive integer"),
        ({"budget_tokens": -5}, "budget_tokens must be a positive integer"),
        ({"mode": "fuzzy"}, "mode must be hybrid, dense or lexical"),
    ],
)
def test_bad_retrieve_arguments(mem, kwargs, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        mem.retrieve("u", "query", **kwargs)


def test_empty_query_is_rejected(mem) -> None:
    with pytest.raises(InvalidInputError, match="query must not be empty"):
        mem.retrieve("u", "  ")
    with pytest.raises(InvalidInputError, match="query must be a str"):
        mem.retrieve("u", None)  # type: ignore[arg-type]


def test_huge_text_is_stored_whole_and_embedded_truncated(mem) -> None:
    seen: list[int] = []
    inner = mem.embedder

    class Spy:
        name = inner.name
        dim = inner.dim

        def encode(self, texts):
            seen.extend(len(t) for t in ([texts] if isinstance(texts, str) else texts))
            return inner.encode(texts)

    mem.embedder = mem.indexes.embedder = mem.sessions.embedder = Spy()
    mem.denoiser = None  # check the raw key (the default denoiser would shorten it)
    big = ("The quick brown fox jumps over the lazy dog. " * 23000)[:1_000_000]
    mem.add_turn("u", "s", "user", big)
    (m,) = mem.end_session("u", "s")
    assert mem.turns("u")[0].text == big
    assert m.key == f"user: {big}"  # the raw key, speaker first
    assert max(seen) <= mem.config.units.embed_max_chars
    assert mem.retrieve("u", "lazy dog fox", k=1).hits[0].memory.id == m.id


def test_text_over_the_configured_maximum_is_rejected() -> None:
    with ReflectiveMemory(
        embedder=HashingEmbedder(),
        config=MemoryConfig(sessions={"max_text_chars": 10}),
    ) as m:
        with pytest.raises(InvalidInputError, match="more than max_text_chars=10"):
            m.add_turn("u", "s", "user", "x" * 11)


def test_closed_store_raises_on_every_call(embedder) -> None:
    m = ReflectiveMemory(embedder=embedder)
    m.add_turn("u", "s", "user", "hello")
    m.close()
    m.close()  # idempotent
    for call in (
        lambda: m.add_turn("u", "s", "user", "again"),
        lambda: m.retrieve("u", "hello"),
        lambda: m.end_session("u", "s"),
        lambda: m.turns("u"),
        lambda: m.users(),
        lambda: m.stats("u"),
        lambda: m.delete_user("u"),
    ):
        with pytest.raises(StoreClosedError, match="closed"):
            call()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"units": {"granularities": ("topic",)}},
            "units.granularities must be distinct names from",
        ),
        ({"units": {"granularities": ()}}, "at least one"),
        ({"search": {"mode": "semantic"}}, "search.mode must be one of"),
        ({"search": {"default_k": 0}}, "search.default_k must be None or an integer >= 1"),
        ({"search": {"dense_weight": -1}}, "search.dense_weight must be a number >= 0"),
        ({"sessions": {"max_turns": 0}}, "sessions.max_turns"),
    ],
)
def test_bad_config_is_rejected(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryConfig(**kwargs)


def test_config_round_trip() -> None:
    cfg = MemoryConfig(units={"granularities": ("turn", "segment")}, search={"default_k": 7})
    assert MemoryConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown MemoryConfig setting"):
        MemoryConfig.from_dict({"nope": 1})


def test_path_that_is_a_file_is_rejected(tmp_path, embedder) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InvalidInputError, match="not a directory"):
        ReflectiveMemory(f, embedder=embedder)
