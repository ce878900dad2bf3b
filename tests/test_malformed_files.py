"""Malformed conversation files through every CLI command that reads one: exit 2, one line.

A corpus of broken files for each supported format (reflective-memory/v1, LongMemEval, LoCoMo):
wrong top-level types, missing and extra keys, wrong value types, numbers and nulls where text
belongs, nesting 100,000 deep, huge strings, invalid UTF-8, truncated JSON and gzip, a `.gz`
that is not gzip, files over the size limit. Each runs in-process through
`reflective_memory.cli.main`; the command must exit 2 with exactly one line on stderr, no
traceback, and leave no store behind.
"""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reflective_memory.cli import main
from reflective_memory.errors import InvalidFileError
from reflective_memory.io import load_conversations
from test_formats import LOCOMO  # a LoCoMo sample with a photo caption and a question

OURS: dict[str, Any] = {
    "format": "reflective-memory/v1",
    "sessions": [
        {
            "user_id": "maya",
            "session_id": "s1",
            "date": "2025-01-12T09:30:00",
            "turns": [
                {"role": "user", "text": "I moved to Lisbon last week.", "turn_id": "t1"},
                {"role": "assistant", "text": "How do you like it so far?"},
            ],
        }
    ],
    "questions": [
        {"user_id": "maya", "question": "Where do I live?", "answer": "Lisbon", "evidence": ["t1"]}
    ],
}

LONGMEMEVAL: list[dict[str, Any]] = [
    {
        "question_id": "q1",
        "question_type": "single-session-user",
        "question": "What degree did I graduate with?",
        "answer": "Business Administration",
        "question_date": "2023/05/23 (Tue) 19:11",
        "haystack_dates": ["2023/05/21 (Sun) 11:54"],
        "haystack_session_ids": ["a"],
        "answer_session_ids": ["a"],
        "haystack_sessions": [
            [
                {
                    "role": "user",
                    "content": "I studied Business Administration.",
                    "has_answer": True,
                },
                {"role": "assistant", "content": "Congratulations!"},
            ]
        ],
    }
]

BASES = {"ours": OURS, "longmemeval": LONGMEMEVAL, "locomo": LOCOMO}

DELETE = object()  # a mutation that removes the key
HUGE = "x" * 2_000_001  # one character more than the engine's sessions.max_text_chars
LONG_ID = "i" * 600  # longer than MAX_ID_CHARS

_T = ("sessions", 0, "turns", 0)  # our first turn
_L = (0, "haystack_sessions", 0, 0)  # LongMemEval's first turn
_C = (0, "conversation", "session_1", 0)  # LoCoMo's first turn

