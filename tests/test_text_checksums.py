"""Stored text carries a checksum checked on read (issue 29): a single flipped bit in a turn's or
a memory's text, or a row changed behind the store's back, is `StoreCorruptedError` naming the
row, never text that differs from what was stored ("lighthouse" never comes back "lighvhouse").
Stores written before the checksum columns existed keep opening (the columns are filled once)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import StoreCorruptedError

WORD = b"lighthouse"
TEXT = "At dawn I painted the old lighthouse on the cliff."


def _fill(mem: ReflectiveMemory) -> None:
    mem.add_turn("ana", "s1", "user", TEXT, turn_id="t-1")
    mem.add_turn("ana", "s1", "assistant", "A fine subject for a painting.", turn_id="t-2")
    mem.end_session("ana", "s1")
    mem.add_turn("ana", "s2", "user", "Tomorrow I paint the harbour.", turn_id="t-3")


def _texts(mem: ReflectiveMemory) -> list[str]:
    """Every stored text and key of ana, read through the public API (turns, memories, search)."""
    out = [t.text for t in mem.turns("ana")]
    out += [m.text for m in mem.memories("ana")] + [m.key for m in mem.memories("ana")]
    out += [h.memory.text for h in mem.retrieve("ana", "lighthouse painting", k=5).hits]
    return out


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("crc") / "m"
    with ReflectiveMemory(base, embedder=HashingEmbedder()) as mem:
        _fill(mem)
    return base


def _flip_trials(db: Path) -> list[tuple[int, int]]:
    """(offset, bit) of one-bit flips inside every stored copy of the word, deterministic."""
    data = db.read_bytes()
    starts, i = [], data.find(WORD)
    while i >= 0:
        starts.append(i)
        i = data.find(WORD, i + 1)
    assert len(starts) >= 5  # the turn, its turn unit's text and key, the segment's text and key
    return [(s + (3 * k) % len(WORD), k % 7) for k, s in enumerate(starts * 3)]


def test_single_bit_flips_in_stored_text_are_typed_errors(stored, tmp_path) -> None:
    trials = _flip_trials(stored / "memory.sqlite3")
    assert len(trials) >= 15
    named = 0
    for n, (offset, bit) in enumerate(trials):
        copy = tmp_path / f"c{n}"
        shutil.copytree(stored, copy)
        db = copy / "memory.sqlite3"
        data = bytearray(db.read_bytes())
        data[offset] ^= 1 << bit
        db.write_bytes(bytes(data))
        with pytest.raises(StoreCorruptedError) as err:
            with ReflectiveMemory(copy, embedder=HashingEmbedder()) as mem:
                _texts(mem)  # a read that returned damaged text would not raise
        named += "'ana'" in str(err.value) and "does not match its checksum" in str(err.value)
    assert named == len(trials)  # every one names the user and the row


def _damaged(text: str) -> bool:
    """Whether `text` is a near miss of the word (the damage a flip would leave)."""
    return any(
        sum(a != b for a, b in zip(text[i : i + len(WORD)], WORD.decode(), strict=False)) == 1
        for i in range(len(text) - len(WORD) + 1)
    )


def test_the_undamaged_store_reads_back_every_text(stored) -> None:
    with ReflectiveMemory(stored, embedder=HashingEmbedder()) as mem:
        texts = _texts(mem)
    assert TEXT in texts and not any(_damaged(t) for t in texts)


def test_a_store_written_before_checksums_gets_them_at_open(stored, tmp_path) -> None:
    copy = tmp_path / "old"
    shutil.copytree(stored, copy)
    conn = sqlite3.connect(copy / "memory.sqlite3")
    for table, column in (("turns", "text_crc"), ("memories", "text_crc"), ("memories", "key_crc")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()
    conn.close()
    with ReflectiveMemory(copy, embedder=HashingEmbedder()) as mem:
        assert TEXT in _texts(mem)  # opens and reads as before
    conn = sqlite3.connect(copy / "memory.sqlite3")
    assert conn.execute("SELECT COUNT(*) FROM turns WHERE text_crc IS NULL").fetchone() == (0,)
    assert conn.execute(
        "SELECT COUNT(*) FROM memories WHERE text_crc IS NULL OR key_crc IS NULL"
    ).fetchone() == (0,)
    # filled from the text as it was: damage done now is caught
    conn.execute("UPDATE turns SET text = replace(text, 'lighthouse', 'lighvhouse')")
    conn.commit()
    conn.close()
    with ReflectiveMemory(copy, embedder=HashingEmbedder()) as mem:
        with pytest.raises(StoreCorruptedError, match="turn 't-1' of session 's1' of user 'ana'"):
            mem.turns("ana")


def test_a_row_without_a_checksum_is_read_unchecked(stored, tmp_path) -> None:
    copy = tmp_path / "null"
    shutil.copytree(stored, copy)
    conn = sqlite3.connect(copy / "memory.sqlite3")
    conn.execute("UPDATE turns SET text_crc = NULL WHERE turn_id = 't-1'")  # an older writer
    conn.commit()
    conn.close()
    with ReflectiveMemory(copy, embedder=HashingEmbedder()) as mem:
        assert TEXT in [t.text for t in mem.turns("ana")]


# -- PostgreSQL: rows changed behind the store's back ----------------------------------------
def _pg_mem(dsn: str, schema: str) -> ReflectiveMemory:
    from reflective_memory.storage.postgres import PostgresStore

    return ReflectiveMemory(
        store=PostgresStore(dsn, schema=schema, pool_max=2),
        embedder=HashingEmbedder(64),
        config=MemoryConfig(units={"granularities": ("turn", "segment")}),
    )


def _sql(dsn: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def test_postgres_rows_changed_behind_the_store_are_typed_errors(pg_dsn) -> None:
    schema = pg_schema()
    with _pg_mem(pg_dsn, schema) as mem:
        _fill(mem)
        assert TEXT in _texts(mem)
    s = f'"{schema}"'
    _sql(pg_dsn, f"UPDATE {s}.turns SET text = replace(text, 'lighthouse', 'lighvhouse')")
    with _pg_mem(pg_dsn, schema) as mem:
        with pytest.raises(StoreCorruptedError, match="turn 't-1' of session 's1' of user 'ana'"):
            mem.turns("ana")
        assert [m.text for m in mem.memories("ana")]  # memories are intact
    _sql(
        pg_dsn,
        f"UPDATE {s}.memories SET key = replace(key, 'lighthouse', 'lighvhouse')"
        " WHERE granularity = 'segment'",
    )
    with _pg_mem(pg_dsn, schema) as mem:
        with pytest.raises(StoreCorruptedError, match=r"memory 'segment-\w+' of user 'ana'"):
            mem.memories("ana")
    _sql(
        pg_dsn,
        f"UPDATE {s}.memories SET text = replace(text, 'lighthouse', 'lighvhouse')"
        " WHERE granularity = 'turn'",
    )
    with _pg_mem(pg_dsn, schema) as mem:
        with pytest.raises(StoreCorruptedError, match="of user 'ana' \\(table memories\\)"):
            mem.retrieve("ana", "lighthouse painting", k=5)


def test_postgres_schema_from_before_checksums_is_upgraded_and_filled(pg_dsn) -> None:
    schema = pg_schema()
    with _pg_mem(pg_dsn, schema) as mem:
        _fill(mem)
    s = f'"{schema}"'
    _sql(
        pg_dsn,
        f"ALTER TABLE {s}.turns DROP COLUMN text_crc",
        f"ALTER TABLE {s}.memories DROP COLUMN text_crc, DROP COLUMN key_crc",
        f"UPDATE {s}.schema_info SET level = 2",
    )
    with _pg_mem(pg_dsn, schema) as mem:
        assert TEXT in _texts(mem)
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT level FROM {s}.schema_info").fetchone() == (3,)
        assert (
            conn.execute(f"SELECT COUNT(*) FROM {s}.turns WHERE text_crc IS NULL").fetchone()[0]
            == 0
        )
        assert (
            conn.execute(
                f"SELECT COUNT(*) FROM {s}.memories WHERE text_crc IS NULL OR key_crc IS NULL"
            ).fetchone()[0]
            == 0
        )
    _sql(pg_dsn, f"UPDATE {s}.turns SET text = replace(text, 'lighthouse', 'lighvhouse')")
    with _pg_mem(pg_dsn, schema) as mem:
        with pytest.raises(StoreCorruptedError, match="turn 't-1'"):
            mem.turns("ana", "s1")
