"""Feedback on a retrieval that shows what was erased since is refused quietly, not as a crash."""

from __future__ import annotations

import logging

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

from langchain_reflective._common import send_feedback


def test_feedback_on_an_erased_recall_logs_a_warning_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(), config=config) as mem:
        mem.add_turn("ana", "s1", "user", "I live in Lyon, near the old town.")
        mem.add_turn("ana", "s1", "assistant", "Lyon is a lovely city.")
        mem.end_session("ana", "s1")
        shown = mem.retrieve("ana", "Where do I live?", k=2)
        assert shown.hits
        mem.delete_session("ana", "s1")
        with caplog.at_level(logging.WARNING, logger="langchain_reflective"):
            assert send_feedback(mem, shown, "You live in Lyon [0].") is None
        (record,) = [r for r in caplog.records if "feedback not taken" in r.getMessage()]
        assert record.levelno == logging.WARNING and record.exc_info is None
        assert "erased" in record.getMessage()
        assert mem.ranker_weights("ana")["episodes"] == 0  # nothing was learned
