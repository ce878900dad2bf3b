"""Damaged index cache files are never trusted (issue 29): seeded bit flips, byte flips and
truncations of every file kind the embedded store writes under `index/` (the FAISS file of an
exact, IVF and HNSW index, and the sealed metadata file holding ids and keys) each end in a
logged warning and a rebuild from the stored embeddings, with the same search results as the
undamaged cache."""

from __future__ import annotations

import logging
import random
import shutil
import zlib
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

WORDS = "harbour violin lisbon parrot marathon allergy chess novel tea cycling".split()
QUERIES = ["violin lessons", "my parrot and chess"]
KINDS = {"exact": None, "ivf": "ivf", "hnsw": "hnsw"}
WARNING = "ignoring damaged index cache for user ana"


def _config(kind: str) -> MemoryConfig:
    ann = KINDS[kind]
    if ann is None:
        return MemoryConfig(index={"ann_threshold": None})
    return MemoryConfig(index={"ann_threshold": 0, "ann_kind": ann})


def _hits(mem: ReflectiveMemory) -> list[list[str]]:
    return [[h.memory.id for h in mem.retrieve("ana", q, k=5).hits] for q in QUERIES]


@pytest.fixture(scope="module", params=sorted(KINDS))
def cache(request, tmp_path_factory) -> tuple[str, Path, list[list[str]]]:
    kind = request.param
    base = tmp_path_factory.mktemp(f"idx-{kind}") / "m"
    with ReflectiveMemory(base, embedder=HashingEmbedder(), config=_config(kind)) as mem:
        for i in range(48):
            words = f"{WORDS[i % 10]} and {WORDS[(i * 3 + 1) % 10]}"
            mem.add_turn("ana", f"s{i % 4}", "user", f"note {i}: {words}")
        mem.end_session("ana", "s0")
        expected = _hits(mem)
        assert mem.indexes.get("ana").dense.kind == kind
    files = sorted(p.suffix for p in (base / "index").iterdir())
    assert files == [".faiss", ".json"]
    return kind, base, expected


def _damages(path: Path, seed: int) -> list[tuple[str, int, int]]:
    """Deterministic damage: 3 one-bit flips, 3 byte flips, 2 truncations (one to 0 bytes),
    and in the metadata file one-bit flips of the version and the user id, which still parse."""
    size = path.stat().st_size
    rng = random.Random(seed)
    out = [("bit", rng.randrange(size), rng.randrange(8)) for _ in range(3)]
    out += [("byte", rng.randrange(size), 0xFF) for _ in range(3)]
    out += [("cut", 0, 0), ("cut", rng.randrange(1, size), 0)]
    if path.suffix == ".json":
        data = path.read_bytes()
        out.append(("bit", data.index(b'"version": ') + 11, 0))  # 5 -> 4: a stale-looking file
        out.append(("bit", data.index(b'"user_id": "ana"') + 12, 1))  # ana -> cna
    return out


def _damage(path: Path, how: str, offset: int, arg: int) -> None:
    data = bytearray(path.read_bytes())
    if how == "cut":
        del data[offset:]
    else:
        data[offset] ^= (1 << arg) if how == "bit" else arg
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("suffix", [".faiss", ".json"])
def test_every_damaged_cache_file_is_logged_and_rebuilt(cache, suffix, tmp_path, caplog) -> None:
    kind, base, expected = cache
    [target] = (base / "index").glob(f"*{suffix}")
    cases = _damages(target, seed=zlib.crc32(f"{kind}{suffix}".encode()))
    assert len(cases) == (10 if suffix == ".json" else 8)
    for n, (how, offset, arg) in enumerate(cases):
        copy = tmp_path / f"c{n}"
        shutil.copytree(base, copy)
        _damage(copy / "index" / target.name, how, offset, arg)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reflective_memory.storage.index"):
            with ReflectiveMemory(copy, embedder=HashingEmbedder(), config=_config(kind)) as mem:
                got = _hits(mem)
        case = f"{kind} {suffix} {how}@{offset}"
        assert any(WARNING in r.getMessage() for r in caplog.records), case
        assert got == expected, case
        shutil.rmtree(copy)


def test_the_rebuilt_cache_is_saved_and_trusted_again(cache, tmp_path, caplog) -> None:
    kind, base, expected = cache
    copy = tmp_path / "c"
    shutil.copytree(base, copy)
    [target] = (copy / "index").glob("*.faiss")
    _damage(target, "bit", target.stat().st_size // 2, 3)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reflective_memory.storage.index"):
            with ReflectiveMemory(copy, embedder=HashingEmbedder(), config=_config(kind)) as mem:
                assert _hits(mem) == expected
    assert not [r for r in caplog.records if WARNING in r.getMessage()]  # second open: clean
