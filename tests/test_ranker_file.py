"""Issue 50 (9): a `passages.ranker` file is read as a bounded regular file, every failure named.

A FIFO hung forever, `/dev/zero` read until `MemoryError`, 100,000-deep JSON raised
`RecursionError`, a 5,000-digit integer `ValueError`, a 401-digit weight in a correctly
checksummed file `OverflowError`, a non-UTF-8 file `StoreCorruptedError` (the wrong label), and a
300 MB checksummed file was accepted at 1.26 GB RSS. Each is now a `ConfigError` naming the file,
raised when the memory is built, before anything is read past the limits.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.retrieval.ranker import (
    MAX_MODEL_BYTES,
    load_ranker,
    model_checksum,
)


def _sealed(path: Path, weights: dict[str, Any] | str, fitted: Any = None) -> Path:
    """A turn ranker file with the shipped model's features, a valid checksum, as given."""
    doc = load_ranker().to_json()
    body = {"format": doc["format"], "weights": doc["weights"], "fitted": fitted or {}}
    if isinstance(weights, dict):
        body["weights"] = {**body["weights"], **weights}
    text = json.dumps({**body, "sha256": model_checksum(body)})
    if isinstance(weights, str):  # a raw number spliced in, as JSON text
        name = next(iter(doc["weights"]))
        text = text.replace(f'"{name}": {doc["weights"][name]}', f'"{name}": {weights}')
        if weights.isdigit():  # sealed over what the file now says (JSON keeps the digits)
            reparsed = json.loads(text)
            reparsed["sha256"] = model_checksum(reparsed)
            text = json.dumps(reparsed)
    path.write_text(text)
    return path


def _refused(path: Path | str, match: str) -> None:
    """Loading `path` fails at once with a `ConfigError` naming it (and building a memory)."""
    done: list[BaseException | None] = []

    def load() -> None:
        try:
            load_ranker(str(path))
        except BaseException as exc:  # noqa: BLE001 - checked below
            done.append(exc)
        else:
            done.append(None)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(10)
    assert done, f"loading {path} did not return"
    assert isinstance(done[0], ConfigError), repr(done[0])
    assert str(path) in str(done[0]) and match in str(done[0]), str(done[0])
    cfg = MemoryConfig(passages={"ranker": str(path)})
    with pytest.raises(ConfigError, match="turn ranker"):
        ReflectiveMemory(embedder=HashingEmbedder(16), config=cfg)


def test_special_files_are_refused_without_reading_them(tmp_path: Path) -> None:
    fifo = tmp_path / "ranker.fifo"
    os.mkfifo(fifo)
    _refused(fifo, "not a regular file")  # it waited for a writer forever
    _refused("/dev/zero", "not a regular file")  # it read until MemoryError
    _refused(tmp_path, "not a regular file")


def test_json_past_the_limits_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _refused(deep, "nested deeper than")
    long_int = tmp_path / "int.json"
    long_int.write_text('{"weights": {"cosine": ' + "9" * 5000 + "}}")
    _refused(long_int, "5,000 digits")
    _refused(_sealed(tmp_path / "huge.json", "9" * 401), "401 digits")
    _refused(_sealed(tmp_path / "inf.json", "1e999"), "too large to be finite")
    _refused(_sealed(tmp_path / "nan.json", "NaN"), "NaN is not a number")
    _refused(_sealed(tmp_path / "big.json", {"cosine": 1e300}), "weights beyond")


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"format": "caf\xe9"}')
    _refused(path, "is not UTF-8 text (byte 15)")


def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    padding = {"notes": "x" * (MAX_MODEL_BYTES + 10)}  # a correctly checksummed large file
    path = _sealed(tmp_path / "large.json", {}, fitted=padding)
    assert path.stat().st_size > MAX_MODEL_BYTES
    _refused(path, f"more than the maximum of {MAX_MODEL_BYTES:,}")


def test_a_sound_file_still_loads(tmp_path: Path) -> None:
    path = _sealed(tmp_path / "ok.json", {"cosine": 2.5})
    assert load_ranker(str(path)).weights["cosine"] == 2.5


def test_the_other_learned_files_are_read_the_same_bounded_way(tmp_path: Path) -> None:
    """Segmenter weights and a rubric a user names are read by the same bounded reader."""
    from reflective_memory.errors import InvalidInputError
    from reflective_memory.segment.embedding import load_weights
    from reflective_memory.segment.rubric import Rubric

    fifo = tmp_path / "weights.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=f"{fifo}: is not a regular file"):
        load_weights(fifo)
    with pytest.raises(InvalidInputError, match=f"{fifo}: is not a regular file"):
        Rubric.load(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested deeper"):
        load_weights(deep)
    assert load_weights()["features"]  # the shipped weights still load
