"""Conversation starts in a log without session ids or times (`sessions.starts`), fake embedder.

A model document with one weight (how far the similarity across a gap dips below the log's
mean) stands in for the fitted one, so what is found is known: three topics of 16 turns each
dip at turns 16 and 32.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.portable import export_memory, import_memory
from reflective_memory.retrieval.features import FEATURES as FEATURES_RANKER
from reflective_memory.retrieval.turn_votes import conversation_spans
from reflective_memory.retrieval.units import CONVERSATION_STARTS
from reflective_memory.sessions.starts import (
    FEATURES,
    ConversationStarts,
    gap_rows,
    load_starts,
)
from reflective_memory.types import SessionTurns, Turn

TOPICS = (
    ("bread", "dough", "oven", "flour", "yeast", "knead"),
    ("train", "ticket", "station", "platform", "rome", "travel"),
    ("salary", "manager", "office", "contract", "interview", "promotion"),
)


def log_texts() -> list[str]:
    """Three conversations of 16 turns, each on its own words."""
    return [" ".join(w[(i + j) % 6] for j in range(3)) for w in TOPICS for i in range(16)]


def dip_model(**changes: object) -> dict:
    """p >= 0.9 where the 3-turn cross similarity dips 3.1 deviations below the log's mean."""
    coef = [2.0 if f == "dip3" else 0.0 for f in FEATURES]
    body = {
        "mean": [0.0] * len(FEATURES),
        "scale": [1.0] * len(FEATURES),
        "coef": coef,
        "intercept": -4.0,
        "threshold": 0.9,
        "min_turns": 40,
        "fitted": {"data": ["a test"]},
    }
    return ConversationStarts.document({**body, **changes})


def model_file(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "starts.json"
    ConversationStarts.write(dip_model(**changes), path)
    return path


def log_turns(times: list[datetime | None] | None = None) -> list[Turn]:
    texts = log_texts()
    times = times or [None] * len(texts)
    return [
        Turn("u", "log", "user" if i % 2 == 0 else "assistant", t, f"t{i}", i, times[i])
        for i, t in enumerate(texts)
    ]


def vectors(turns: list[Turn]) -> np.ndarray:
    return np.asarray(HashingEmbedder().encode([t.text for t in turns]))


def test_gap_rows_hold_one_row_per_gap() -> None:
    turns = log_turns()
    rows = gap_rows(vectors(turns), turns)
    assert rows.shape == (len(turns) - 1, len(FEATURES))
    assert np.all(np.isfinite(rows))
    assert gap_rows(vectors(turns[:1]), turns[:1]).shape == (0, len(FEATURES))
    same = FEATURES.index("same_role")
    assert set(rows[:, same]) == {0.0}  # user and assistant take turns


def test_starts_are_found_only_in_a_long_session_its_log_gave_no_times() -> None:
    model = ConversationStarts(dip_model())
    turns = log_turns()
    assert model.find(turns, vectors(turns)) == [16, 32]
    one = datetime(2024, 3, 1, tzinfo=timezone.utc)
    same_time = log_turns([one] * 48)
    assert model.find(same_time, vectors(same_time)) == [16, 32]  # when stored: not known
    stored = one + timedelta(seconds=2)  # the clock's time when it was stored: no times given
    assert model.find(same_time, vectors(same_time), stored) == [16, 32]
    later = one + timedelta(days=30)  # a log dated 1 March, stored later: one day's talk
    assert model.find(same_time, vectors(same_time), later) == []
    timed = log_turns([one + timedelta(minutes=i) for i in range(48)])
    assert model.find(timed, vectors(timed)) == []  # times tell the conversations apart
    short = turns[:39]
    assert model.find(short, vectors(short)) == []  # under min_turns
    assert model.find(turns, None) == []


def test_a_conversation_spans_from_each_start() -> None:
    turns = log_turns()
    spans = conversation_spans(SessionTurns(turns, [32, 16, 0, 99]))
    assert spans[0] == (0, 15) and spans[16] == (16, 31) and spans[47] == (32, 47)
    assert conversation_spans(turns)[47] == (0, 47)  # plain turns: one conversation


def test_the_bundled_model_loads_with_its_documented_settings() -> None:
    model = load_starts("learned")
    assert model is not None
    assert (model.threshold, model.min_turns) == (0.9, 40)
    assert MemoryConfig().sessions.conversation_starts == "learned"
    assert load_starts("off") is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(coef=d["coef"][:-1]), "checksum"),  # edited by hand
        (lambda d: d.update(sha256="0" * 64), "checksum"),
    ],
)
def test_an_edited_model_file_is_refused(tmp_path: Path, edit, message: str) -> None:
    path = model_file(tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message):
        load_starts(str(path))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"coef": [1.0]}, "weights do not match"),
        ({"threshold": 1.5}, "out of range"),
        ({"features": ["cos_prev"]}, "features"),
    ],
)
def test_a_model_of_other_features_or_settings_is_refused(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ConversationStarts({**dip_model(), **changes})


def test_bad_settings_fail_before_any_file_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="conversation_starts"):
        MemoryConfig(sessions={"conversation_starts": ""})
    where = tmp_path / "store"
    config = MemoryConfig(sessions={"conversation_starts": str(tmp_path / "missing.json")})
    with pytest.raises(ConfigError, match="missing.json"):
        ReflectiveMemory(where, embedder=HashingEmbedder(), config=config)
    assert not where.exists()