#: (format, path to the value changed, new value or DELETE); path () replaces the whole file.
MUTATIONS: list[tuple[str, tuple[Any, ...], Any]] = [
    # whole file of the wrong type
    *[("ours", (), v) for v in ([], "text", None, 5, [1, 2], {"format": "other"})],
    # our schema: sessions and turns
    ("ours", ("sessions",), DELETE),
    ("ours", ("sessions",), {"s1": []}),
    ("ours", ("sessions",), None),
    ("ours", ("sessions", 0), "s1"),
    ("ours", ("sessions", 0, "turns"), DELETE),
    ("ours", ("sessions", 0, "turns"), None),
    ("ours", ("sessions", 0, "turns"), {"role": "user"}),
    ("ours", ("extra",), 1),
    ("ours", ("description",), ["not", "text"]),
    ("ours", ("sessions", 0, "extra"), 1),
    ("ours", (*_T, "extra"), "x"),
    ("ours", (*_T, "role"), DELETE),
    ("ours", (*_T, "text"), DELETE),
    ("ours", (*_T, "text"), 42),
    ("ours", (*_T, "text"), 4.5),
    ("ours", (*_T, "text"), None),
    ("ours", (*_T, "text"), ""),
    ("ours", (*_T, "text"), "   "),
    ("ours", (*_T, "text"), ["a", "b"]),
    ("ours", (*_T, "text"), {"en": "hi"}),
    ("ours", (*_T, "text"), True),
    ("ours", (*_T, "text"), HUGE),
    ("ours", (*_T, "text"), "lone \ud800 surrogate"),
    ("ours", (*_T, "role"), 1),
    ("ours", (*_T, "role"), None),
    ("ours", (*_T, "role"), ""),
    ("ours", (*_T, "role"), "user: assistant"),
    ("ours", (*_T, "role"), "r" * 100),
    ("ours", (*_T, "turn_id"), 7),
    ("ours", (*_T, "turn_id"), LONG_ID),
    ("ours", ("sessions", 0, "turns", 1, "turn_id"), "t1"),  # repeated turn id
    ("ours", (*_T, "timestamp"), "not a date"),
    ("ours", (*_T, "timestamp"), True),
    ("ours", (*_T, "timestamp"), ["2025-01-12"]),
    ("ours", (*_T, "timestamp"), 1e300),
    ("ours", ("sessions", 0, "date"), "the twelfth"),
    ("ours", ("sessions", 0, "session_id"), 3),
    ("ours", ("sessions", 0, "session_id"), ""),
    ("ours", ("sessions", 0, "user_id"), 12),
    ("ours", ("sessions", 0, "user_id"), LONG_ID),
    ("ours", ("questions",), {"q": 1}),
    ("ours", ("questions", 0), "Where?"),
    ("ours", ("questions", 0, "question"), DELETE),
    ("ours", ("questions", 0, "question"), 3),
    ("ours", ("questions", 0, "question"), HUGE),
    ("ours", ("questions", 0, "answer"), {"city": "Lisbon"}),
    ("ours", ("questions", 0, "evidence"), "t1"),
    ("ours", ("questions", 0, "evidence"), [1]),
    ("ours", ("questions", 0, "hint"), "x"),
    # LongMemEval
    ("longmemeval", (0,), "q1"),
    ("longmemeval", (0, "haystack_sessions"), None),
    ("longmemeval", (0, "haystack_sessions"), {"a": []}),
    ("longmemeval", (0, "haystack_sessions", 0), "turns"),
    ("longmemeval", (0, "haystack_sessions", 0, 0), "hello"),
    ("longmemeval", (*_L, "content"), DELETE),
    ("longmemeval", (*_L, "content"), 42),
    ("longmemeval", (*_L, "content"), None),
    ("longmemeval", (*_L, "content"), HUGE),
    ("longmemeval", (*_L, "role"), DELETE),
    ("longmemeval", (*_L, "role"), 3),
    ("longmemeval", (*_L, "role"), "a[b]"),
    ("longmemeval", (*_L, "has_answer"), "yes"),
    ("longmemeval", (0, "haystack_session_ids"), DELETE),
    ("longmemeval", (0, "haystack_session_ids"), ["a", "b"]),
    ("longmemeval", (0, "haystack_session_ids"), [5]),
    ("longmemeval", (0, "haystack_session_ids"), "a"),
    ("longmemeval", (0, "haystack_dates"), ["2023/05/21 (Sun) 11:54", "x"]),
    ("longmemeval", (0, "haystack_dates", 0), "someday"),
    ("longmemeval", (0, "haystack_dates", 0), False),
    ("longmemeval", (0, "question_id"), DELETE),
    ("longmemeval", (0, "question_id"), 17),
    ("longmemeval", (0, "question_id"), None),
    ("longmemeval", (0, "question"), DELETE),
    ("longmemeval", (0, "question"), ["What?"]),
    ("longmemeval", (0, "answer"), {"degree": "BA"}),
    ("longmemeval", (0, "answer_session_ids"), "a"),
    ("longmemeval", (0, "question_type"), 5),
    # LoCoMo
    ("locomo", (0,), ["conversation"]),
    ("locomo", (0, "conversation"), "Caroline and Melanie"),
    ("locomo", (0, "conversation"), None),
    ("locomo", (0, "conversation", "session_1"), {"D1:1": "hi"}),
    ("locomo", (0, "conversation", "session_1"), None),
    ("locomo", (0, "conversation", "session_1", 0), "hi"),
    ("locomo", (*_C, "text"), 42),
    ("locomo", (*_C, "text"), None),
    ("locomo", (*_C, "text"), DELETE),
    ("locomo", (*_C, "text"), HUGE),
    ("locomo", (*_C, "speaker"), DELETE),
    ("locomo", (*_C, "speaker"), 5),
    ("locomo", (*_C, "dia_id"), DELETE),
    ("locomo", (*_C, "dia_id"), 1.1),
    ("locomo", (0, "conversation", "session_1", 1, "dia_id"), "D1:1"),  # repeated dia_id
    ("locomo", (*_C, "blip_caption"), 3),
    ("locomo", (0, "conversation", "session_1_date_time"), 5),
    ("locomo", (0, "conversation", "session_1_date_time"), "yesterday-ish"),
    ("locomo", (0, "sample_id"), 9),
    ("locomo", (0, "qa"), {"q": 1}),
    ("locomo", (0, "qa", 0), "Where?"),
    ("locomo", (0, "qa", 0, "question"), DELETE),
    ("locomo", (0, "qa", 0, "question"), None),
    ("locomo", (0, "qa", 0, "evidence"), "D1:1"),
    ("locomo", (0, "qa", 0, "category"), []),
    ("locomo", (0, "qa", 0, "answer"), ["a", "group"]),
]


