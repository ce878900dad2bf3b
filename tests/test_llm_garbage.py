"""A corpus of malformed LLM behaviour: every LLM-backed step survives it and falls back offline.

Each case is the LLM's answer to *every* prompt of an `end_session` that uses the LLM segmenter,
conditional notes and RMM prospective reflection, then of a self-reflective `retrieve`. The
session must still end with every turn in exactly one segment, every user turn decided, the
memories stored as valid text and retrieval working.
"""

from __future__ import annotations

import json
import time

import pytest
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory


class Boom(Exception):
    pass


class Weird:
    def __str__(self) -> str:
        return "<segmentation>{'start': 0, 'end': 99}</segmentation>"


class Sleep:
    """Hangs far beyond the configured timeout."""


class HasText:
    text = '{"turn": 1, "keep": true, "knowledge": "The user likes tea."}'


CORPUS: list[object] = [
    "",
    "   \n\t ",
    "NO_TRAIT",
    "I cannot help with that.",
    "<segmentation>",
    "</segmentation>",
    "<segmentation></segmentation>",
    "<segmentation>{}</segmentation>",
    '<segmentation>{"start_exchange_number": 5, "end_exchange_number": 2}</segmentation>',
    '<segmentation>{"start_exchange_number": -3, "end_exchange_number": 10**9}</segmentation>',
    '<segmentation>{"start_exchange_number": "²", "end_exchange_number": "٣"}</segmentation>',
    '<segmentation>{"start_exchange_number": 1e308, "end_exchange_number": NaN}</segmentation>',
    '{"start_exchange_number": 99999999999999999999999, "end_exchange_number": 0}',
    "{" * 5000,
    "}" * 5000 + "{" * 5000,
    "[" * 3000 + "]" * 3000,
    '{"extracted_memories": "not a list"}',
    '{"extracted_memories": [{"summary": null, "reference": "x"}]}',
    '{"extracted_memories": [{"summary": "The user is \ud800 broken.", "reference": [0]}]}',
    '{"extracted_memories": [{"summary": "' + "A" * 50_000 + '", "reference": [0, -1, 99]}]}',
    '{"extracted_memories": [{"summary": 42, "reference": [true, false]}]}',
    "Merge(7, )",
    "Merge(-1, The user likes tea.)",
    "Merge(²,x)",
    "Add(Add(Add(",
    '{"turn": "²", "keep": true, "knowledge": "x"}',
    '{"turn": 1, "keep": "maybe", "knowledge": ["a"]}',
    '{"turn": 1, "keep": true, "knowledge": "", "related": ["²", -5, 10**99]}',
    '{"turn": 1, "keep": true, "knowledge": "ok", "related": "1,2,3"}',
    '{"turn": 1.5, "keep": true}\n{"turn": null}\n{"turn": [1]}',
    '{"turn": 1, "keep": true, "knowledge": "\\u0000\\u0001 control"}',
    '```json\n{"turn": 1, "keep": true, "knowledge": "fenced"}\n```',
    "<segmentation>\n{'segment_id': 0, 'start_exchange_number': 0,}\n",
    "x" * 3_000_000,
    "\ud800\udfff\ud83d lone surrogates",
    None,
    b"bytes reply",
    12345,
    Weird(),
    HasText(),
    Boom("the LLM exploded"),
    RecursionError("deep"),
    MemoryError("out of memory in the client"),
    Sleep(),
]


class Answer:
    def __init__(self, reply: object) -> None:
        self.reply = reply
        self.calls = 0

    def __call__(self, prompt: str) -> object:
        self.calls += 1
        if isinstance(self.reply, BaseException):
            raise self.reply
        if isinstance(self.reply, Sleep):
            time.sleep(30)
            return "too late"
        return self.reply


TURNS = [
    ("user", "I adopted a greyhound named Pixel last month."),
    ("assistant", "Congratulations! How is Pixel settling in?"),
    ("user", "Great. Please always answer me in short bullet points."),
    ("assistant", "Noted."),
    ("user", "Also, what is a good route for a 10 km run in Lisbon?"),
    ("assistant", "Try the riverside path from Belem."),
]


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30


@pytest.mark.parametrize("reply", CORPUS, ids=[f"case{i}" for i in range(len(CORPUS))])
def test_malformed_llm_output_never_breaks_a_session(reply: object) -> None:
    cfg = MemoryConfig(
        units={"granularities": ("segment", "turn")},
        segment={"kind": "llm"},
        conditional={"notes": True, "self_reflection": True},
        topics={"enabled": True},
        denoise={"kind": "none"},
        rerank={"enabled": False},
        llm={"max_chars": 100_000, "timeout_s": 0.5},
    )
    llm = Answer(reply)
    with ReflectiveMemory(embedder=HashingEmbedder(64), llm=llm, config=cfg) as mem:
        for role, text in TURNS:
            mem.add_turn("u", "s", role, text)
        built = mem.end_session("u", "s")
        assert llm.calls >= 2 and mem.open_sessions("u") == []
        segments = [m for m in built if m.granularity == "segment"]
        covered = [tid for m in segments for tid in m.turn_ids]
        assert sorted(covered) == sorted(t.turn_id for t in mem.turns("u", "s"))
        assert len([m for m in built if m.granularity == "turn"]) == len(TURNS)
        for m in mem.memories("u"):
            m.text.encode("utf-8")  # stored text is valid Unicode
            json.dumps(m.metadata)
        r = mem.retrieve("u", "What is my dog called?", k=3)
        assert r.hits and all(h.memory.user_id == "u" for h in r.hits)
