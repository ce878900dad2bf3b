"""Standing reliability suite: thread soak, two-process soak and SIGKILL loop (bounded).

Each runs the same function as `reflective-memory bench soak` for a few seconds and requires a
clean audit: no acknowledged turn lost, no turn of an ended session left out of its memories, no
ended session without its memories, no cross-user hit, no worker error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reflective_bench.soak import kill_loop, process_soak, thread_soak

pytestmark = pytest.mark.reliability


def _clean(report: dict) -> None:
    assert report["acknowledged"] > 0
    for key in ("lost", "stranded", "incomplete", "leaks", "errors"):
        assert report[key] == 0, (key, report)


def test_eight_threads_soak(tmp_path: Path) -> None:
    report = thread_soak(tmp_path / "db", 12, threads=8, users=3)
    _clean(report)
    assert report["ends"] > 0 and report["retrieves"] > 0 and report["ended_sessions"] > 0


def test_two_process_soak(tmp_path: Path) -> None:
    report = process_soak(tmp_path / "db", 12, processes=2)
    _clean(report)
    assert report["ends"] > 0 and report["retrieves"] > 0


def test_sigkill_loop(tmp_path: Path) -> None:
    report = kill_loop(tmp_path / "db", 20, seed=7)
    assert report["kills"] == 20
    _clean(report)