def _mutate(fmt: str, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc = copy.deepcopy(BASES[fmt])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _dump(doc: Any) -> bytes:
    return json.dumps(doc).encode("utf-8")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _raw_cases() -> list[tuple[str, str, bytes, list[str]]]:
    """(id, file name, bytes, extra CLI options) for damage below the level of values."""
    out: list[tuple[str, str, bytes, list[str]]] = []
    for fmt, base in BASES.items():
        good = _dump(base)
        text_key = {"ours": b'"text": ', "longmemeval": b'"content": ', "locomo": b'"text": '}[fmt]
        head, tail = good.split(text_key, 1)
        out += [
            (f"{fmt}-truncated", "f.json", good[: len(good) // 2], []),
            (f"{fmt}-truncated-end", "f.json", good[:-1], []),
            (f"{fmt}-invalid-utf8", "f.json", head + text_key + b'"\xff\xfe\xc3(' + tail[1:], []),
            (f"{fmt}-latin1", "f.json", good.replace(b"I ", "Ça ".encode("latin-1")), []),
            (
                f"{fmt}-deep-100000",
                "f.json",
                head + text_key + _nested(100_000).encode() + b"}",
                [],
            ),
            (
                f"{fmt}-deep-100000-text",
                "f.json",
                head + text_key + _nested(100_000).encode() + tail,
                [],
            ),
            (f"{fmt}-deep-40", "f.json", head + text_key + _nested(40).encode() + b"," + tail, []),
            (f"{fmt}-huge-int", "f.json", head + text_key + b"9" * 100_000 + b"," + tail, []),
            (f"{fmt}-nan-as-text", "f.json", head + text_key + b"NaN," + tail, []),
            (f"{fmt}-gz-not-gzip", "f.json.gz", good, []),
            (f"{fmt}-gz-truncated", "f.json.gz", gzip.compress(good)[:-12], []),
            (f"{fmt}-gz-of-garbage", "f.json.gz", gzip.compress(b"\x00\x01 not json"), []),
            (
                f"{fmt}-too-large",
                "f.json",
                good[:-1] + b" " * 2**20 + good[-1:],
                ["--max-file-mb", "1"],
            ),
            (
                f"{fmt}-gz-bomb",
                "f.json.gz",
                gzip.compress(good[:-1] + b" " * 3 * 2**20 + good[-1:]),
                ["--max-file-mb", "1"],
            ),
        ]
    out += [
        ("empty-file", "f.json", b"", []),
        ("whitespace-only", "f.json", b"  \n ", []),
        ("deep-100000-top", "f.json", _nested(100_000).encode(), []),
        ("deep-100000-objects", "f.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, []),
        ("binary", "f.json", bytes(range(256)) * 4, []),
        ("utf16", "f.json", json.dumps(OURS).encode("utf-16"), []),
        # LoCoMo keys this reader does not use may hold anything, but not nesting 40 deep
        (
            "locomo-extra-key-deep",
            "f.json",
            _dump(_mutate("locomo", (0, "extra"), 1)).replace(
                b'"extra": 1', b'"extra": ' + _nested(40).encode()
            ),
            [],
        ),
    ]
    return out


def _mutation_id(case: tuple[str, tuple[Any, ...], Any]) -> str:
    fmt, path, value = case
    shown = "DELETE" if value is DELETE else type(value).__name__
    if isinstance(value, str) and len(value) > 40:
        shown = f"str{len(value)}"
    return f"{fmt}-{'.'.join(map(str, path)) or 'top'}-{shown}"


CORPUS: list[tuple[str, str, bytes, list[str]]] = [
    (f"{_mutation_id(c)}-{i}", "f.json", _dump(_mutate(*c)), []) for i, c in enumerate(MUTATIONS)
] + _raw_cases()


def _has_bench() -> bool:
    from reflective_memory.cli import _find_benchmarks

    return _find_benchmarks() and importlib.util.find_spec("reflective_bench.ingest") is not None


def _ingest(file: Path, db: Path, options: list[str]) -> list[str]:
    return ["ingest", str(file), "--user", "u", "--db", str(db), "--quiet", *options]


def _segment(file: Path, db: Path, options: list[str]) -> list[str]:
    return ["segment", str(file), "--embedder", "hashing", *options]


def _bench_ingest(file: Path, db: Path, options: list[str]) -> list[str]:
    if not _has_bench():
        pytest.skip("the benchmarks of a source checkout are not here")
    assert not options, "bench ingest has no --max-file-mb"
    return ["bench", "ingest", "--data", str(file), "--quiet"]


COMMANDS: dict[str, Callable[[Path, Path, list[str]], list[str]]] = {
    "ingest": _ingest,
    "segment": _segment,
    "bench-ingest": _bench_ingest,
}


def test_the_corpus_is_broad() -> None:
    ids = [c[0] for c in CORPUS]
    assert len(ids) == len(set(ids)) and len(ids) >= 150
    for fmt in BASES:
        assert sum(i.startswith(fmt) for i in ids) >= 25


@pytest.mark.parametrize("fmt", sorted(BASES))
def test_the_unbroken_files_read(tmp_path: Path, fmt: str, capsys) -> None:
    """Each mutation breaks a file that reads fine (so the corpus tests what it says)."""
    for name, data in (
        ("f.json", _dump(BASES[fmt])),
        ("f.json.gz", gzip.compress(_dump(BASES[fmt]))),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        (conv,) = load_conversations(path, default_user="u")
        assert conv.n_turns >= 2 and conv.questions
        assert main(_segment(path, tmp_path, [])) == 0, capsys.readouterr().err


# `bench ingest` reads with the default size limit only: the cases that lower it are not its
RUNS = [(cmd, *c) for c in CORPUS for cmd in sorted(COMMANDS) if cmd != "bench-ingest" or not c[3]]


@pytest.mark.parametrize(
    ("command", "name", "filename", "data", "options"),
    RUNS,
    ids=[f"{r[0]}-{r[1]}" for r in RUNS],
)
def test_malformed_file_exits_2_with_one_line(
    tmp_path: Path, capsys, command: str, name: str, filename: str, data: bytes, options: list[str]
) -> None:
    path = tmp_path / filename
    path.write_bytes(data)
    db = tmp_path / "store"
    argv = COMMANDS[command](path, db, options)
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (name, out, err)
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err[:500]
    assert "Traceback" not in err and len(err) < 2000
    assert str(path) in err  # the message names the file
    assert not db.exists()  # nothing written


@pytest.mark.parametrize(
    ("fmt", "path", "value", "where"),
    [
        ("ours", (*_T, "text"), 42, "sessions[0].turns[0].text: must be a string, got an integer"),
        (
            "longmemeval",
            (*_L, "content"),
            DELETE,
            "[0].haystack_sessions[0][0]: missing key 'content'",
        ),
        (
            "locomo",
            (*_C, "text"),
            42,
            "[0].conversation.session_1[0].text: must be a string, got an integer",
        ),
        ("ours", (*_T, "extra"), 1, "sessions[0].turns[0]: unknown key 'extra'"),
        ("ours", (*_T, "text"), HUGE, "sessions[0].turns[0].text: has 2,000,001 characters"),
    ],
)
def test_the_error_names_file_path_and_problem(
    tmp_path: Path, fmt: str, path: tuple[Any, ...], value: Any, where: str
) -> None:
    file = tmp_path / "f.json"
    file.write_bytes(_dump(_mutate(fmt, path, value)))
    with pytest.raises(InvalidFileError) as exc:
        load_conversations(file, default_user="u")
    assert str(exc.value).startswith(f"{file}: {where}")
    assert exc.value.path == str(file) and exc.value.where and exc.value.problem


def test_a_deep_file_fails_fast_in_a_deep_stack(tmp_path: Path) -> None:
    """The depth bound holds however deep the caller's stack already is."""
    file = tmp_path / "f.json"
    file.write_text(_nested(100_000))

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
            return
        with pytest.raises(InvalidFileError, match="nested deeper"):
            load_conversations(file)

    deep(800)
