"""OpenTelemetry traces (`reflective_memory.tracing`), collected by the SDK's in-memory exporter.

One `retrieve` is a span with one child per pipeline stage; writes, session ends, feedback and
LLM calls are spans with counts, paths and token usage; no span carries user text or a raw user
or session id; and without OpenTelemetry (or without a provider) nothing of it is imported.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes import Scripted
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory, tracing
from reflective_memory.errors import InvalidInputError, LLMError
from reflective_memory.llm import LLMClient

from tests.conftest import assert_no_text

pytest.importorskip("opentelemetry.sdk")

ROOT = Path(__file__).resolve().parents[1]
USER = "ana.lopez@example.org"
SESSION = "trip-to-lisbon-2024"
TURNS = [
    "My beagle Pixel chewed my favourite sneakers yesterday.",
    "Oh no! Beagles love to chew; a chew toy might help.",
    "I booked a flight to Lisbon for the second week of May.",
    "Lisbon in May is lovely; pack light layers.",
]
QUERY = "What did my dog destroy?"
ANSWER = "Your beagle Pixel chewed your sneakers. [0]"
#: Words of the conversation a leak would show (none is one of the library's own words).
WORDS = ("Pixel", "beagle", "sneakers", "Lisbon", "destroy")


def _memory(**kw: Any) -> ReflectiveMemory:
    return ReflectiveMemory(embedder=HashingEmbedder(dim=128), **kw)


def _write(mem: ReflectiveMemory, user: str = USER, session: str = SESSION) -> None:
    mem.add_turns(
        [
            {"user_id": user, "session_id": session, "role": ("user", "assistant")[i % 2],
             "text": text, "timestamp": f"2024-04-0{i + 1}T10:00:00"}
            for i, text in enumerate(TURNS)
        ]
    )  # fmt: skip
    mem.end_session(user, session)


def _by_name(finished: Any, name: str) -> list[Any]:
    return [s for s in finished if s.name == name]


def _children(finished: Any, parent: Any) -> list[Any]:
    return [
        s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def test_one_retrieve_is_a_span_with_one_child_per_stage(spans: Any) -> None:
    with _memory() as mem:
        _write(mem)
        spans.clear()
        r = mem.retrieve(USER, QUERY, k=3)
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.parent is None]
    assert root.name == tracing.RETRIEVAL_SPAN == "retrieval reflective_memory"
    timings = r.diagnostics["timings_ms"]
    children = _children(finished, root)
    assert sorted(c.name for c in children) == sorted(set(timings) - {"total"})
    assert len(finished) == len(children) + 1  # the stages call nothing traced
    stages = [c for c in children if c.name != "index"]
    for child in stages:  # each stage's time is the one in the diagnostics
        assert child.attributes["reflective_memory.stage"] == child.name
        assert child.attributes["reflective_memory.duration_ms"] == timings[child.name]
        assert child.attributes["reflective_memory.stage.widened"] == 0
        assert child.start_time >= root.start_time and child.end_time <= root.end_time
    assert [c.name for c in sorted(children, key=lambda c: c.start_time)][:3] == [
        "index",
        "cues",
        "embed",
    ]
    a = root.attributes
    assert a["gen_ai.operation.name"] == "retrieval" and a["gen_ai.request.top_k"] == 3
    assert a["enduser.pseudo.id"] == tracing.pseudonym(USER)
    assert a["reflective_memory.path"] == r.diagnostics["path"]
    assert a["reflective_memory.hits"] == len(r.hits) > 0
    assert a["reflective_memory.retrieval.id"] == r.retrieval_id
    assert a["reflective_memory.candidates.dense"] == r.diagnostics["candidates"]["dense"]
    assert a["reflective_memory.retrieval.passages.turns_packed"] > 0
    assert a["reflective_memory.duration_ms"] == timings["total"]
    assert_no_text(finished, QUERY, USER, SESSION, *TURNS, *WORDS)


def test_a_widened_pipeline_runs_the_repeating_stages_again_as_spans(spans: Any) -> None:
    cfg = MemoryConfig(search={"candidate_k": 1}, rerank={"top_k": 1})
    with _memory(config=cfg) as mem:
        _write(mem)
        spans.clear()
        mem.retrieve(USER, QUERY, k=4)
    stages = [s for s in spans.get_finished_spans() if "reflective_memory.stage" in s.attributes]
    widened = {s.attributes["reflective_memory.stage.widened"] for s in stages}
    assert widened == set(range(max(widened) + 1)) and max(widened) >= 1
    per_round = [s.attributes["reflective_memory.candidates.per_ranker"] for s in stages]
    assert per_round == sorted(per_round)  # the pool only grows


def test_writes_session_ends_feedback_and_llm_calls_are_spans_without_user_text(
    spans: Any,
) -> None:
    llm = Scripted("no segmentation here")  # the LLM segmenter falls back offline
    with _memory(llm=llm) as mem:
        _write(mem)
        mem.add_turn(USER, "next-session", "user", "Pixel is fine now.")
        r = mem.retrieve(USER, QUERY, k=3)
        fb = mem.feedback(r, ANSWER)
    finished = spans.get_finished_spans()
    write, later = _by_name(finished, "add_turns")
    assert write.attributes["reflective_memory.turns"] == len(TURNS)
    assert write.attributes["reflective_memory.sessions"] == 1
    assert write.attributes["gen_ai.conversation.id"] == tracing.pseudonym(USER, SESSION)
    assert later.attributes["reflective_memory.turns"] == 1
    (end,) = _by_name(finished, "end_session")
    assert end.parent is None and end.attributes["reflective_memory.path"] == "built"
    assert end.attributes["enduser.pseudo.id"] == tracing.pseudonym(USER)
    assert end.attributes["gen_ai.conversation.id"] == tracing.pseudonym(USER, SESSION)
    assert end.attributes["reflective_memory.turns"] == len(TURNS)
    kinds = {k: v for k, v in end.attributes.items() if k.startswith("reflective_memory.memories.")}
    assert kinds["reflective_memory.memories.turn"] == len(TURNS)
    assert sum(kinds.values()) == end.attributes["reflective_memory.memories"]
    calls = _by_name(finished, "text_completion")
    assert len(calls) == len(llm.prompts) >= 1  # the segmenter's, inside end_session
    for call in calls:
        assert call.parent.span_id == end.context.span_id
        assert call.attributes["gen_ai.operation.name"] == "text_completion"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0
        assert call.attributes["gen_ai.usage.output_tokens"] == 3
    (feedback,) = _by_name(finished, "feedback")
    assert feedback.attributes["reflective_memory.feedback.cited"] == len(fb.cited) == 1
    assert feedback.attributes["reflective_memory.feedback.learned"] == fb.learned
    assert feedback.attributes["reflective_memory.retrieval.id"] == r.retrieval_id
    assert feedback.attributes["enduser.pseudo.id"] == tracing.pseudonym(USER)
    assert_no_text(
        finished, QUERY, ANSWER, USER, SESSION, "next-session", *TURNS, *WORDS, *llm.prompts
    )


def test_a_session_a_rule_ends_inside_a_write_is_a_child_span_of_the_write(spans: Any) -> None:
    with _memory(config=MemoryConfig(sessions={"max_turns": 2})) as mem:
        mem.add_turns(
            [{"user_id": USER, "session_id": SESSION, "role": "user", "text": t} for t in TURNS[:2]]
        )
    finished = spans.get_finished_spans()
    (write,) = _by_name(finished, "add_turns")
    (end,) = _by_name(finished, "end_session")
    assert end.parent.span_id == write.context.span_id
    assert end.attributes["reflective_memory.turns"] == 2


def test_self_reflection_calls_the_llm_inside_the_retrieve_span(spans: Any) -> None:
    llm = Scripted("ENOUGH\n[0] Pixel")
    cfg = MemoryConfig(conditional={"self_reflection": True}, segment={"kind": "embedding"})
    with _memory(llm=llm, config=cfg) as mem:
        _write(mem)
        spans.clear()
        r = mem.retrieve(USER, QUERY, k=3)
    finished = spans.get_finished_spans()
    (root,) = _by_name(finished, tracing.RETRIEVAL_SPAN)
    (call,) = _by_name(finished, "text_completion")
    assert call.parent.span_id == root.context.span_id
    assert root.attributes["reflective_memory.reflection.stopped"] == "enough"
    assert root.attributes["reflective_memory.llm_calls"] == r.usage.llm_calls == 1
    assert root.attributes["gen_ai.usage.input_tokens"] == r.usage.prompt_tokens
    assert root.attributes["gen_ai.usage.output_tokens"] == r.usage.completion_tokens
    assert_no_text(finished, QUERY, USER, *TURNS, *WORDS, *llm.prompts)


class _Named:
    """An LLM that names its model and reports its usage, as the framework adapters do."""

    model_name = "tiny-chat-1"
    last_usage = {"prompt_tokens": 11, "completion_tokens": 7}

    def complete(self, prompt: str) -> str:
        return "Pixel"


def test_an_llm_call_reports_its_model_and_usage_and_a_failure_only_its_type(spans: Any) -> None:
    client = LLMClient(_Named())
    assert client.complete("Who chewed the sneakers?") == "Pixel"
    assert asyncio.run(client.acomplete("Who chewed the sneakers?")) == "Pixel"
    failing = LLMClient(Scripted(TimeoutError("no answer to 'Who chewed the sneakers?'")))
    with pytest.raises(LLMError):
        failing.complete("Who chewed the sneakers?")
    ok, aok, failed = spans.get_finished_spans()
    for span in (ok, aok):
        assert span.name == "text_completion tiny-chat-1"
        assert span.kind.name == "CLIENT"
        assert span.attributes["gen_ai.request.model"] == "tiny-chat-1"
        assert span.attributes["gen_ai.usage.input_tokens"] == 11
        assert span.attributes["gen_ai.usage.output_tokens"] == 7
    assert failed.name == "text_completion" and failed.status.status_code.name == "ERROR"
    assert failed.attributes["error.type"] == "reflective_memory.errors.LLMError"
    assert failed.attributes["reflective_memory.error.cause"] == "TimeoutError"
    assert client.usage.prompt_tokens == 22
    assert_no_text([ok, aok, failed], "sneakers", "Pixel")


def test_a_refused_call_is_an_error_span_without_the_message(spans: Any) -> None:
    with _memory() as mem:
        _write(mem)
        spans.clear()
        with pytest.raises(InvalidInputError, match="Lisbon-mode"):
            mem.retrieve(USER, QUERY, mode="Lisbon-mode")
        with pytest.raises(InvalidInputError):
            mem.retrieve(7, QUERY)  # type: ignore[arg-type]  # refused by the call, not the span
    root, _ = spans.get_finished_spans()
    assert root.attributes["error.type"] == "reflective_memory.errors.InvalidInputError"
    assert root.status.status_code.name == "ERROR"
    assert_no_text([root], "Lisbon", USER)


def test_pseudonyms_are_an_hmac_under_the_configured_key() -> None:
    try:
        tracing.set_hash_key("fleet-secret")
        expected = hmac.new(b"fleet-secret", USER.encode(), hashlib.sha256).hexdigest()[:32]
        assert tracing.pseudonym(USER) == expected
        assert tracing.pseudonym(USER, SESSION) != tracing.pseudonym(USER, "other")
        tracing.set_hash_key(b"another-secret")
        assert tracing.pseudonym(USER) != expected
    finally:
        tracing.set_hash_key(None)


def test_nothing_is_traced_without_a_provider(spans: Any) -> None:
    tracing.set_tracer_provider(None)  # the global provider is still the API's proxy
    assert tracing.tracer() is None
    with _memory() as mem:
        _write(mem)
        assert mem.retrieve(USER, QUERY, k=3).hits
    assert spans.get_finished_spans() == ()


def _run(code: str, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter on this checkout; its last stdout line as JSON."""
    path = os.pathsep.join([str(ROOT / "shared"), str(ROOT), str(ROOT / "tests")])
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


