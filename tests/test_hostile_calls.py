"""Hostile calls against every public method of `ReflectiveMemory`, on both backends.

A generated corpus: for every argument of every public method (and its async twin), each
hostile value of `HOSTILE` (wrong types, NUL, lone surrogates, blank and overlong strings, odd
numbers, bad collections) takes the place of a valid one. Every call must either succeed or
raise a `ReflectiveMemoryError`; never a `TypeError`, a driver error or a `UnicodeError`. The
store must still work afterwards. The embedded SQLite store always runs; the PostgreSQL one
runs on the throwaway cluster of `conftest.pg_cluster` (skipped without PostgreSQL + pgvector,
failed where REFLECTIVE_REQUIRE_POSTGRES=1).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import (
    InvalidInputError,
    ReflectiveMemoryError,
    StoreCorruptedError,
    StoreError,
)
from reflective_memory.storage.driver_errors import typed_error

logger = logging.getLogger(__name__)


class _Opaque:
    """An object of no type any method expects."""

    def __repr__(self) -> str:
        return "<opaque>"


#: (label, value) of every hostile argument value.
HOSTILE: tuple[tuple[str, Any], ...] = (
    ("int", 5),
    ("negative int", -1),
    ("zero", 0),
    ("huge int", 2**70),
    ("bool", True),
    ("float", 1.5),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("bytes", b"x"),
    ("None", None),
    ("empty list", []),
    ("list of int", [5]),
    ("list of bytes", [b"x"]),
    ("list of None", [None]),
    ("list with NUL", ["a\x00b"]),
    ("list with surrogate", ["\ud800"]),
    ("dict", {"a": 1}),
    ("int-keyed dict", {1: 2}),
    ("nested dict", {"k": {"k": float("nan")}}),
    ("dict with NUL", {"k": ["a\x00b"]}),
    ("dict with surrogate", {"\ud800": 1}),
    ("dict with bytes", {"k": b"x"}),
    ("empty dict", {}),
    ("tuple", ("a", 5)),
    ("bytearray", bytearray(b"x")),
    ("very negative float", -1e308),
    ("set", {"x"}),
    ("object", _Opaque()),
    ("empty str", ""),
    ("whitespace", " \t\n"),
    ("NUL", "a\x00b"),
    ("only NUL", "\x00"),
    ("lone surrogate", "\ud800"),
    ("surrogate pair halves", "x\udc80y"),
    ("long str", "x" * 5000),
    ("very long str", "word " * 40_000),
    ("control chars", "a\x07\x1b[31mb"),
    ("newline", "a\nb"),
    ("emoji", "é🙂"),
    ("sql", "'; DROP TABLE turns; --"),
    ("percent", "%s %(x)s {0}"),
)


@dataclass(frozen=True)
class Arg:
    """One argument of a method: its name, a valid value, and whether it is positional."""

    name: str
    valid: Any
    positional: bool = True


def kw(name: str, valid: Any) -> Arg:
    """A keyword-only argument."""
    return Arg(name, valid, positional=False)


#: A valid value taken from the seeded context (a `Retrieval`, a memory id, ...).
@dataclass(frozen=True)
class Ctx:
    key: str


_TURN = {"user_id": "u", "session_id": "s9", "role": "user", "text": "hello there"}

#: Every public method with a valid call, argument by argument.
METHODS: dict[str, tuple[Arg, ...]] = {
    "add_turn": (
        Arg("user_id", "u"),
        Arg("session_id", "s2"),
        Arg("role", "user"),
        Arg("text", "my cat is called Tom"),
        kw("timestamp", None),
        kw("turn_id", None),
    ),
    "add_turns": (Arg("turns", [_TURN]),),
    "turn_time": (Arg("user_id", "u"), Arg("session_id", "s2"), kw("timestamp", None)),
    "end_session": (Arg("user_id", "u"), Arg("session_id", "s")),
    "redenoise": (Arg("user_id", "u"), kw("only_stale", False)),
    "reflection_report": (Arg("user_id", "u"), Arg("session_id", "s")),
    "retrieve": (
        Arg("user_id", "u"),
        Arg("query", "what is my dog called?"),
        kw("k", 3),
        kw("budget_tokens", None),
        kw("mode", None),
        kw("recall", None),
        kw("views", None),
        kw("reflect", None),
        kw("explore", None),
        kw("exclude_turns", None),
        kw("now", None),
    ),
    "ranker_weights": (Arg("user_id", "u"),),
    "rerank_texts": (
        Arg("user_id", "u"),
        Arg("query", "dogs"),
        Arg("texts", ["cats purr", "dogs bark"]),
        kw("ids", None),
        kw("top_n", None),
        kw("explore", False),
        kw("keep_order", False),
        kw("reranker", None),
        kw("times", None),
        kw("now", None),
    ),
    "feedback": (
        Arg("shown", Ctx("retrieval")),
        Arg("answer", "Pixel. [0]"),
        kw("cited", None),
        kw("numbering", None),
    ),
    "turns": (Arg("user_id", "u"), Arg("session_id", None)),
    "memories": (Arg("user_id", "u"), Arg("ids", None)),
    "open_sessions": (Arg("user_id", "u"),),
    "put_memory": (
        Arg("user_id", "u"),
        Arg("text", "likes tea"),
        kw("memory_id", None),
        kw("key", None),
        kw("granularity", "item"),
        kw("session_id", ""),
        kw("turn_ids", ()),
        kw("metadata", None),
    ),
    "get_memory": (Arg("user_id", "u"), Arg("memory_id", Ctx("memory_id"))),
    "delete_memory": (Arg("user_id", "u"), Arg("memory_id", "no-such-memory")),
    "delete_memories": (Arg("user_id", "u"), Arg("memory_ids", ["no-such-memory"])),
    "delete_expired": (Arg("user_id", "u"), Arg("now", 0.0)),
    "update_memory_metadata": (Arg("user_id", "u"), Arg("updates", {"no-such-memory": {"n": 1}})),
    "delete_turns": (Arg("user_id", "u"), Arg("session_id", "s3"), Arg("turn_ids", ["t0"])),
    "delete_session": (Arg("user_id", "u"), Arg("session_id", "s4")),
    "delete_user": (Arg("user_id", "gone"),),
    "stats": (Arg("user_id", "u"),),
}
ASYNC_TWINS = {
    "aadd_turn": "add_turn",
    "aadd_turns": "add_turns",
    "aend_session": "end_session",
    "aturns": "turns",
    "aretrieve": "retrieve",
    "afeedback": "feedback",
}


@dataclass(frozen=True)
class Call:
    """One hostile call: which method, which argument is hostile and with what."""

    method: str
    target: str
    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, mem: ReflectiveMemory) -> Any:
        fn: Callable[..., Any] = getattr(mem, self.method)
        out = fn(*self.args, **self.kwargs)
        if asyncio.iscoroutine(out):
            return asyncio.run(out)
        return out


def _resolve(value: Any, ctx: dict[str, Any]) -> Any:
    return ctx[value.key] if isinstance(value, Ctx) else value


def _call(method: str, spec: tuple[Arg, ...], ctx: dict, target: str, bad: Any, label: str) -> Call:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for a in spec:
        value = bad if a.name == target else _resolve(a.valid, ctx)
        if a.positional:
            args.append(value)
        else:
            kwargs[a.name] = value
    return Call(method, target, label, tuple(args), kwargs)


def corpus(ctx: dict[str, Any]) -> Iterator[Call]:
    """Every hostile call: one hostile argument at a time, and hostile fields of a turn dict."""
    for method in (*METHODS, *ASYNC_TWINS):
        spec = METHODS[ASYNC_TWINS.get(method, method)]
        for a in spec:
            for label, bad in HOSTILE:
                yield _call(method, spec, ctx, a.name, bad, label)
    for name in (*_TURN, "timestamp", "turn_id"):
        for label, bad in HOSTILE:
            yield Call("add_turns", f"turns[0].{name}", label, ([{**_TURN, name: bad}],), {})
    for label, bad in HOSTILE:
        yield Call("add_turns", "turns[0]", label, ([bad],), {})


def _seed(mem: ReflectiveMemory) -> dict[str, Any]:
    """A user with ended and open sessions, a direct memory and a retrieval to give feedback on."""
    for session in ("s", "s3", "s4"):
        mem.add_turn("u", session, "user", "My dog Pixel loves the beach.", turn_id="t0")
        mem.add_turn("u", session, "assistant", "Pixel sounds lovely.")
    mem.end_session("u", "s")
    mem.add_turn("gone", "s", "user", "I will be deleted.")
    stored = mem.put_memory("u", "likes coffee")
    return {"retrieval": mem.retrieve("u", "what is my dog called?", k=2), "memory_id": stored.id}


def _still_usable(mem: ReflectiveMemory) -> None:
    """The store answers and writes normally after the hostile calls."""
    mem.add_turn("after", "s1", "user", "My sister Lena plays the violin.")
    mem.end_session("after", "s1")
    hits = mem.retrieve("after", "who plays the violin?", k=1).hits
    assert hits and "violin" in hits[0].memory.text
    assert "after" in mem.users()
    assert mem.stats("after")["turns"] == 1
    assert mem.delete_user("after") == 1


def _describe(call: Call, exc: BaseException) -> str:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return f"{call.method}({call.target}={call.label}): {kind}: {str(exc)[:120]}"


@dataclass
class Outcome:
    """What the corpus did on one backend."""

    calls: int = 0
    typed: int = 0
    untyped: list[str] = field(default_factory=list)
    reached_store: list[str] = field(default_factory=list)
    #: (method, argument, hostile label) -> "ok" or the typed error's class name.
    results: dict[tuple[str, str, str], str] = field(default_factory=dict)


def _run_corpus(mem: ReflectiveMemory) -> Outcome:
    """Run every hostile call, then check the store still works.

    `reached_store` lists the calls whose typed error was mapped from a driver error (the
    input got past the checks to the store).
    """
    ctx = _seed(mem)
    out = Outcome()
    for call in corpus(ctx):
        out.calls += 1
        result = "ok"
        try:
            call.run(mem)
        except ReflectiveMemoryError as exc:
            out.typed += 1
            result = type(exc).__name__
            duplicate = "already exists" in str(exc)  # only the store can know that
            if not duplicate and exc.__cause__ is not None and typed_error(exc.__cause__):
                out.reached_store.append(_describe(call, exc.__cause__))
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            out.untyped.append(_describe(call, exc))
            result = type(exc).__name__
        out.results[(call.method, call.target, call.label)] = result
    _still_usable(mem)
    return out


def _check(mem: ReflectiveMemory) -> Outcome:
    out = _run_corpus(mem)
    logger.info(
        "%d hostile calls: %d typed errors, %d untyped", out.calls, out.typed, len(out.untyped)
    )
    assert out.calls > 1500
    assert out.typed > out.calls // 2  # most hostile calls are refused
    assert not out.untyped, (
        f"{len(out.untyped)} of {out.calls} calls raised untyped errors:\n" + "\n".join(out.untyped)
    )
    assert not out.reached_store, "hostile input reached the store:\n" + "\n".join(
        out.reached_store
    )
    return out


_CONFIG = {"units": {"granularities": ("turn", "session")}}


def test_hostile_calls_on_sqlite(tmp_path) -> None:
    with ReflectiveMemory(
        tmp_path / "m", embedder=HashingEmbedder(32), config=MemoryConfig(**_CONFIG)
    ) as mem:
        _check(mem)


def test_hostile_calls_on_postgres_as_on_sqlite(pg_dsn, tmp_path) -> None:
    """Every hostile call ends the same way on both backends (one layer of checks)."""
    with ReflectiveMemory(
        store=pg_dsn, embedder=HashingEmbedder(32), config=MemoryConfig(**_CONFIG)
    ) as mem:
        on_pg = _check(mem)
    with ReflectiveMemory(
        tmp_path / "m", embedder=HashingEmbedder(32), config=MemoryConfig(**_CONFIG)
    ) as mem:
        on_sqlite = _run_corpus(mem)
    differ = [
        f"{key}: sqlite {on_sqlite.results[key]}, postgres {result}"
        for key, result in on_pg.results.items()
        if on_sqlite.results[key] != result
    ]
    assert not differ, "\n".join(differ)


def test_the_valid_calls_of_the_corpus_succeed(tmp_path) -> None:
    """Each hostile call differs from a working call in one argument only."""
    with ReflectiveMemory(
        tmp_path / "m", embedder=HashingEmbedder(32), config=MemoryConfig(**_CONFIG)
    ) as mem:
        ctx = _seed(mem)
        for method in (*METHODS, *ASYNC_TWINS):
            spec = METHODS[ASYNC_TWINS.get(method, method)]
            _call(method, spec, ctx, "", None, "valid").run(mem)


def test_corpus_covers_every_public_method() -> None:
    public = {
        name
        for name in dir(ReflectiveMemory)
        if not name.startswith("_") and callable(getattr(ReflectiveMemory, name))
    }
    # `arun` runs any callable, `aclose` takes nothing: no arguments to make hostile
    assert public - {"close", "users", "arun", "aclose"} == set(METHODS) | set(ASYNC_TWINS)
    assert len(list(corpus({"retrieval": None, "memory_id": "m"}))) > 1500


@pytest.mark.parametrize("method", ["delete_user", "turns", "memories", "stats", "retrieve"])
def test_nul_in_an_id_is_invalid_input(mem, method) -> None:
    args = ("a\x00b", "q") if method == "retrieve" else ("a\x00b",)
    with pytest.raises(InvalidInputError, match="NUL"):
        getattr(mem, method)(*args)


def _no_check(name: str, value: object, **_: object) -> object:
    return value


def test_a_driver_error_past_the_checks_is_typed_with_its_cause_on_sqlite(mem, monkeypatch):
    """The mapping is the safety net behind the checks: with them off, SQLite's errors."""
    import reflective_memory.records as records

    monkeypatch.setattr(records, "check_ids", _no_check)
    with pytest.raises(InvalidInputError) as info:
        mem.memories("u", ["\ud800"])
    assert isinstance(info.value.__cause__, UnicodeEncodeError)
    monkeypatch.setattr(mem.store, "users", _raiser(sqlite3.IntegrityError("constraint")))
    with pytest.raises(InvalidInputError) as info:
        mem.users()
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    monkeypatch.setattr(mem.store, "users", _raiser(sqlite3.OperationalError("no such table")))
    with pytest.raises(StoreError):
        mem.users()
    monkeypatch.setattr(
        mem.store, "users", _raiser(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x"))
    )
    with pytest.raises(StoreCorruptedError):
        mem.users()
    monkeypatch.setattr(mem.store, "users", _raiser(KeyError("a bug stays a bug")))
    with pytest.raises(KeyError):
        mem.users()


def _raiser(exc: Exception) -> Callable[..., Any]:
    def fail(*_: object, **__: object) -> Any:
        raise exc

    return fail


def test_a_driver_error_past_the_checks_is_typed_with_its_cause_on_postgres(pg_dsn, monkeypatch):
    """With the id checks off, PostgreSQL's DataError on a NUL is an InvalidInputError."""
    import psycopg
    import reflective_memory.records as records

    monkeypatch.setattr(records, "check_id", _no_check)
    with ReflectiveMemory(store=pg_dsn, embedder=HashingEmbedder(16)) as mem:
        with pytest.raises(InvalidInputError) as info:
            mem.delete_user("a\x00b")
        assert isinstance(info.value.__cause__, psycopg.DataError)
        mem.add_turn("ana", "s", "user", "still works")
        assert mem.stats("ana")["turns"] == 1


def test_a_locked_sqlite_database_is_unavailable_not_bad_input(tmp_path) -> None:
    from reflective_memory.errors import StoreUnavailableError

    path = tmp_path / "x.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, timeout=0)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as info:
            other.execute("SELECT * FROM sqlite_master").fetchall()
        assert isinstance(typed_error(info.value), StoreUnavailableError)
    finally:
        holder.close()
        other.close()


def test_a_store_that_cannot_be_opened_is_a_typed_error(tmp_path) -> None:
    from reflective_memory.errors import StoreUnavailableError

    (tmp_path / "memory.sqlite3").mkdir()  # the database file's name is taken by a directory
    with pytest.raises(StoreUnavailableError) as info:
        ReflectiveMemory(tmp_path, embedder=HashingEmbedder(8))
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