def _log_memory(path: Path | None, model: Path) -> ReflectiveMemory:
    config = MemoryConfig(sessions={"conversation_starts": str(model)})
    return ReflectiveMemory(path, embedder=HashingEmbedder(), config=config)


def _marks(mem: ReflectiveMemory) -> dict[str, list[int]]:
    return {
        m.id: m.metadata[CONVERSATION_STARTS]
        for m in mem.memories("u")
        if CONVERSATION_STARTS in m.metadata
    }


def positions(mem: ReflectiveMemory, question: str) -> dict[int, float]:
    """The ranker's `position` feature of each voted turn of the second topic."""
    r = mem.retriever
    req = r.request("u", question, None, 1000, None, None, None, None, None, None)
    feats = r.state(req).features
    col = FEATURES_RANKER.index("position")
    return {
        p: round(float(row[col]), 6)
        for (_, p), row in zip(feats.keys, feats.matrix, strict=True)
        if 16 <= p < 32
    }


def test_an_imported_log_keeps_its_starts_with_its_memories(tmp_path: Path) -> None:
    model = model_file(tmp_path)
    texts = log_texts()
    roles = ("user", "assistant")
    log = [
        {"user_id": "u", "session_id": "log", "role": roles[i % 2], "text": t}
        for i, t in enumerate(texts)
    ]
    with _log_memory(tmp_path / "a", model) as mem:
        mem.add_turns(log)  # one call, no times: every turn takes one time
        mem.end_session("u", "log")
        marks = _marks(mem)
        first = mem.turns("u", "log")[0].turn_id
        assert marks and all(v == [16, 32] for v in marks.values())
        assert all(first in m.turn_ids for m in mem.memories("u") if m.id in marks)
        # the ranker reads the session as three conversations: where a turn sits in its own
        got = positions(mem, "train ticket station platform rome travel")
        assert len(got) >= 4 and got == {p: round((p - 16) / 15, 6) for p in got}
        export_memory(mem, tmp_path / "export.jsonl")
        # a timed session of the same turns holds no marks, nor one dated once by its log
        mem.add_turns(
            [
                {**t, "session_id": "timed", "timestamp": f"2024-03-01T10:{i:02d}:00"}
                for i, t in enumerate(log)
            ]
            + [{**t, "session_id": "dated", "timestamp": "2024-03-02"} for t in log]
        )
        mem.end_session("u", "timed")
        mem.end_session("u", "dated")
        assert all(m.session_id == "log" for m in mem.memories("u") if m.id in _marks(mem))
        mem.delete_session("u", "log")
        assert _marks(mem) == {}
    with _log_memory(tmp_path / "b", model) as mem:
        import_memory(mem, tmp_path / "export.jsonl")
        assert _marks(mem) == marks


def test_starts_off_marks_nothing(tmp_path: Path) -> None:
    config = MemoryConfig(sessions={"conversation_starts": "off"})
    with ReflectiveMemory(None, embedder=HashingEmbedder(), config=config) as mem:
        mem.add_turns(
            [{"user_id": "u", "session_id": "log", "role": "user", "text": t} for t in log_texts()]
        )
        mem.end_session("u", "log")
        assert _marks(mem) == {}


def test_the_starts_are_stored_and_read_on_postgres(tmp_path: Path, pg_dsn: str) -> None:
    """The same promise on the server backend: marks stored, read back, gone with the session."""
    from pg_cluster import pg_schema
    from reflective_memory.storage.postgres import PostgresStore

    config = MemoryConfig(sessions={"conversation_starts": str(model_file(tmp_path))})
    store = PostgresStore(pg_dsn, schema=pg_schema())
    with ReflectiveMemory(store=store, embedder=HashingEmbedder(), config=config) as mem:
        roles = ("user", "assistant")
        mem.add_turns(
            [
                {"user_id": "u", "session_id": "log", "role": roles[i % 2], "text": t}
                for i, t in enumerate(log_texts())
            ]
        )
        mem.end_session("u", "log")
        assert set(map(tuple, _marks(mem).values())) == {(16, 32)}
        got = positions(mem, "train ticket station platform rome travel")
        assert len(got) >= 4 and got == {p: round((p - 16) / 15, 6) for p in got}
        mem.delete_session("u", "log")
        assert _marks(mem) == {}


def test_a_session_rebuilt_without_starts_is_read_as_one_conversation(tmp_path: Path) -> None:
    """The marks follow the session's memories from one build to the next, as queries see them."""
    roles = ("user", "assistant")
    log = [
        {"user_id": "u", "session_id": "log", "role": roles[i % 2], "text": t}
        for i, t in enumerate(log_texts())
    ]
    with _log_memory(None, model_file(tmp_path)) as mem:
        mem.add_turns(log)
        mem.end_session("u", "log")
        question = "train ticket station platform rome travel"
        assert positions(mem, question)[20] == round(4 / 15, 6)
        # a turn with a time of its own, a day later: times now divide the session
        mem.add_turn("u", "log", "user", "bread oven flour", timestamp="2030-01-01T10:00:00")
        mem.end_session("u", "log")
        assert _marks(mem) == {}
        assert positions(mem, question)[20] == round(20 / 47, 6)