_WORKLOAD = """
import json, sys
from reflective_memory import HashingEmbedder, ReflectiveMemory, tracing
with ReflectiveMemory(embedder=HashingEmbedder(dim=64), llm=lambda p: "no") as mem:
    for i, text in enumerate(["My dog Pixel loves the beach.", "Nice!", "He swims.", "Wow."]):
        mem.add_turn("ana", "s1", ("user", "assistant")[i % 2], text)
    mem.end_session("ana", "s1")
    mem.feedback(mem.retrieve("ana", "dog?", k=2), "[0]")
"""


def test_without_opentelemetry_nothing_of_it_is_imported() -> None:
    got = _run(
        _WORKLOAD + "print(json.dumps(sorted(m for m in sys.modules if 'opentelemetry' in m)))"
    )
    assert got == []
    absent = "import sys\nsys.modules['opentelemetry'] = None  # as if not installed\n"
    assert _run(absent + _WORKLOAD + "print(json.dumps(tracing.tracer() is None))")


def test_with_the_api_but_no_provider_nothing_is_traced_and_nothing_more_imported() -> None:
    code = (
        "import opentelemetry.trace, sys\n"
        "before = set(sys.modules)\n"
        + _WORKLOAD
        + "print(json.dumps([tracing.tracer() is None, sorted(set(sys.modules) - before)]))"
    )
    off, imported = _run(code)
    assert off and not [m for m in imported if "opentelemetry" in m]


