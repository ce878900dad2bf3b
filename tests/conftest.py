"""Shared fixtures: a deterministic fake embedder, in-memory and on-disk memories, dev data."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pg_cluster as _pg
import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(dim=128)


#: Turn units ranked as units (the engine's unit-level behaviour; passages are tested in
#: tests/test_passages.py).
UNIT_CONFIG = {"units": {"granularities": ("turn",)}, "passages": {"enabled": False}}


@pytest.fixture
def mem(embedder: HashingEmbedder) -> Iterator[ReflectiveMemory]:
    with ReflectiveMemory(embedder=embedder, config=MemoryConfig(**UNIT_CONFIG)) as m:
        yield m


@pytest.fixture
def disk_mem(tmp_path: Path, embedder: HashingEmbedder) -> Iterator[ReflectiveMemory]:
    with ReflectiveMemory(
        tmp_path / "store", embedder=embedder, config=MemoryConfig(**UNIT_CONFIG)
    ) as m:
        yield m


@pytest.fixture
def gate_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fitted-gate file of the test's own (`recall.GATE_CALIBRATION_FILE`), not yet written."""
    import reflective_memory.recall.calibration as calibration

    path = tmp_path / "gate_calibration.json"
    monkeypatch.setattr(calibration, "GATE_CALIBRATION_FILE", path)
    yield path
    calibration._read.cache_clear()


@pytest.fixture
def dev_data() -> Path:
    """The team's development data beside the repository (tests skip without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


def add_session(
    mem: ReflectiveMemory, user: str, session: str, texts: list[str], *, end: bool = True
) -> None:
    """Add alternating user/assistant turns and optionally end the session."""
    for i, text in enumerate(texts):
        mem.add_turn(user, session, "user" if i % 2 == 0 else "assistant", text)
    if end:
        mem.end_session(user, session)


# -- PostgreSQL: one throwaway cluster per test session, one fresh database per test module ---
def _postgres_unavailable(reason: str) -> None:
    if os.environ.get("REFLECTIVE_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"REFLECTIVE_REQUIRE_POSTGRES=1 but PostgreSQL is unusable: {reason}")
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[_pg.Cluster]:
    """A PostgreSQL + pgvector cluster started for this test session (skips if unavailable)."""
    reason = _pg.missing_reason()
    if reason is not None:
        _postgres_unavailable(reason)
    cluster = _pg.Cluster()
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001 - reported as the skip / failure reason
        cluster.stop()
        _postgres_unavailable(f"could not start a cluster: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def pg_dsn(pg_cluster: _pg.Cluster, request: pytest.FixtureRequest) -> str:
    """DSN of a fresh database for this test module."""
    return pg_cluster.create_database(_module_database(request))


def _module_database(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.rsplit(".", 1)[-1].lower())
    return f"{base[:40]}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def pg_pair() -> Iterator[tuple[_pg.Cluster, _pg.Cluster]]:
    """A primary and its hot standby (`pg_basebackup -R`, asynchronous streaming replication).

    Their own clusters, not the session's: the replica tests stop, pause and lag the standby,
    and the other tests' writes are not streamed anywhere. Made on first use (about 4 s).
    """
    reason = _pg.missing_reason()
    if reason is not None:
        _postgres_unavailable(reason)
    primary = _pg.Cluster()
    try:
        primary.start()
        standby = primary.standby()
    except Exception as exc:  # noqa: BLE001 - reported as the skip / failure reason
        primary.stop()
        _postgres_unavailable(f"could not start a primary and its standby: {exc}")
    yield primary, standby
    standby.stop()
    primary.stop()


@pytest.fixture(scope="module")
def pg_replicated(
    pg_pair: tuple[_pg.Cluster, _pg.Cluster], request: pytest.FixtureRequest
) -> tuple[str, str]:
    """`(primary DSN, replica DSN)` of a fresh database for this module, on `pg_pair`.

    Returned once the standby has the database, so a store opened on it reads there at once.
    """
    primary, standby = pg_pair
    name = _module_database(request)
    dsn = primary.create_database(name)
    standby.wait_caught_up(primary)
    return dsn, standby.dsn_for(name)


@pytest.fixture
def cooked() -> Iterator[ReflectiveMemory]:
    """What "ana" cooked (`testing.surfaces.COOKING`), one dated session each, turn units only.

    Asked on 20 April 2025, "what did I cook two weeks ago?" is the curry; at the newest turn
    (4 May, the default `now`), the soup.
    """
    from reflective_memory.testing.surfaces import COOKING

    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(128), config=cfg) as m:
        for i, (when, text, _) in enumerate(COOKING):
            m.add_turn("ana", f"s{i}", "user", text, timestamp=when)
        m.end_session("ana", f"s{len(COOKING) - 1}")
        yield m


class WallClock:
    """A wall clock a test moves by hand (`advance`); starts at the real time."""

    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        """Move the clock on (`timedelta` keywords) and return the new time."""
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> WallClock:
    """The wall clock of the core's writes and of the SQLite store, moved by the test."""
    import reflective_memory.sessions.writer as writer
    import reflective_memory.storage.sqlite as sqlite

    clock = WallClock()
    monkeypatch.setattr(writer, "received_time", clock)
    monkeypatch.setattr(sqlite, "_now", clock)
    return clock


# -- OpenTelemetry: the library's spans, collected in memory ------------------------------------
@pytest.fixture
def spans() -> Iterator[Any]:
    """An `InMemorySpanExporter` receiving this test's spans (the SDK's own, no fake).

    The provider is given to `reflective_memory.tracing` (not set globally, which OpenTelemetry
    allows once per process) and taken back after the test.
    """
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from reflective_memory import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def span_texts(finished: Any) -> list[str]:
    """Every string a list of finished spans carries: names, attributes, events, statuses."""
    out: list[str] = []
    for s in finished:
        out += [s.name, s.status.description or ""]
        for attrs in [s.attributes, s.resource.attributes] + [e.attributes for e in s.events]:
            for key, value in (attrs or {}).items():
                values = value if isinstance(value, (list, tuple)) else [value]
                out += [key, *(str(v) for v in values)]
    return out


def assert_no_text(finished: Any, *texts: str) -> None:
    """No span names, holds or hides (as an attribute, event or status) any of `texts`."""
    carried = span_texts(finished)
    assert finished, "no spans to check"
    for text in texts:
        leaks = [c for c in carried if text in c]
        assert not leaks, f"{text!r} in span data: {leaks}"