def test_a_global_provider_set_by_the_application_is_used() -> None:
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "from reflective_memory import tracing\n"
        "assert tracing.tracer() is None  # asked before the application sets its provider\n"
        "trace.set_tracer_provider(provider)\n"
        "assert tracing.tracer() is not None\n"
        + _WORKLOAD
        + "print(json.dumps([s.name for s in exporter.get_finished_spans()]))"
    )
    names = _run(code)
    for name in ("add_turns", "end_session", "text_completion", tracing.RETRIEVAL_SPAN, "feedback"):
        assert name in names


def test_a_provider_the_environment_names_is_used() -> None:
    code = (
        "import json, opentelemetry.trace\n"
        "from reflective_memory import tracing\n"
        "print(json.dumps(type(tracing.tracer()).__module__))"
    )
    assert _run(code, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider").startswith(
        "opentelemetry.sdk"
    )


def test_a_span_that_cannot_be_described_never_fails_the_call(
    spans: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(out: Any) -> dict[str, Any]:
        raise KeyError("path")

    monkeypatch.setattr(tracing, "retrieval_attributes", broken)
    with _memory() as mem:
        _write(mem)
        assert mem.retrieve(USER, QUERY, k=3).hits
    (root,) = _by_name(spans.get_finished_spans(), tracing.RETRIEVAL_SPAN)
    assert root.status.status_code.name == "UNSET"
    assert "could not describe the span" in caplog.text
